// AR-Topk (allreduce_compatible) on 4 thread ranks: same gradient everywhere, equal to
// a serial reference; the error-feedback invariant on every rank; STAR rotates the index
// rank; VAR picks the rank with the largest smoothed norm (ties to the lowest).
#include <catch2/catch.hpp>
#include <cstring>

#include "gravac/collective/allreduce_compatible.hpp"
#include "gravac_test_util.hpp"
#include "topk_reference.hpp"

using namespace gravac;

namespace {

// Serial AR-Topk: indices are the exact per-layer top-k of rank `root`'s u; values are
// summed in rank order (as the thread engine does) and multiplied by 1/N.
std::vector<float> ar_topk_reference(const layout& lay, const step_params& p, const std::vector<std::vector<float>>& g,
                                     std::vector<std::vector<float>>& e, int root) {
  const std::size_t n = g.size();
  std::vector<std::vector<float>> u(n, std::vector<float>(lay.numel()));
  for (std::size_t r = 0; r < n; ++r)
    for (std::size_t j = 0; j < lay.numel(); ++j) u[r][j] = g[r][j] + e[r][j];
  std::vector<float> out(lay.numel(), 0.0f);
  const float inv = 1.0f / static_cast<float>(n);
  std::vector<std::uint64_t> order, sel;
  for (std::size_t i = 0; i < lay.size(); ++i) {
    const auto& l = lay[i];
    sel.clear();
    if (p.kept_fraction[i] >= 1) {
      for (std::size_t j = 0; j < l.numel; ++j) sel.push_back(j);
    } else {
      std::span<const float> ur(u[static_cast<std::size_t>(root)].data() + l.offset, l.numel);
      test::select_topk_reference(ur, kept_count(l.numel, p.kept_fraction[i]), order, sel);
    }
    for (auto ix : sel) {
      const std::size_t j = l.offset + ix;
      float s = u[0][j];
      for (std::size_t r = 1; r < n; ++r) s += u[r][j];
      out[j] = s * inv;
      for (std::size_t r = 0; r < n; ++r) u[r][j] = 0.0f;  // what is left after sending
    }
  }
  e = u;
  return out;
}

using ar_trainer = trainer<topk, allreduce_compatible, fixed_policy>;

ar_trainer::options ar_options(double f, index_rank_rule rule, double smoothing = 0.1) {
  ar_trainer::options opt;
  opt.policy.kept_fraction = f;
  opt.policy.one_dim_dense = true;  // mixes dense layers into the Allreduce
  opt.collective.rule = rule;
  opt.collective.norm_smoothing = smoothing;
  return opt;
}

}  // namespace

TEST_CASE("AR-Topk STAR on 4 thread ranks equals the serial reference, bit for bit", "[ar_topk]") {
  constexpr int n = 4;
  const auto lay = test::mixed_layout();
  for (double f : {0.01, 0.1, 0.5}) {
    std::vector<std::vector<float>> res(n);
    std::vector<std::vector<int>> roots(n);
    constexpr int steps = 6;
    std::vector<std::vector<std::vector<float>>> results(steps, std::vector<std::vector<float>>(n));
    // Per rank: steps reported as AR-Topk, residual mismatches, steps whose sent count matches.
    std::vector<int> kind_ok(n, 0), residual_bad(n, 0), count_ok(n, 0);
    run_ranks(n, [&](thread_communicator& comm) {  // no Catch assertions inside threads
      ar_trainer t(comm, lay, ar_options(f, index_rank_rule::star));
      const auto r = static_cast<std::size_t>(comm.rank());
      for (int s = 0; s < steps; ++s) {
        const auto dist = s % 2 ? test::distribution::laplace : test::distribution::gaussian;
        auto g = test::make_data(lay.numel(), 1000 * s + r + 1, dist);
        const std::vector<float> e_old(t.residual().begin(), t.residual().end());
        const auto& rep = t.step(g);
        kind_ok[r] += rep.collective == collective_kind::allreduce_compatible;
        roots[r].push_back(t.collective().last_root());
        results[static_cast<std::size_t>(s)][r] = g;
        // Error feedback, exactly: e_new is u where nothing was sent and 0 where u was sent.
        auto u = test::make_data(lay.numel(), 1000 * s + r + 1, dist);
        std::size_t sent = 0;
        for (std::size_t j = 0; j < u.size(); ++j) {
          u[j] += e_old[j];
          const float e_new = t.residual()[j];
          if (e_new == 0.0f && u[j] != 0.0f)
            ++sent;
          else if (e_new != u[j])
            ++residual_bad[r];
        }
        count_ok[r] += sent == t.collective().last_value_count();
      }
      res[r].assign(t.residual().begin(), t.residual().end());
    });
    for (int r = 0; r < n; ++r) {
      CHECK(kind_ok[r] == steps);
      CHECK(residual_bad[r] == 0);
      CHECK(count_ok[r] == steps);
    }
    // Serial replay.
    std::vector<std::vector<float>> e(n, std::vector<float>(lay.numel(), 0.0f));
    fixed_policy pol(lay, ar_options(f, index_rank_rule::star).policy);
    for (int s = 0; s < steps; ++s) {
      step_params p = test::params_for(lay, f, static_cast<std::uint64_t>(s));
      pol.plan(p);
      std::vector<std::vector<float>> g(n);
      for (int r = 0; r < n; ++r)
        g[static_cast<std::size_t>(r)] = test::make_data(
            lay.numel(), 1000 * s + r + 1, s % 2 ? test::distribution::laplace : test::distribution::gaussian);
      const auto ref = ar_topk_reference(lay, p, g, e, s % n);
      for (int r = 0; r < n; ++r) {
        INFO("f " << f << " step " << s << " rank " << r);
        CHECK(roots[static_cast<std::size_t>(r)][static_cast<std::size_t>(s)] == s % n);  // STAR rotates
        CHECK(results[static_cast<std::size_t>(s)][static_cast<std::size_t>(r)] == ref);  // same bits everywhere
      }
    }
    for (int r = 0; r < n; ++r) CHECK(res[static_cast<std::size_t>(r)] == e[static_cast<std::size_t>(r)]);
  }
}

TEST_CASE(
    "AR-Topk VAR picks the rank with the largest smoothed gradient norm after the previous step, ties to "
    "the lowest",
    "[ar_topk]") {
  // The norms ride in the step's value Allreduce (no collective of their own), so step s
  // uses the norms known after step s - 1; step 0 has none and uses rank 0.
  constexpr int n = 4;
  layout lay;
  lay.add("w", {8, 8}, layer_kind::dense);
  const double w = 0.5;
  // Norm scale of each rank at each step: rank 1 starts loud and fades, rank 3 is steady,
  // the last steps are equal everywhere (a tie after the EWMAs converge is not exact, so the
  // tie case is separate below).
  const std::vector<std::vector<float>> scale = {{1, 10, 1, 5}, {1, 1, 1, 5}, {1, 1, 1, 5}, {1, 1, 1, 5}, {1, 1, 9, 5}};
  std::vector<int> expected;
  {
    std::vector<double> ewma(n, 0.0);
    for (std::size_t s = 0; s < scale.size(); ++s) {
      for (int r = 0; r < n; ++r) {
        auto g = test::make_data(64, 7);
        double sq = 0;
        for (float x : g) sq += double(x * scale[s][r]) * (x * scale[s][r]);
        ewma[r] = s == 0 ? std::sqrt(sq) : (1 - w) * ewma[r] + w * std::sqrt(sq);
      }
      expected.push_back(static_cast<int>(std::max_element(ewma.begin(), ewma.end()) - ewma.begin()));
    }
    expected.insert(expected.begin(), 0);  // step 0: no norms yet
    expected.pop_back();                   // the last step's norms choose the step after the run
  }
  REQUIRE(expected[1] == 1);
  REQUIRE(std::find(expected.begin(), expected.end(), 3) != expected.end());  // the fade is seen
  std::vector<std::vector<int>> roots(n);
  run_ranks(n, [&](thread_communicator& comm) {
    ar_trainer t(comm, lay, ar_options(0.1, index_rank_rule::var, w));
    for (std::size_t s = 0; s < scale.size(); ++s) {
      auto g = test::make_data(64, 7);
      for (auto& x : g) x *= scale[s][static_cast<std::size_t>(comm.rank())];
      t.step(g);
      roots[static_cast<std::size_t>(comm.rank())].push_back(t.collective().last_root());
    }
  });
  for (int r = 0; r < n; ++r) CHECK(roots[static_cast<std::size_t>(r)] == expected);

  // Equal norms on every rank: the lowest rank chooses.
  std::vector<int> tie_root(n, -1);
  run_ranks(n, [&](thread_communicator& comm) {
    ar_trainer t(comm, lay, ar_options(0.1, index_rank_rule::var, w));
    for (int s = 0; s < 2; ++s) {
      auto g = test::make_data(64, 9);
      t.step(g);
    }
    tie_root[static_cast<std::size_t>(comm.rank())] = t.collective().last_root();
  });
  CHECK(tie_root == std::vector<int>(n, 0));
}

TEST_CASE("AR-Topk with random-k draws the indices on every rank and broadcasts nothing", "[ar_topk]") {
  constexpr int n = 4;
  const auto lay = test::mixed_layout();
  std::vector<std::vector<float>> ar(n), ag(n);
  std::vector<std::size_t> indices(n, 1);
  std::vector<int> same_res(n, 0);
  run_ranks(n, [&](thread_communicator& comm) {
    trainer<randomk, allreduce_compatible, fixed_policy>::options o1;
    o1.policy.kept_fraction = 0.05;
    o1.seed = 11;
    trainer<randomk, allgather, fixed_policy>::options o2;
    o2.policy.kept_fraction = 0.05;
    o2.seed = 11;
    trainer<randomk, allreduce_compatible, fixed_policy> t1(comm, lay, o1);
    trainer<randomk, allgather, fixed_policy> t2(comm, lay, o2);
    auto g = test::make_data(lay.numel(), 50 + comm.rank());
    auto h = g;
    t1.step(g);
    t2.step(h);
    indices[static_cast<std::size_t>(comm.rank())] = t1.collective().last_index_count();
    same_res[static_cast<std::size_t>(comm.rank())] =
        std::equal(t1.residual().begin(), t1.residual().end(), t2.residual().begin());
    ar[static_cast<std::size_t>(comm.rank())] = g;
    ag[static_cast<std::size_t>(comm.rank())] = h;
  });
  for (int r = 0; r < n; ++r) {
    CHECK(indices[static_cast<std::size_t>(r)] == 0);
    CHECK(same_res[static_cast<std::size_t>(r)]);
    CHECK(ar[static_cast<std::size_t>(r)] == ar[0]);
    CHECK(test::max_rel_diff(ar[static_cast<std::size_t>(r)], ag[static_cast<std::size_t>(r)]) < 1e-6);
  }
}

TEST_CASE("AR-Topk with threshold selection sends exactly k at the index rank, as the reference", "[ar_topk]") {
  constexpr int n = 4;
  const auto lay = test::mixed_layout();
  std::vector<std::vector<float>> out(n), res(n);
  run_ranks(n, [&](thread_communicator& comm) {
    trainer<threshold, allreduce_compatible, fixed_policy>::options o;
    o.policy.kept_fraction = 0.05;
    o.collective.rule = index_rank_rule::star;
    trainer<threshold, allreduce_compatible, fixed_policy> t(comm, lay, o);
    auto g = test::make_data(lay.numel(), 70 + comm.rank(), test::distribution::laplace);
    t.step(g);
    out[static_cast<std::size_t>(comm.rank())] = g;
    res[static_cast<std::size_t>(comm.rank())].assign(t.residual().begin(), t.residual().end());
  });
  std::vector<std::vector<float>> g(n), e(n, std::vector<float>(lay.numel(), 0.0f));
  for (int r = 0; r < n; ++r)
    g[static_cast<std::size_t>(r)] = test::make_data(lay.numel(), 70 + r, test::distribution::laplace);
  const auto ref = ar_topk_reference(lay, test::params_for(lay, 0.05), g, e, 0);  // STAR: step 0 -> rank 0
  for (int r = 0; r < n; ++r) {
    CHECK(out[static_cast<std::size_t>(r)] == ref);
    CHECK(res[static_cast<std::size_t>(r)] == e[static_cast<std::size_t>(r)]);
  }
}

namespace {
// MOCK (unit test only): a thread engine whose broadcast delivers a corrupted index list
// (an index past the end of the layer) to every rank but the root.
struct corrupting_communicator {
  using communicator_tag = void;
  using memory_space = host_space;
  using byte_buffer = std::vector<std::byte>;
  thread_communicator& inner;
  int rank() const { return inner.rank(); }
  int size() const { return inner.size(); }
  void allreduce_sum(std::span<float> d) { inner.allreduce_sum(d); }
  void allreduce_sum(std::span<double> d) { inner.allreduce_sum(d); }
  void allreduce_max(std::span<double> d) { inner.allreduce_max(d); }
  void allgatherv(std::span<const std::byte> in, byte_buffer& out, std::vector<std::size_t>& sz) {
    inner.allgatherv(in, out, sz);
  }
  void broadcast(std::span<std::byte> d, int root) {
    inner.broadcast(d, root);
    if (rank() != root && d.size() >= 4) std::memset(d.data(), 0xff, 4);
  }
  void barrier() { inner.barrier(); }
};
static_assert(Communicator<corrupting_communicator>);
}  // namespace

TEST_CASE("AR-Topk rejects bad options and a corrupted index broadcast", "[ar_topk]") {
  const auto lay = layout::flat(32);
  CHECK_THROWS_AS(allreduce_compatible(lay, {index_rank_rule::var, 0.0}), error);
  CHECK_THROWS_AS(allreduce_compatible(lay, {index_rank_rule::var, 1.5}), error);

  constexpr int n = 3;
  std::vector<int> code(n, -1), residual_is_u(n, 0);
  run_ranks(n, [&](thread_communicator& tc) {
    corrupting_communicator comm{tc};
    auto opt = ar_options(0.25, index_rank_rule::star);
    opt.policy.one_dim_dense = false;  // the flat layer is 1-D: compress it
    ar_trainer t(comm, lay, opt);
    auto g = test::make_data(32, 3 + tc.rank());
    const auto u = g;  // the residual starts at zero
    try {
      t.step(g);
    } catch (const error& e) {
      code[static_cast<std::size_t>(tc.rank())] = static_cast<int>(e.code());
      // Nothing was sent: the residual holds all of u, so no gradient is lost.
      residual_is_u[static_cast<std::size_t>(tc.rank())] = std::equal(u.begin(), u.end(), t.residual().begin());
      tc.abort("invalid indices");
    }
  });
  // Step 0: rank 0 chooses; ranks 1 and 2 reject its (corrupted) list.
  CHECK(code[1] == static_cast<int>(status::malformed_packet));
  CHECK(code[2] == static_cast<int>(status::malformed_packet));
  CHECK(residual_is_u[1]);
  CHECK(residual_is_u[2]);
  CHECK(code[0] == static_cast<int>(status::aborted));  // the root is told, never left hanging
}

TEST_CASE("AR-Topk reports the gain curve of u from the same pass", "[ar_topk]") {
  const auto lay = test::mixed_layout();
  const std::vector<double> cands{0.1, 0.01};
  std::vector<double> got, want(cands.size(), 0.0);
  std::vector<float> g0 = test::make_data(lay.numel(), 77, test::distribution::laplace);
  run_ranks(1, [&](thread_communicator& comm) {
    topk c(lay);
    allreduce_compatible k(lay);
    k.prepare(c);
    std::vector<float> g = g0, e(lay.numel(), 0.0f);
    step_buffers<host_space> buf{host_view(g), host_view(e), true};
    step_params p = test::params_for(lay, 0.05);
    p.gain_candidates = cands;
    compress_stats st;
    step_report r;
    k.aggregate(c, comm, buf, p, st, r);
    got = st.candidate_kept_sq;
  });
  std::vector<double> scratch;
  for (const auto& l : lay.layers())
    detail::add_reference_gain_curve(std::span<const float>(g0.data() + l.offset, l.numel), cands, want, scratch);
  REQUIRE(got.size() == want.size());
  for (std::size_t c = 0; c < cands.size(); ++c) CHECK(got[c] == Approx(want[c]).epsilon(0.02));
}
