// make_local_steps: local-step training chosen by name equals local_steps<C, K, P> bit for
// bit, resumes mid-round exactly, chooses H with local.adaptive, and refuses what the
// library does not accept with a reason.
#include <catch2/catch.hpp>
#include <gravac/comm/thread_communicator.hpp>
#include <gravac/local_steps.hpp>
#include <gravac/runtime/make_local_steps.hpp>
#include <gravac/runtime/option_table.hpp>

#include "gravac_test_util.hpp"

using namespace gravac;
namespace rt = gravac::runtime;

namespace {

// A rank's gradient at x: a pull towards the rank's own target, so ranks drift apart.
void pull(std::span<const float> x, int rank, std::uint64_t step, std::vector<float>& g) {
  const auto target = test::make_data(x.size(), 300 + static_cast<std::uint64_t>(rank));
  const auto noise = test::make_data(x.size(), 9000 + 17 * step + static_cast<std::uint64_t>(rank));
  g.resize(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) g[i] = (x[i] - target[i]) + 0.1f * noise[i];
}

void sgd(std::span<float> x, std::span<const float> g) {
  for (std::size_t i = 0; i < x.size(); ++i) x[i] -= 0.05f * g[i];
}

// One inner step of the loop every front end writes: backward, before, optimizer, after.
template <class L>
void inner_step(L& ls, std::vector<float>& x, std::vector<float>& g, int rank, std::uint64_t step) {
  pull(x, rank, step, g);
  ls.before_inner_step(g);
  sgd(x, g);
  ls.after_inner_step(x);
}

rt::method_config sparseloco_method(std::size_t period) {
  rt::method_config m;
  m.compressor = rt::compressor_id::sparseloco;
  m.collective = rt::collective_id::allgather;
  m.policy = rt::policy_id::fixed;
  rt::set_option(m, "kept_fraction", "0.05");
  rt::set_option(m, "sparseloco_chunk", "64");
  rt::set_option(m, "local_period", std::to_string(period));
  rt::set_option(m, "outer", "nesterov");
  return m;
}

}  // namespace

TEST_CASE("runtime: make_local_steps equals local_steps<sparseloco, allgather, fixed_policy> bit for bit",
          "[runtime][local_steps]") {
  const auto lay = test::mixed_layout();
  const auto m = sparseloco_method(3);
  using LS = local_steps<sparseloco, allgather, fixed_policy>;
  LS::options opt;
  opt.period = 3;
  opt.outer = {outer_kind::nesterov, 0.7, 0.9};
  opt.exchange.policy.kept_fraction = 0.05;
  opt.exchange.compressor.chunk = 64;
  const int ranks = 3, steps = 11;  // three exchanges and two steps into a round
  std::vector<std::vector<float>> typed(ranks), erased(ranks), erased_global(ranks);
  run_ranks(ranks, [&](thread_communicator& comm) {
    std::vector<float> x = test::make_data(lay.numel(), 5), g;
    LS ls(comm, lay, x, opt);
    for (int s = 0; s < steps; ++s) inner_step(ls, x, g, comm.rank(), static_cast<std::uint64_t>(s));
    typed[comm.rank()] = x;
  });
  run_ranks(ranks, [&](thread_communicator& comm) {
    std::vector<float> x = test::make_data(lay.numel(), 5), g;
    auto ls = rt::make_local_steps(m, rt::host_comm(comm), lay, x);
    for (int s = 0; s < steps; ++s) inner_step(*ls, x, g, comm.rank(), static_cast<std::uint64_t>(s));
    CHECK(ls->period() == 3);
    CHECK(ls->round_step() == 2);
    CHECK(ls->inner_steps() == 11);
    CHECK(ls->exchanges() == 3);
    erased[comm.rank()] = x;
    erased_global[comm.rank()] = std::vector<float>(ls->global_params().begin(), ls->global_params().end());
  });
  for (int r = 0; r < ranks; ++r) {
    CHECK(erased[r] == typed[r]);
    CHECK(erased_global[r] == erased_global[0]);
  }
  CHECK(erased[0] != erased[1]);  // two steps into a round: the ranks have drifted apart
}

TEST_CASE("runtime: local steps with H = 1 and averaging are make_trainer's per-step trainer bit for bit",
          "[runtime][local_steps]") {
  const auto lay = test::mixed_layout();
  auto m = sparseloco_method(1);
  m.compressor = rt::compressor_id::topk;
  rt::set_option(m, "outer", "averaging");
  const int ranks = 3, steps = 8;
  std::vector<std::vector<float>> local(ranks), per_step(ranks);
  run_ranks(ranks, [&](thread_communicator& comm) {
    std::vector<float> x = test::make_data(lay.numel(), 5), g;
    auto ls = rt::make_local_steps(m, rt::host_comm(comm), lay, x);
    for (int s = 0; s < steps; ++s) inner_step(*ls, x, g, comm.rank(), static_cast<std::uint64_t>(s));
    local[comm.rank()] = x;
  });
  run_ranks(ranks, [&](thread_communicator& comm) {
    std::vector<float> x = test::make_data(lay.numel(), 5), g;
    auto t = rt::make_trainer(m, rt::host_comm(comm), lay);
    for (int s = 0; s < steps; ++s) {
      pull(x, comm.rank(), static_cast<std::uint64_t>(s), g);
      t->step(g);
      sgd(x, g);
    }
    per_step[comm.rank()] = x;
  });
  for (int r = 0; r < ranks; ++r) CHECK(local[r] == per_step[r]);
}

TEST_CASE("runtime: local steps saved mid-round resume bit for bit, and refuse another method's state",
          "[runtime][local_steps]") {
  const auto lay = test::mixed_layout();
  const auto m = sparseloco_method(4);
  const int ranks = 2, steps = 13, stop = 6;  // stop two steps into the second round
  std::vector<std::vector<float>> whole(ranks), resumed(ranks);
  run_ranks(ranks, [&](thread_communicator& comm) {
    std::vector<float> x = test::make_data(lay.numel(), 5), g;
    auto ls = rt::make_local_steps(m, rt::host_comm(comm), lay, x);
    for (int s = 0; s < steps; ++s) inner_step(*ls, x, g, comm.rank(), static_cast<std::uint64_t>(s));
    whole[comm.rank()] = x;
  });
  run_ranks(ranks, [&](thread_communicator& comm) {
    std::vector<float> x = test::make_data(lay.numel(), 5), g, x_saved;
    std::vector<std::byte> state;
    {
      auto ls = rt::make_local_steps(m, rt::host_comm(comm), lay, x);
      for (int s = 0; s < stop; ++s) inner_step(*ls, x, g, comm.rank(), static_cast<std::uint64_t>(s));
      state = ls->save_state();
      x_saved = x;
    }
    // A fresh process: built from the initial point, then restored.
    x = test::make_data(lay.numel(), 5);
    auto ls = rt::make_local_steps(m, rt::host_comm(comm), lay, x);
    auto other = m;
    rt::set_option(other, "local_period", "5");
    auto wrong = rt::make_local_steps(other, rt::host_comm(comm), lay, x);
    CHECK_THROWS_AS(wrong->load_state(state), gravac::error);
    ls->load_state(state);
    x = x_saved;
    CHECK(ls->round_step() == 2);
    for (int s = stop; s < steps; ++s) inner_step(*ls, x, g, comm.rank(), static_cast<std::uint64_t>(s));
    resumed[comm.rank()] = x;
  });
  for (int r = 0; r < ranks; ++r) CHECK(resumed[r] == whole[r]);
}

TEST_CASE("runtime: adaptive local steps choose H from the network, the same on every rank", "[runtime][local_steps]") {
  const auto lay = test::mixed_layout();
  auto m = sparseloco_method(1);
  rt::set_option(m, "local_adaptive", "true");
  rt::set_option(m, "local_max_period", "8");
  rt::set_option(m, "local_time", "simulated");
  rt::set_option(m, "local_compute_s", "0.0001");
  rt::set_option(m, "network_source", "fixed");
  m.local.policy.network = {0.05, 1e-6};  // 50 ms and 1 MB/s: communication dwarfs 0.1 ms of compute
  const int ranks = 3;
  std::vector<std::vector<std::size_t>> periods(ranks);
  std::vector<std::string> states(ranks);
  run_ranks(ranks, [&](thread_communicator& comm) {
    std::vector<float> x = test::make_data(lay.numel(), 5), g;
    auto ls = rt::make_local_steps(m, rt::host_comm(comm), lay, x);
    for (int s = 0; s < 24; ++s) {
      periods[comm.rank()].push_back(ls->period());
      inner_step(*ls, x, g, comm.rank(), static_cast<std::uint64_t>(s));
    }
    states[comm.rank()] = ls->policy_state();
  });
  CHECK(periods[0].front() == 1);  // per-step until the first exchange is priced
  CHECK(periods[0].back() == 8);   // then the staleness bound on this slow network
  for (int r = 1; r < ranks; ++r) CHECK(periods[r] == periods[0]);
  CHECK_THAT(states[0], Catch::StartsWith("H 8"));
}

TEST_CASE("runtime: make_local_steps refuses a policy other than fixed and an exchange the library refuses",
          "[runtime][local_steps]") {
  const auto lay = test::mixed_layout();
  const std::vector<float> x(lay.numel(), 0.0f);
  run_ranks(1, [&](thread_communicator& comm) {
    auto m = sparseloco_method(2);
    m.policy = rt::policy_id::gravac;
    CHECK_THROWS_WITH(rt::make_local_steps(m, rt::host_comm(comm), lay, x),
                      Catch::Contains("take the fixed policy, not gravac"));
    m = sparseloco_method(2);
    m.collective = rt::collective_id::allreduce_compatible;
    CHECK(rt::local_verdict(m) == rejection::not_summable);
    CHECK_THROWS_WITH(rt::make_local_steps(m, rt::host_comm(comm), lay, x),
                      Catch::Contains("values cannot be summed") && Catch::Contains("allgather"));
    m = sparseloco_method(2);
    rt::set_option(m, "local_adaptive", "true");
    m.compressor = rt::compressor_id::identity;  // adaptive DiLoCo: H chosen, every exchange dense
    CHECK(rt::local_verdict(m) == rejection::none);
    m.compressor = rt::compressor_id::powersgd;  // over allgather, under the adaptive policy too
    CHECK(rt::local_verdict(m) == rejection::low_rank_needs_allreduces);
    CHECK_THROWS_WITH(rt::make_local_steps(m, rt::host_comm(comm), lay, x),
                      Catch::Contains("adaptive local steps") && Catch::Contains("low_rank_allreduce"));
    m = sparseloco_method(2);
    CHECK_THROWS_WITH(rt::make_local_steps(m, rt::host_comm(comm), lay, std::span(x).first(3)),
                      Catch::Contains("parameters"));
  });
}
