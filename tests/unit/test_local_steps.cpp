#include <catch2/catch.hpp>
#include <cstring>
#include <gravac/local_steps.hpp>
#include <gravac/policy/local_steps_policy.hpp>

#include "gravac_test_util.hpp"

namespace local_steps_tests {
using namespace gravac;

// A rank's gradient at x: a quadratic pull towards the rank's own target, so that ranks
// drift apart during local steps.
void gradient(std::span<const float> x, int rank, std::uint64_t step, std::vector<float>& g) {
  const auto target = test::make_data(x.size(), 100 + static_cast<std::uint64_t>(rank));
  const auto noise = test::make_data(x.size(), 7000 + 31 * step + static_cast<std::uint64_t>(rank));
  g.resize(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) g[i] = (x[i] - target[i]) + 0.1f * noise[i];
}

void sgd(std::span<float> x, std::span<const float> g, float lr) {
  for (std::size_t i = 0; i < x.size(); ++i) x[i] -= lr * g[i];
}

// Runs `steps` inner steps of local-step training on `ranks` thread ranks; returns every
// rank's parameters at the end (and, in `trace`, each rank's H per step).
template <class C, class K, class P>
std::vector<std::vector<float>> run_local(const layout& lay, typename local_steps<C, K, P>::options opt, int nranks,
                                          int steps, std::vector<std::vector<std::size_t>>* trace = nullptr) {
  std::vector<std::vector<float>> out(static_cast<std::size_t>(nranks));
  if (trace) trace->assign(static_cast<std::size_t>(nranks), {});
  run_ranks(nranks, [&](thread_communicator& comm) {
    std::vector<float> x = test::make_data(lay.numel(), 5), g;
    local_steps<C, K, P> ls(comm, lay, x, opt);
    for (int s = 0; s < steps; ++s) {
      if (trace) (*trace)[comm.rank()].push_back(ls.period());
      gradient(x, comm.rank(), static_cast<std::uint64_t>(s), g);
      ls.before_inner_step(g);
      sgd(x, g, 0.05f);
      ls.after_inner_step(x);
    }
    ls.complete_exchange();  // an overlapped exchange may be in flight
    out[comm.rank()] = x;
  });
  return out;
}

TEST_CASE("local_steps with H = 1 is the per-step trainer bit for bit", "[local_steps]") {
  const auto lay = test::mixed_layout();
  using LS = local_steps<topk, allgather, fixed_policy>;
  LS::options opt;
  opt.period = 1;
  opt.outer.kind = outer_kind::averaging;
  opt.exchange.policy.kept_fraction = 0.1;
  const auto local = run_local<topk, allgather, fixed_policy>(lay, opt, 3, 12);
  std::vector<std::vector<float>> per_step(3);
  run_ranks(3, [&](thread_communicator& comm) {
    std::vector<float> x = test::make_data(lay.numel(), 5), g;
    trainer<topk, allgather, fixed_policy> t(comm, lay, opt.exchange);
    for (int s = 0; s < 12; ++s) {
      gradient(x, comm.rank(), static_cast<std::uint64_t>(s), g);
      t.step(g);
      sgd(x, g, 0.05f);
    }
    per_step[comm.rank()] = x;
  });
  for (int r = 0; r < 3; ++r) {
    CHECK(local[r] == per_step[r]);
    CHECK(local[r] == local[0]);
  }
}

TEST_CASE("local_steps with plain averaging averages the ranks' parameters every H steps", "[local_steps]") {
  const auto lay = test::mixed_layout();
  using LS = local_steps<identity, dense_allreduce, fixed_policy>;
  LS::options opt;
  opt.period = 4;
  opt.outer.kind = outer_kind::averaging;
  opt.exchange.policy.kept_fraction = 1.0;
  const int ranks = 3, steps = 10;  // two exchanges, then two local steps
  const auto got = run_local<identity, dense_allreduce, fixed_policy>(lay, opt, ranks, steps);
  // The reference, serially: each rank from the common start, average at steps 4 and 8.
  std::vector<std::vector<float>> x(ranks, test::make_data(lay.numel(), 5));
  std::vector<float> g;
  for (int s = 0; s < steps; ++s) {
    for (int r = 0; r < ranks; ++r) {
      gradient(x[r], r, static_cast<std::uint64_t>(s), g);
      sgd(x[r], g, 0.05f);
    }
    if ((s + 1) % 4 == 0) {
      std::vector<float> mean(lay.numel(), 0.0f);
      for (int r = 0; r < ranks; ++r)
        for (std::size_t i = 0; i < mean.size(); ++i) mean[i] += x[r][i] / ranks;
      for (auto& xr : x) xr = mean;
    }
  }
  for (int r = 0; r < ranks; ++r) {
    INFO("rank " << r);
    CHECK(test::max_rel_diff(got[r], x[r]) < 1e-5);
  }
  // Between exchanges the ranks differ (their own data), after the last one they agreed.
  CHECK(got[0] != got[1]);
}

TEST_CASE("the Nesterov outer step is DiLoCo's", "[local_steps]") {
  const auto lay = test::mixed_layout();
  using LS = local_steps<identity, dense_allreduce, fixed_policy>;
  LS::options opt;
  opt.period = 3;
  opt.outer = {outer_kind::nesterov, 0.7, 0.9};
  opt.exchange.policy.kept_fraction = 1.0;
  const auto got = run_local<identity, dense_allreduce, fixed_policy>(lay, opt, 1, 9);
  // One rank: the average is the rank's own pseudo-gradient.
  std::vector<float> x0 = test::make_data(lay.numel(), 5), x = x0, m(x0.size(), 0.0f), g;
  for (int s = 0; s < 9; ++s) {
    gradient(x, 0, static_cast<std::uint64_t>(s), g);
    sgd(x, g, 0.05f);
    if ((s + 1) % 3 == 0) {
      for (std::size_t i = 0; i < x.size(); ++i) {
        const float d = x0[i] - x[i];
        m[i] = 0.9f * m[i] + d;
        x0[i] -= 0.7f * (d + 0.9f * m[i]);
      }
      x = x0;
    }
  }
  CHECK(got[0] == x);
}

TEST_CASE("local_steps resumes mid-round bit for bit", "[local_steps][checkpoint]") {
  const auto lay = test::mixed_layout();
  for (bool overlap : {false, true}) {
    INFO("overlap " << overlap);
    using LS = local_steps<topk, allgather, fixed_policy>;
    LS::options opt;
    opt.period = 4;
    opt.overlap = overlap;
    opt.exchange.policy.kept_fraction = 0.05;
    const int ranks = 2, steps = 15, cut = 6;
    std::vector<std::vector<float>> whole(ranks), resumed(ranks), saved_x(ranks);
    std::vector<std::vector<std::byte>> state(ranks);
    std::vector<std::vector<float>> whole_global(ranks), resumed_global(ranks);
    std::vector<std::size_t> round_after_load(ranks, 99);
    run_ranks(ranks, [&](thread_communicator& comm) {
      const int r = comm.rank();
      std::vector<float> x = test::make_data(lay.numel(), 5), g;
      LS ls(comm, lay, x, opt);
      for (int s = 0; s < steps; ++s) {
        if (s == cut) {
          ls.save(state[r]);
          saved_x[r] = x;
        }
        gradient(x, r, static_cast<std::uint64_t>(s), g);
        ls.before_inner_step(g);
        sgd(x, g, 0.05f);
        ls.after_inner_step(x);
      }
      ls.complete_exchange();
      whole[r] = x;
      whole_global[r].assign(ls.global_params().begin(), ls.global_params().end());
    });
    run_ranks(ranks, [&](thread_communicator& comm) {
      const int r = comm.rank();
      std::vector<float> x = test::make_data(lay.numel(), 99), g;  // another start: load replaces it
      LS ls(comm, lay, x, opt);
      ls.load(state[r]);
      x = saved_x[r];
      round_after_load[r] = ls.round_step();  // checked outside the rank threads (Catch is not thread-safe)
      for (int s = cut; s < steps; ++s) {
        gradient(x, r, static_cast<std::uint64_t>(s), g);
        ls.before_inner_step(g);
        sgd(x, g, 0.05f);
        ls.after_inner_step(x);
      }
      ls.complete_exchange();
      resumed[r] = x;
      resumed_global[r].assign(ls.global_params().begin(), ls.global_params().end());
    });
    CHECK(round_after_load == std::vector<std::size_t>(ranks, static_cast<std::size_t>(cut % 4)));
    for (int r = 0; r < ranks; ++r) {
      CHECK(resumed[r] == whole[r]);
      CHECK(resumed_global[r] == whole_global[r]);
    }
  }
}

TEST_CASE("overlap applies each exchange one round late, keeping the rank's own progress", "[local_steps]") {
  const auto lay = test::mixed_layout();
  using LS = local_steps<identity, dense_allreduce, fixed_policy>;
  LS::options opt;
  opt.period = 3;
  opt.overlap = true;
  opt.outer.kind = outer_kind::averaging;
  opt.exchange.policy.kept_fraction = 1.0;
  const int ranks = 2, steps = 9;
  const auto got = run_local<identity, dense_allreduce, fixed_policy>(lay, opt, ranks, steps);
  // Reference: x0 moves by the average of round k's progress at the end of round k+1; each
  // rank then continues from x0 minus its own progress of round k+1.
  std::vector<float> x0 = test::make_data(lay.numel(), 5), g;
  std::vector<std::vector<float>> x(ranks, x0), start(ranks, x0), pending;
  for (int s = 0; s < steps; ++s) {
    for (int r = 0; r < ranks; ++r) {
      gradient(x[r], r, static_cast<std::uint64_t>(s), g);
      sgd(x[r], g, 0.05f);
    }
    if ((s + 1) % 3 != 0) continue;
    if (!pending.empty())
      for (std::size_t i = 0; i < x0.size(); ++i) {
        float mean = 0;
        for (int r = 0; r < ranks; ++r) mean += pending[r][i] / ranks;
        x0[i] -= mean;
      }
    pending.assign(ranks, std::vector<float>(x0.size()));
    for (int r = 0; r < ranks; ++r)
      for (std::size_t i = 0; i < x0.size(); ++i) {
        pending[r][i] = start[r][i] - x[r][i];
        x[r][i] = x0[i] - pending[r][i];
      }
    start = x;
  }
  for (int r = 0; r < ranks; ++r) CHECK(test::max_rel_diff(got[r], x[r]) < 1e-5);
}

TEST_CASE("finish_round ends a round early: every rank at the average of their points, with or without overlap",
          "[local_steps]") {
  const bool overlap = GENERATE(false, true);
  INFO("overlap " << overlap);
  const auto lay = test::mixed_layout();
  using LS = local_steps<identity, dense_allreduce, fixed_policy>;
  LS::options opt;
  opt.period = 3;
  opt.overlap = overlap;
  opt.outer.kind = outer_kind::averaging;
  opt.exchange.policy.kept_fraction = 1.0;
  const int ranks = 3, steps = 7;  // two rounds, then one step into the third
  std::vector<std::vector<float>> before(ranks), after(ranks), again(ranks);
  std::vector<int> reported(ranks, 0), reported_again(ranks, 0);
  run_ranks(ranks, [&](thread_communicator& comm) {
    std::vector<float> x = test::make_data(lay.numel(), 5), g;
    LS ls(comm, lay, x, opt);
    for (int s = 0; s < steps; ++s) {
      gradient(x, comm.rank(), static_cast<std::uint64_t>(s), g);
      ls.before_inner_step(g);
      sgd(x, g, 0.05f);
      ls.after_inner_step(x);
    }
    const auto r = static_cast<std::size_t>(comm.rank());
    before[r] = x;
    reported[r] = ls.finish_round(x) != nullptr;
    after[r] = x;
    CHECK(ls.round_step() == 0);
    CHECK_FALSE(ls.exchange_in_flight());
    CHECK(std::equal(x.begin(), x.end(), ls.global_params().begin()));
    reported_again[r] = ls.finish_round(x) != nullptr;  // nothing left to agree on
    again[r] = x;
  });
  std::vector<float> mean(lay.numel(), 0.0f);
  for (int r = 0; r < ranks; ++r)
    for (std::size_t i = 0; i < mean.size(); ++i) mean[i] += before[r][i] / ranks;
  for (int r = 0; r < ranks; ++r) {
    CHECK(after[r] == after[0]);
    CHECK(test::max_rel_diff(after[r], mean) < 1e-5);
    CHECK(reported[r] == 1);
    CHECK(reported_again[r] == 0);
    CHECK(again[r] == after[r]);
  }
  CHECK(before[0] != before[1]);  // the ranks had drifted apart
}

TEST_CASE("an adaptive run that switches H > 1 -> 1 -> > 1 keeps every rank bit-identical, with or without overlap",
          "[local_steps][policy]") {
  const bool overlap = GENERATE(false, true);
  INFO("overlap " << overlap);
  const auto lay = test::mixed_layout();
  using LS = local_steps<topk, allgather, local_steps_policy>;
  LS::options opt;
  opt.overlap = overlap;
  opt.outer = {outer_kind::nesterov, 0.7, 0.9};
  auto& p = opt.exchange.policy;
  p.source = network_source::profile;
  p.time.source = time_source::simulated;
  p.time.compute_s = 1e-3;
  p.max_period = 8;
  // Fast, slow, fast, slow: per-step rounds, local rounds, per-step again, local again.
  const auto fast = network_params::from_gbps(10e-6, 100), slow = network_params::from_gbps(0.05, 0.1);
  p.profile = std::make_shared<const network_profile>(
      network_profile::schedule({{12.0, fast}, {28.0, slow}, {24.0, fast}, {1e6, slow}}, profile_index::step, false));
  const int ranks = 3, steps = 100;
  // Per rank and inner step: H, the parameters and x0 after the step; the end's parameters.
  std::vector<std::vector<std::size_t>> period(ranks);
  std::vector<std::vector<std::vector<float>>> xs(ranks), globals(ranks);
  std::vector<std::vector<float>> final_x(ranks);
  std::vector<int> agreements(ranks, 0);
  std::vector<std::vector<int>> flagged(ranks);
  run_ranks(ranks, [&](thread_communicator& comm) {
    const auto r = static_cast<std::size_t>(comm.rank());
    std::vector<float> x = test::make_data(lay.numel(), 5), v(x.size(), 0.0f), g;
    LS ls(comm, lay, x, opt);
    for (int s = 0; s < steps; ++s) {
      period[r].push_back(ls.period());
      gradient(x, comm.rank(), static_cast<std::uint64_t>(s), g);
      ls.before_inner_step(g);
      for (std::size_t i = 0; i < x.size(); ++i) {  // heavy-ball SGD: its momentum is this rank's own
        v[i] = 0.9f * v[i] + g[i];
        x[i] -= 0.05f * v[i];
      }
      ls.after_inner_step(x);
      flagged[r].push_back(ls.inner_state_must_agree() ? 1 : 0);
      if (ls.inner_state_must_agree()) {
        ls.average_inner_state(v);
        ++agreements[r];
      }
      xs[r].push_back(x);
      globals[r].emplace_back(ls.global_params().begin(), ls.global_params().end());
    }
    ls.finish_round(x);
    final_x[r] = x;
  });
  // The run switched both ways: local rounds, per-step rounds after them, local rounds again.
  const auto& h = period[0];
  const auto first_local = std::find_if(h.begin(), h.end(), [](std::size_t k) { return k > 1; });
  const auto per_step_again = std::find(first_local, h.end(), std::size_t{1});
  REQUIRE(per_step_again != h.end());
  REQUIRE(std::find_if(per_step_again, h.end(), [](std::size_t k) { return k > 1; }) != h.end());
  for (int r = 1; r < ranks; ++r) {
    INFO("rank " << r);
    CHECK(period[r] == period[0]);
    CHECK(agreements[r] == agreements[0]);
    CHECK(final_x[r] == final_x[0]);
    for (int s = 0; s < steps; ++s) {
      INFO("inner step " << s << ", H " << h[s]);
      CHECK(globals[r][s] == globals[0][s]);       // x0 is the same on every rank after every step
      if (h[s] == 1) CHECK(xs[r][s] == xs[0][s]);  // and so are the parameters in per-step rounds
    }
  }
  CHECK(agreements[0] >= 1);
  // The flag is raised exactly where a round of local steps hands over to per-step rounds.
  for (int s = 0; s + 1 < steps; ++s) {
    INFO("inner step " << s);
    CHECK(flagged[0][s] == (h[s] > 1 && h[s + 1] == 1 ? 1 : 0));
  }
}

TEST_CASE("local_steps destroyed with an exchange in flight abandons it cleanly", "[local_steps]") {
  const auto lay = test::mixed_layout();
  using LS = local_steps<topk, allgather, fixed_policy>;
  LS::options opt;
  opt.period = 2;
  opt.overlap = true;
  opt.exchange.policy.kept_fraction = 0.1;
  std::vector<int> in_flight(2, 0);
  run_ranks(2, [&](thread_communicator& comm) {
    std::vector<float> x = test::make_data(lay.numel(), 5), g;
    LS ls(comm, lay, x, opt);
    for (int s = 0; s < 4; ++s) {
      gradient(x, comm.rank(), static_cast<std::uint64_t>(s), g);
      ls.before_inner_step(g);
      sgd(x, g, 0.05f);
      ls.after_inner_step(x);
    }
    in_flight[comm.rank()] = ls.exchange_in_flight() ? 1 : 0;
    // ls goes out of scope here: the exchange is abandoned before its buffers are freed
    // (ASan and TSan check that nothing reads them afterwards).
  });
  CHECK(in_flight == std::vector<int>{1, 1});
}

TEST_CASE("local_steps rejects bad options and calls out of order, and a bad state changes nothing",
          "[local_steps][errors]") {
  const auto lay = test::mixed_layout();
  using LS = local_steps<topk, allgather, fixed_policy>;
  run_ranks(1, [&](thread_communicator& comm) {
    std::vector<float> x(lay.numel(), 1.0f), g(lay.numel(), 0.5f);
    const auto refuses = [&](auto edit) {
      LS::options o;
      edit(o);
      CHECK_THROWS_AS(LS(comm, lay, x, o), gravac::error);
    };
    refuses([](LS::options& o) { o.period = 0; });
    refuses([](LS::options& o) { o.outer.lr = 0; });
    refuses([](LS::options& o) { o.outer.lr = std::nan(""); });
    refuses([](LS::options& o) { o.outer.momentum = 1.0; });
    refuses([](LS::options& o) { o.outer.momentum = -0.1; });
    std::vector<float> short_x(lay.numel() - 1);
    CHECK_THROWS_AS(LS(comm, lay, short_x, {}), gravac::error);

    LS::options o;
    o.period = 2;
    LS ls(comm, lay, x, o);
    CHECK_THROWS_AS(ls.after_inner_step(x), gravac::error);  // before_inner_step first
    CHECK_THROWS_AS(ls.before_inner_step(short_x), gravac::error);
    ls.before_inner_step(g);
    CHECK_THROWS_AS(ls.before_inner_step(g), gravac::error);
    CHECK_THROWS_AS(ls.after_inner_step(short_x), gravac::error);
    ls.after_inner_step(x);
    std::vector<std::byte> st;
    ls.save(st);
    const std::vector<float> global(ls.global_params().begin(), ls.global_params().end());
    for (std::size_t cut : {std::size_t{0}, std::size_t{8}, st.size() / 2, st.size() - 1}) {
      CHECK_THROWS_AS(ls.load(std::span<const std::byte>(st.data(), cut)), gravac::error);
    }
    auto flipped = st;
    flipped[4] ^= std::byte{1};  // the version
    CHECK_THROWS_AS(ls.load(flipped), gravac::error);
    LS::options other = o;
    other.period = 3;
    LS ls3(comm, lay, x, other);
    CHECK_THROWS_AS(ls3.load(st), gravac::error);  // another configuration
    CHECK(std::equal(global.begin(), global.end(), ls.global_params().begin()));
    CHECK(ls.round_step() == 1);
    ls.load(st);
    CHECK(ls.round_step() == 1);
  });
}

}  // namespace local_steps_tests
