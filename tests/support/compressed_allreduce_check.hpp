#pragma once
// trainer<C, compressed_allreduce, fixed_policy> on thread ranks against the serial
// two-stage reference (two_stage_reference.hpp), for the host quantizers' tests.
#include <catch2/catch.hpp>
#include <cstdint>
#include <vector>

#include "gravac/collective/compressed_allreduce.hpp"
#include "gravac/comm/thread_communicator.hpp"
#include "gravac/policy/fixed_policy.hpp"
#include "gravac/trainer.hpp"
#include "gravac_test_util.hpp"
#include "reliability_util.hpp"
#include "two_stage_reference.hpp"

namespace gravac::test {

// trainer<C, compressed_allreduce, fixed_policy> on n thread ranks against the serial
// two-stage reference: every rank's result, residual and server residual bit for bit.
// data(n, seed) makes a rank's gradient of a step.
template <class C>
void check_compressed_allreduce(int n, const typename C::options& copt,
                                std::vector<float> (*data)(std::size_t, std::uint64_t)) {
  using T = trainer<C, compressed_allreduce, fixed_policy>;
  const layout lay = mixed_layout();
  constexpr int steps = 3;
  typename T::options opt;
  opt.compressor = copt;
  const auto N = static_cast<std::size_t>(n);
  std::vector<std::vector<std::vector<float>>> results(steps, std::vector<std::vector<float>>(N));
  std::vector<std::vector<float>> res(N), srv(N);
  std::vector<int> kind_ok(N, 0);
  run_ranks(n, [&](thread_communicator& comm) {
    T t(comm, lay, opt);
    const auto r = static_cast<std::size_t>(comm.rank());
    for (int s = 0; s < steps; ++s) {
      auto g = data(lay.numel(), 100 * static_cast<std::uint64_t>(s) + r + 1);
      kind_ok[r] += t.step(g).collective == collective_kind::compressed_allreduce;
      results[static_cast<std::size_t>(s)][r] = g;
    }
    res[r].assign(t.residual().begin(), t.residual().end());
    const auto sr = t.collective().server_residual();
    srv[r].assign(sr.begin(), sr.end());
  });
  std::vector<std::vector<float>> e(N, std::vector<float>(lay.numel(), 0.0f)), server;
  fixed_policy pol(lay, opt.policy);
  for (int s = 0; s < steps; ++s) {
    step_params p = params_for(lay, 0.01, static_cast<std::uint64_t>(s), opt.seed);
    pol.plan(p);
    p.ranks = n;
    std::vector<std::vector<float>> g(N);
    for (std::size_t r = 0; r < N; ++r) g[r] = data(lay.numel(), 100 * static_cast<std::uint64_t>(s) + r + 1);
    const auto ref = two_stage_reference<C>(lay, copt, p, g, e, server);
    for (std::size_t r = 0; r < N; ++r) {
      INFO(n << " ranks, step " << s << ", rank " << r);
      CHECK(bitwise_equal(results[static_cast<std::size_t>(s)][r], ref));
    }
  }
  for (std::size_t r = 0; r < N; ++r) {
    INFO(n << " ranks, rank " << r);
    CHECK(kind_ok[r] == steps);
    CHECK(bitwise_equal(res[r], e[r]));
    CHECK(bitwise_equal(srv[r], server[r]));
  }
}

}  // namespace gravac::test
