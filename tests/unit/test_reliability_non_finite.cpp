// Non-finite gradients under every trainer option (throw_error, skip_step, zero_values,
// ignore), for NaN, +inf and -inf, in the first and in the last element of the buffer,
// with both collectives and several compressors; every rank must take the same action.
#include <atomic>
#include <catch2/catch.hpp>
#include <limits>

#include "reliability_util.hpp"

using namespace gravac;

namespace {
using gravac::test::ranks;
constexpr int bad_rank = 2;

const float bad_values[] = {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                            -std::numeric_limits<float>::infinity()};

// Gradient of rank r at step s; when poisoned, rank bad_rank's element `at` is `bad`.
std::vector<float> grad(const layout& lay, int r, int s, bool poisoned = false, std::size_t at = 0, float bad = 0.0f) {
  auto g = test::make_data(lay.numel(), 97 * s + r + 1);
  if (poisoned && r == bad_rank) g[at] = bad;
  return g;
}

struct outcome {
  std::vector<std::vector<float>> out = std::vector<std::vector<float>>(ranks);       // after the last step
  std::vector<std::vector<float>> residual = std::vector<std::vector<float>>(ranks);  // after the last step
  std::atomic<int> thrown{0};
  std::atomic<int> skipped{0};
};

// Three steps; the middle one is poisoned on bad_rank. `zeroed` feeds the same data with
// the bad value already replaced by 0, `drop_middle` leaves the middle step out.
template <class C, class K>
void run(outcome& o, non_finite_action action, std::size_t at, float bad, double f, bool poison = true,
         bool zeroed = false, bool drop_middle = false) {
  const auto lay = test::mixed_layout();
  using T = trainer<C, K, fixed_policy>;
  run_ranks(ranks, [&](thread_communicator& comm) {
    T t(comm, lay, {.policy = {.kept_fraction = f}, .seed = 5, .on_non_finite = action});
    const int r = comm.rank();
    for (int s = 0; s < 3; ++s) {
      if (drop_middle && s == 1) continue;
      auto g = grad(lay, r, s, poison && s == 1, at, zeroed ? 0.0f : bad);
      const std::vector<float> res_before(t.residual().begin(), t.residual().end());
      // u = g + e, as error feedback computes it: what a finite rank keeps when the step throws.
      std::vector<float> u(g.size());
      for (std::size_t i = 0; i < g.size(); ++i) u[i] = res_before[i] + g[i];
      const auto steps_before = t.steps();
      try {
        const auto& rep = t.step(g);
        if (rep.skipped) {
          ++o.skipped;
          CHECK(test::bitwise_equal(std::vector<float>(t.residual().begin(), t.residual().end()), res_before));
          CHECK(std::all_of(g.begin(), g.end(), [](float x) { return x == 0.0f; }));
          CHECK(t.steps() == steps_before + 1);
        }
      } catch (const gravac::error& e) {
        CHECK(e.code() == status::non_finite);
        CHECK(e.rank() == r);
        if (r == bad_rank)
          CHECK_THAT(e.what(), Catch::Contains("layer '" + lay[at == 0 ? 0 : lay.size() - 1].name + "'"));
        else
          CHECK_THAT(e.what(), Catch::Contains("rank 2's gradient"));
        // A throwing step loses nothing: the failing rank's residual is as it was, a finite
        // rank's holds everything it did not get to send, u = g + e (the flag rides in the
        // step's collective, so the finite ranks learn of the failure only after sending).
        // (Reading the residual through the mutable accessor, as this test does, tells the
        // trainer it may have changed, so even all-dense steps keep it.) The step counter
        // does not advance.
        const std::vector<float> now(t.residual().begin(), t.residual().end());
        if (r == bad_rank)
          CHECK(test::bitwise_equal(now, res_before));
        else
          CHECK(test::bitwise_equal(now, u));
        CHECK(t.steps() == steps_before);
        ++o.thrown;
        return;
      }
      o.out[r] = g;
    }
    o.residual[r].assign(t.residual().begin(), t.residual().end());
  });
}

template <class C, class K>
void check_all_actions(double f) {
  const auto lay = test::mixed_layout();
  for (std::size_t at : {std::size_t{0}, lay.numel() - 1}) {
    for (float bad : bad_values) {
      INFO("element " << at << " value " << bad << " fraction " << f);
      {
        outcome o;
        run<C, K>(o, non_finite_action::throw_error, at, bad, f);
        CHECK(o.thrown == ranks);
      }
      {
        // skip_step: every rank skips, and the run equals one without the poisoned step
        // (top-k does not depend on the step counter; the residual was untouched).
        outcome skip, without;
        run<C, K>(skip, non_finite_action::skip_step, at, bad, f);
        CHECK(skip.skipped == ranks);
        CHECK(skip.thrown == 0);
        if constexpr (!std::is_same_v<C, randomk>) {
          run<C, K>(without, non_finite_action::skip_step, at, bad, f, true, false, true);
          for (int r = 0; r < ranks; ++r) {
            CHECK(test::bitwise_equal(skip.out[r], without.out[r]));
            CHECK(test::bitwise_equal(skip.residual[r], without.residual[r]));
          }
        }
      }
      {
        // zero_values: exactly the run whose bad value was 0 from the start.
        outcome zero, reference;
        run<C, K>(zero, non_finite_action::zero_values, at, bad, f);
        run<C, K>(reference, non_finite_action::throw_error, at, bad, f, true, true);
        CHECK(zero.thrown == 0);
        CHECK(zero.skipped == 0);
        for (int r = 0; r < ranks; ++r) {
          CHECK(test::bitwise_equal(zero.out[r], reference.out[r]));
          CHECK(test::bitwise_equal(zero.residual[r], reference.residual[r]));
        }
      }
      {
        // ignore: nothing is checked and nothing is thrown; the value is the caller's problem,
        // but the step must stay memory-safe (the sanitizer builds run this).
        outcome o;
        run<C, K>(o, non_finite_action::ignore, at, bad, f);
        CHECK(o.thrown == 0);
        CHECK(o.skipped == 0);
      }
    }
  }
}
}  // namespace

TEST_CASE("non-finite: every action with top-k over allgather", "[reliability][non_finite]") {
  check_all_actions<topk, allgather>(0.1);
}

TEST_CASE("non-finite: every action with top-k over dense allreduce", "[reliability][non_finite]") {
  check_all_actions<topk, dense_allreduce>(0.1);
}

TEST_CASE("non-finite: every action with random-k", "[reliability][non_finite]") {
  check_all_actions<randomk, allgather>(0.1);
}

TEST_CASE("non-finite: every action when every layer is sent dense", "[reliability][non_finite]") {
  check_all_actions<identity, dense_allreduce>(1.0);
  check_all_actions<topk, dense_allreduce>(1.0);
}

TEST_CASE("non-finite: ignore lets a dense NaN through to every rank", "[reliability][non_finite]") {
  // ignore means the caller guarantees finite gradients: a dense NaN reaches every rank's
  // average, and the next step (dense sends leave no residual) is clean again.
  const auto lay = test::mixed_layout();
  run_ranks(ranks, [&](thread_communicator& comm) {
    trainer<identity, dense_allreduce, fixed_policy> t(comm, lay, {.on_non_finite = non_finite_action::ignore});
    auto g = grad(lay, comm.rank(), 1, true, 5, std::numeric_limits<float>::quiet_NaN());
    t.step(g);
    CHECK(std::isnan(g[5]));
    CHECK(std::isfinite(g[6]));
    g = grad(lay, comm.rank(), 2);
    t.step(g);
    CHECK(std::all_of(g.begin(), g.end(), [](float x) { return std::isfinite(x); }));
  });
}

TEST_CASE("non-finite: two failing ranks each name their own layer", "[reliability][non_finite]") {
  const auto lay = test::mixed_layout();
  std::atomic<int> thrown{0};
  run_ranks(ranks, [&](thread_communicator& comm) {
    trainer<topk, allgather, fixed_policy> t(comm, lay, {});
    auto g = test::make_data(lay.numel(), comm.rank());
    if (comm.rank() == 1) g[lay[2].offset] = std::numeric_limits<float>::infinity();
    if (comm.rank() == 3) g[lay[4].offset + 1] = std::numeric_limits<float>::quiet_NaN();
    try {
      t.step(g);
    } catch (const gravac::error& e) {
      ++thrown;
      if (comm.rank() == 1) CHECK_THAT(e.what(), Catch::Contains("layer 'fc1.weight'"));
      if (comm.rank() == 3) CHECK_THAT(e.what(), Catch::Contains("layer 'fc2.weight'"));
      // The flag rides in the gradient's collective as a count and a sum of ranks: one failing
      // rank is named, several are counted.
      if (comm.rank() % 2 == 0) CHECK_THAT(e.what(), Catch::Contains("the gradients of 2 ranks"));
    }
  });
  CHECK(thrown == ranks);
}

TEST_CASE("non-finite: after a skipped step training goes on normally", "[reliability][non_finite]") {
  const auto lay = test::mixed_layout();
  run_ranks(ranks, [&](thread_communicator& comm) {
    trainer<randomk, allgather, fixed_policy> t(
        comm, lay, {.policy = {.kept_fraction = 0.2}, .on_non_finite = non_finite_action::skip_step});
    for (int s = 0; s < 6; ++s) {
      auto g = grad(lay, comm.rank(), s, s % 2 == 1, 3, std::numeric_limits<float>::quiet_NaN());
      const auto& rep = t.step(g);
      CHECK(rep.skipped == (s % 2 == 1));
      CHECK(rep.step == static_cast<std::uint64_t>(s));
      CHECK(std::all_of(g.begin(), g.end(), [](float x) { return std::isfinite(x); }));
      CHECK(std::all_of(t.residual().begin(), t.residual().end(), [](float x) { return std::isfinite(x); }));
    }
  });
}
