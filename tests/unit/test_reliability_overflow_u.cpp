// A gradient finite by itself whose sum with the error-feedback residual overflows the
// float range: u = g + e is what every compressor computes, so the trainer screens u, not
// g alone, and on_non_finite acts on it exactly as on a non-finite gradient. Each case
// plants a residual near the float maximum on one rank (through the trainer's residual
// accessor) and a large finite gradient of the same sign at that element.
#include <atomic>
#include <catch2/catch.hpp>
#include <cmath>
#include <limits>

#include "reliability_util.hpp"

using namespace gravac;

namespace {
using gravac::test::ranks;
constexpr int overflowing_rank = 1;
constexpr float big = 0.75f * std::numeric_limits<float>::max();  // big + big overflows, big alone does not

bool all_finite(std::span<const float> v) {
  return std::all_of(v.begin(), v.end(), [](float x) { return std::isfinite(x); });
}

// One step after a warm-up step; on overflowing_rank the residual at element `at` of layer
// `layer` is set to `big` and the gradient there is `big` too.
template <class C, class K, class Check>
void overflow_step(non_finite_action action, double f, std::size_t layer, Check&& check) {
  const auto lay = test::mixed_layout();
  run_ranks(ranks, [&](thread_communicator& comm) {
    trainer<C, K, fixed_policy> t(comm, lay, {.policy = {.kept_fraction = f}, .seed = 3, .on_non_finite = action});
    auto g0 = test::make_data(lay.numel(), 11 + comm.rank());
    t.step(g0);
    const std::size_t at = lay[layer].offset + lay[layer].numel / 2;
    auto res = t.residual();  // the mutable accessor: the trainer no longer assumes e = 0
    if (comm.rank() == overflowing_rank) res[at] = big;
    auto g = test::make_data(lay.numel(), 23 + comm.rank());
    if (comm.rank() == overflowing_rank) g[at] = big;
    REQUIRE(all_finite(g));
    REQUIRE(all_finite(t.residual()));
    check(comm.rank(), t, g, at);
  });
}
}  // namespace

TEST_CASE("overflow of g + e: throw_error names the layer and the overflow, loses nothing",
          "[reliability][non_finite][overflow]") {
  const auto lay = test::mixed_layout();
  std::atomic<int> thrown{0};
  overflow_step<topk, allgather>(non_finite_action::throw_error, 0.1, 2,
                                 [&](int r, auto& t, std::vector<float>& g, std::size_t) {
                                   const std::vector<float> before(t.residual().begin(), t.residual().end());
                                   std::vector<float> u(g.size());
                                   for (std::size_t i = 0; i < g.size(); ++i) u[i] = g[i] + before[i];
                                   const auto steps = t.steps();
                                   try {
                                     t.step(g);
                                     FAIL("the step should have thrown");
                                   } catch (const gravac::error& e) {
                                     ++thrown;
                                     CHECK(e.code() == status::non_finite);
                                     if (r == overflowing_rank) {
                                       CHECK_THAT(e.what(), Catch::Contains("layer '" + lay[2].name + "'"));
                                       CHECK_THAT(e.what(), Catch::Contains("overflows"));
                                     } else {
                                       CHECK_THAT(e.what(), Catch::Contains("rank 1's gradient"));
                                     }
                                   }
                                   // Nothing lost: the failing rank keeps its residual, the others hold u = g + e.
                                   const std::vector<float> now(t.residual().begin(), t.residual().end());
                                   CHECK(test::bitwise_equal(now, r == overflowing_rank ? before : u));
                                   CHECK(all_finite(now));
                                   CHECK(t.steps() == steps);
                                 });
  CHECK(thrown == ranks);
}

TEST_CASE("overflow of g + e: skip_step skips on every rank with residuals untouched",
          "[reliability][non_finite][overflow]") {
  std::atomic<int> skipped{0};
  overflow_step<topk, dense_allreduce>(
      non_finite_action::skip_step, 0.1, 4, [&](int, auto& t, std::vector<float>& g, std::size_t) {
        const std::vector<float> before(t.residual().begin(), t.residual().end());
        const auto& rep = t.step(g);
        if (rep.skipped) ++skipped;
        CHECK(test::bitwise_equal(std::vector<float>(t.residual().begin(), t.residual().end()), before));
        CHECK(std::all_of(g.begin(), g.end(), [](float x) { return x == 0.0f; }));
      });
  CHECK(skipped == ranks);
}

TEST_CASE("overflow of g + e: zero_values drops g there and goes on with finite results",
          "[reliability][non_finite][overflow]") {
  overflow_step<randomk, allgather>(non_finite_action::zero_values, 0.2, 2,
                                    [&](int r, auto& t, std::vector<float>& g, std::size_t at) {
                                      const float e_at = t.residual()[at];
                                      t.step(g);
                                      CHECK(all_finite(g));
                                      CHECK(all_finite(t.residual()));
                                      // On the failing rank u there was the residual alone: it is either still in the
                                      // residual or was sent (and the residual there is 0).
                                      if (r == overflowing_rank)
                                        CHECK((t.residual()[at] == e_at || t.residual()[at] == 0.0f));
                                    });
}

TEST_CASE("overflow of g + e: a finite g + e close to the maximum is not flagged",
          "[reliability][non_finite][overflow]") {
  // big + big / 4 stays finite: the screen must not flag large but finite sums.
  const auto lay = test::mixed_layout();
  run_ranks(ranks, [&](thread_communicator& comm) {
    trainer<topk, allgather, fixed_policy> t(comm, lay, {.policy = {.kept_fraction = 0.1}});
    auto g0 = test::make_data(lay.numel(), 5 + comm.rank());
    t.step(g0);
    const std::size_t at = lay[2].offset;
    t.residual()[at] = big / ranks;
    auto g = test::make_data(lay.numel(), 7 + comm.rank());
    g[at] = big / 4 / ranks;
    CHECK_NOTHROW(t.step(g));
    CHECK(all_finite(t.residual()));
  });
}
