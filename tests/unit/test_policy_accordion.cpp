// accordion_policy, rule by rule: gradient streams built by hand and the levels the rules
// of accordion_policy.hpp prescribe for them (derivations in the comments).
#include <catch2/catch.hpp>
#include <cmath>
#include <set>

#include "gravac/policy/accordion_policy.hpp"
#include "gravac_test_util.hpp"
#include "policy_test_util.hpp"

using namespace gravac;
using lv = accordion_level;

namespace {

layout four_layers() {
  layout l;
  l.add("conv", {4, 3, 3, 3}, layer_kind::conv);  // 108
  l.add("conv.bias", {4}, layer_kind::bias_or_norm);
  l.add("fc", {10, 20}, layer_kind::dense);  // 200
  l.add("fc2", {5, 10}, layer_kind::dense);  // 50
  return l;
}

// A gradient whose layer i is all `value[i] / sqrt(numel)`, so that ||g_i|| = value[i].
std::vector<float> with_norms(const layout& lay, const std::vector<double>& value) {
  std::vector<float> g(lay.numel(), 0.0f);
  for (std::size_t i = 0; i < lay.size(); ++i)
    for (std::size_t j = 0; j < lay[i].numel; ++j)
      g[lay[i].offset + j] = static_cast<float>(value[i] / std::sqrt(static_cast<double>(lay[i].numel)));
  return g;
}

step_params one_step(accordion_policy& p, const std::vector<float>& g) { return test::single_rank_step(p, g); }

// Hands a pending request its sums at once (a collective without a step), for tests of
// the rule rather than of its timing.
void deliver(accordion_policy& p) {
  if (!p.decision_pending()) return;
  const std::vector<double> sums(p.agreement_request().begin(), p.agreement_request().end());
  p.agreed(sums);
}

// `n` steps of gradient `g`, then the end of the epoch at learning rate `lr`, then the
// decision (if the interval was a decision interval) delivered.
void epoch(accordion_policy& p, const std::vector<float>& g, int n, double lr = 0.1) {
  for (int i = 0; i < n; ++i) one_step(p, g);
  p.on_interval({.step = 0, .epoch = 0, .learning_rate = lr, .samples = 0});
  deliver(p);
}

std::vector<lv> levels(const accordion_policy& p) { return {p.levels().begin(), p.levels().end()}; }

interval_info epoch_end(double lr) { return {.step = 0, .epoch = 0, .learning_rate = lr, .samples = 0}; }

// A thread communicator that counts the collectives it runs (to show that Accordion's
// agreement adds none).
class counting_comm {
 public:
  using communicator_tag = void;
  using memory_space = host_space;
  using byte_buffer = std::vector<std::byte>;

  explicit counting_comm(thread_communicator& inner) : inner_(inner) {}
  [[nodiscard]] int rank() const noexcept { return inner_.rank(); }
  [[nodiscard]] int size() const noexcept { return inner_.size(); }
  void allreduce_sum(std::span<float> d) {
    ++others;
    inner_.allreduce_sum(d);
  }
  void allreduce_sum(std::span<double> d) {
    ++others;
    inner_.allreduce_sum(d);
  }
  void allreduce_max(std::span<double> d) {
    ++others;
    inner_.allreduce_max(d);
  }
  void allgatherv(std::span<const std::byte> mine, byte_buffer& out, std::vector<std::size_t>& sizes) {
    ++gathers;
    inner_.allgatherv(mine, out, sizes);
  }
  void broadcast(std::span<std::byte> b, int root) {
    ++others;
    inner_.broadcast(b, root);
  }
  void barrier() {
    ++others;
    inner_.barrier();
  }
  void reset() noexcept { gathers = others = 0; }

  std::size_t gathers = 0;  // allgatherv calls
  std::size_t others = 0;   // every other collective (allreduces, broadcasts, barriers)

 private:
  thread_communicator& inner_;
};
static_assert(Communicator<counting_comm>);

}  // namespace

TEST_CASE("accordion: first decision low, then the eta threshold per layer", "[policy][accordion]") {
  const auto lay = four_layers();
  accordion_policy p(lay, {.compare_every = 1});
  step_params sp;
  powersgd_settings ss;
  p.plan(sp);
  p.plan_settings(ss);
  CHECK(levels(p) == std::vector<lv>{lv::low, lv::dense, lv::low, lv::low});  // 1-D bias dense
  CHECK(sp.kept_fraction == std::vector<double>{0.1, 1.0, 0.1, 0.1});
  CHECK(ss.approximation_rank == std::vector<std::uint32_t>{2, 0, 2, 2});
  CHECK(sp.global_fraction == Approx(0.1));
  CHECK(sp.gain_candidates.empty());

  // Interval 1: ||A|| = 2 * {1, -, 2, 1}. The first decision has nothing to compare with: low.
  epoch(p, with_norms(lay, {1.0, 5.0, 2.0, 1.0}), 2);
  CHECK(p.intervals() == 1);
  CHECK(p.decisions() == 1);
  CHECK(levels(p) == std::vector<lv>{lv::low, lv::dense, lv::low, lv::low});
  CHECK(std::isnan(p.change_ratios()[0]));
  CHECK(p.decision_norms()[2] == Approx(4.0));

  // Interval 2: ||A|| = {0.8, -, 3, 2.2}. r = 0.6 (>= 0.5: low), 0.25 (high), 0.1 (high).
  epoch(p, with_norms(lay, {0.4, 5.0, 1.5, 1.1}), 2);
  CHECK(p.change_ratios()[0] == Approx(0.6));
  CHECK(p.change_ratios()[2] == Approx(0.25));
  CHECK(p.change_ratios()[3] == Approx(0.1));
  CHECK(levels(p) == std::vector<lv>{lv::low, lv::dense, lv::high, lv::high});
  p.plan(sp);
  p.plan_settings(ss);
  CHECK(sp.kept_fraction[2] == 0.01);
  CHECK(ss.approximation_rank == std::vector<std::uint32_t>{2, 0, 1, 1});
  CHECK(sp.global_fraction == Approx((0.1 * 108 + 0.01 * 200 + 0.01 * 50) / 358));
}

TEST_CASE("accordion: r exactly eta is critical, r just below is not", "[policy][accordion]") {
  layout lay;
  lay.add("w", {2, 2}, layer_kind::dense);
  accordion_policy p(lay, {.compare_every = 1});
  epoch(p, {4, 0, 0, 0}, 1);
  epoch(p, {2, 0, 0, 0}, 1);  // |4 - 2| / 4 = 0.5 exactly
  CHECK(p.change_ratios()[0] == 0.5);
  CHECK(p.level(0) == lv::low);
  epoch(p, {2, 0, 0, 0}, 1);  // r = 0
  CHECK(p.level(0) == lv::high);
  epoch(p, {1.0000001f, 0, 0, 0}, 1);  // just below 0.5
  CHECK(p.change_ratios()[0] < 0.5);
  CHECK(p.level(0) == lv::high);
}

TEST_CASE("accordion: the statistic is the norm of the summed gradient, not the sum of norms", "[policy][accordion]") {
  // One matrix layer; the gradient lives in its first two entries.
  layout lay;
  lay.add("w", {2, 2}, layer_kind::dense);
  accordion_policy p(lay, {.compare_every = 1});
  const std::vector<float> steady{1, 0, 0, 0};
  epoch(p, steady, 4);  // ||sum|| = 4, sum of norms = 4: first decision, low
  epoch(p, steady, 4);  // the same: r = 0, high
  REQUIRE(p.level(0) == lv::high);

  // Interval 3: (0.46, +-0.93274) alternating. Each step's norm is 1.04, so the sum of the
  // norms is 4.16 (a 4% change, which the old rule called quiet), but the noise cancels
  // and ||sum|| = 4 * 0.46 = 1.84: a 54% change. Critical.
  const std::vector<float> up{0.46f, 0.93274f, 0, 0}, down{0.46f, -0.93274f, 0, 0};
  for (int i = 0; i < 2; ++i) {
    one_step(p, up);
    one_step(p, down);
  }
  p.on_interval(epoch_end(0.1));
  deliver(p);
  CHECK(p.change_ratios()[0] == Approx(0.54).margin(1e-5));
  CHECK(p.level(0) == lv::low);

  // The converse, interval 4: noise 3x larger (per-step norms 3.04, their sum +192%), but
  // ||sum|| stays 1.84: r = 0, quiet. High.
  const std::vector<float> up3{0.46f, 3.0f, 0, 0}, down3{0.46f, -3.0f, 0, 0};
  for (int i = 0; i < 2; ++i) {
    one_step(p, up3);
    one_step(p, down3);
  }
  p.on_interval(epoch_end(0.1));
  deliver(p);
  CHECK(p.change_ratios()[0] == Approx(0.0).margin(1e-6));
  CHECK(p.level(0) == lv::high);
}

TEST_CASE("accordion: a zero previous norm", "[policy][accordion]") {
  const auto lay = four_layers();
  accordion_policy p(lay, {.compare_every = 1});
  epoch(p, with_norms(lay, {0.0, 0.0, 0.0, 1.0}), 1);
  epoch(p, with_norms(lay, {1.0, 0.0, 0.0, 1.0}), 1);  // conv: 0 -> 1 (infinite change: low); fc: 0 -> 0 (r = 0: high)
  CHECK(std::isinf(p.change_ratios()[0]));
  CHECK(p.change_ratios()[2] == 0.0);
  CHECK(levels(p) == std::vector<lv>{lv::low, lv::dense, lv::high, lv::high});
}

TEST_CASE("accordion: decisions every compare_every intervals, against the statistic C intervals before",
          "[policy][accordion]") {
  layout lay;
  lay.add("w", {2, 2}, layer_kind::dense);
  CHECK(accordion_policy(lay).get_options().compare_every == 10);  // the authors' CIFAR setting
  accordion_policy p(lay, {.compare_every = 3});
  // Decisions at the ends of intervals 1, 4, 7. ||A|| per interval: 1, 5, 5, 1.2, 5, 5, 0.5.
  epoch(p, {1, 0, 0, 0}, 1);  // interval 1: first decision, low
  CHECK(p.decisions() == 1);
  epoch(p, {5, 0, 0, 0}, 1);  // interval 2: 1 -> 5 would be critical, but no decision now
  CHECK_FALSE(p.decision_pending());
  CHECK(p.decisions() == 1);
  epoch(p, {5, 0, 0, 0}, 1);  // interval 3: no decision
  CHECK(p.decisions() == 1);
  // Interval 4: against interval 1 (1 -> 1.2: r = 0.2, high), not interval 3 (5 -> 1.2: 0.76).
  for (int i = 0; i < 2; ++i) one_step(p, {0.6f, 0, 0, 0});
  p.on_interval(epoch_end(0.1));
  CHECK(p.decision_pending());
  deliver(p);
  CHECK(p.decisions() == 2);
  CHECK(p.change_ratios()[0] == Approx(0.2).margin(1e-6));
  CHECK(p.level(0) == lv::high);
  epoch(p, {5, 0, 0, 0}, 1);  // intervals 5, 6: the level holds
  CHECK(p.level(0) == lv::high);
  epoch(p, {5, 0, 0, 0}, 1);
  CHECK(p.level(0) == lv::high);
  epoch(p, {0.5f, 0, 0, 0}, 1);  // interval 7: against interval 4, 1.2 -> 0.5: r = 0.58, low
  CHECK(p.decisions() == 3);
  CHECK(p.change_ratios()[0] == Approx(0.7 / 1.2).margin(1e-6));
  CHECK(p.level(0) == lv::low);
  CHECK(p.intervals() == 7);
}

TEST_CASE("accordion: a decision applies from the second step after its interval end", "[policy][accordion]") {
  layout lay;
  lay.add("w", {2, 2}, layer_kind::dense);
  accordion_policy p(lay, {.interval_steps = 2, .compare_every = 1});
  const std::vector<float> g{1, 0, 0, 0};
  one_step(p, g);
  one_step(p, g);  // interval 1 ends here (F = 2): its norms wait for the next collective
  CHECK(p.decision_pending());
  one_step(p, g);
  CHECK_FALSE(p.decision_pending());
  one_step(p, g);                                  // interval 2 ends: r = 0
  CHECK(one_step(p, g).kept_fraction[0] == 0.1);   // the first step of interval 3: old level
  CHECK(one_step(p, g).kept_fraction[0] == 0.01);  // the second: the decision's
}

TEST_CASE("accordion: after a learning-rate decay, low until the next decision", "[policy][accordion]") {
  const auto lay = four_layers();
  const auto g = with_norms(lay, {1, 1, 1, 1});
  const std::vector<lv> all_low{lv::low, lv::dense, lv::low, lv::low};
  const std::vector<lv> all_high{lv::high, lv::dense, lv::high, lv::high};
  SECTION("a decay between decisions holds for every interval up to the next one") {
    accordion_policy p(lay, {.compare_every = 3});
    epoch(p, g, 2);  // interval 1: first decision, low
    epoch(p, g, 2);
    epoch(p, g, 2);
    epoch(p, g, 2);  // interval 4: r = 0, high
    REQUIRE(levels(p) == all_high);
    epoch(p, g, 2, 0.01);  // interval 5 ends with a decay: low at once...
    CHECK(levels(p) == all_low);
    epoch(p, g, 2, 0.01);  // ...through interval 6 (not only one interval)...
    CHECK(levels(p) == all_low);
    for (int i = 0; i < 2; ++i) {
      one_step(p, g);
      CHECK(levels(p) == all_low);
    }
    p.on_interval(epoch_end(0.01));  // ...up to the decision of interval 7: r = 0, the rule again
    deliver(p);
    CHECK(levels(p) == all_high);
    // A learning-rate increase (warm-up schedules) is not a decay.
    epoch(p, g, 2, 0.05);
    CHECK(levels(p) == all_high);
  }
  SECTION("a decay at a decision's interval end: that decision keeps the layers low") {
    accordion_policy p(lay, {.compare_every = 1});
    epoch(p, g, 2);  // low
    epoch(p, g, 2);  // high
    REQUIRE(levels(p) == all_high);
    for (int i = 0; i < 2; ++i) one_step(p, g);
    p.on_interval(epoch_end(0.01));  // r would be 0 (high), but it was measured before the decay
    CHECK(levels(p) == all_low);
    CHECK(p.decision_pending());
    deliver(p);
    CHECK(levels(p) == all_low);
    CHECK(p.change_ratios()[0] == Approx(0.0).margin(1e-6));  // its statistics are recorded
    epoch(p, g, 2, 0.01);                                     // the next decision: the rule
    CHECK(levels(p) == all_high);
  }
  SECTION("intervals of F steps, decay mid-interval") {
    accordion_policy p(lay, {.interval_steps = 2, .compare_every = 1, .initial_learning_rate = 0.1});
    for (int i = 0; i < 6; ++i) one_step(p, g);  // decisions: low (step 2), high (step 4)
    CHECK(p.intervals() == 3);
    CHECK(levels(p) == all_high);
    one_step(p, g);                 // the third interval's decision (high); interval 4 is one step in
    p.on_interval(epoch_end(0.1));  // an epoch end without decay changes nothing in F mode
    CHECK(p.intervals() == 3);
    CHECK(levels(p) == all_high);
    p.on_interval(epoch_end(0.01));  // decay mid-interval (known initial rate 0.1): low at once
    CHECK(levels(p) == all_low);
    one_step(p, g);  // interval 4 ends: its decision is in flight
    CHECK(levels(p) == all_low);
    one_step(p, g);  // and taken: r = 0, high
    CHECK(levels(p) == all_high);
  }
}

TEST_CASE("accordion: 1-D tensors dense by default, configurable levels", "[policy][accordion]") {
  layout lay = four_layers();
  lay.add("empty", {0}, layer_kind::dense);
  accordion_policy dense1d(lay);
  CHECK(dense1d.level(4) == lv::dense);
  accordion_policy all(
      lay,
      {.low_compression = 0.5, .high_compression = 0.25, .low_rank = 4, .compare_every = 1, .one_dim_dense = false});
  step_params sp;
  powersgd_settings ss;
  all.plan(sp);
  all.plan_settings(ss);
  CHECK(sp.kept_fraction == std::vector<double>{0.5, 0.5, 0.5, 0.5, 0.5});
  CHECK(ss.approximation_rank == std::vector<std::uint32_t>{4, 4, 4, 4, 4});
  const auto g = with_norms(lay, {1, 1, 1, 1, 0});
  epoch(all, g, 1);
  epoch(all, g, 1);
  all.plan(sp);
  all.plan_settings(ss);
  CHECK(sp.kept_fraction == std::vector<double>{0.25, 0.25, 0.25, 0.25, 0.25});
  CHECK(ss.approximation_rank == std::vector<std::uint32_t>{1, 1, 1, 1, 1});
  // eta is configurable: with eta = 0.1 a 20% change is critical.
  const auto four = four_layers();
  accordion_policy eta(four, {.eta = 0.1, .compare_every = 1});
  epoch(eta, with_norms(four, {1, 1, 1, 1}), 1);
  epoch(eta, with_norms(four, {1.2, 1, 1.05, 1}), 1);
  CHECK(levels(eta) == std::vector<lv>{lv::low, lv::dense, lv::high, lv::high});
}

TEST_CASE("accordion: invalid options are rejected at construction", "[policy][accordion][errors]") {
  const auto lay = four_layers();
  using O = accordion_policy_options;
  CHECK_THROWS_WITH(accordion_policy(lay, O{.low_compression = 0}), Catch::Contains("low_compression"));
  CHECK_THROWS_WITH(accordion_policy(lay, O{.low_compression = 1.5}), Catch::Contains("low_compression"));
  CHECK_THROWS_WITH(accordion_policy(lay, O{.low_compression = 0.1, .high_compression = 0.2}),
                    Catch::Contains("high_compression"));
  CHECK_THROWS_WITH(accordion_policy(lay, O{.high_compression = 0}), Catch::Contains("high_compression"));
  CHECK_THROWS_WITH(accordion_policy(lay, O{.low_rank = 0}), Catch::Contains("low_rank"));
  CHECK_THROWS_WITH(accordion_policy(lay, O{.high_rank = 0}), Catch::Contains("high_rank"));
  CHECK_THROWS_WITH(accordion_policy(lay, O{.low_rank = 2, .high_rank = 3}), Catch::Contains("high_rank"));
  CHECK_THROWS_WITH(accordion_policy(lay, O{.eta = 0}), Catch::Contains("eta"));
  CHECK_THROWS_WITH(accordion_policy(lay, O{.eta = NAN}), Catch::Contains("eta"));
  CHECK_THROWS_WITH(accordion_policy(lay, O{.compare_every = 0}), Catch::Contains("compare_every"));
  CHECK_THROWS_WITH(accordion_policy(lay, O{.initial_learning_rate = -1}), Catch::Contains("initial_learning_rate"));
}

TEST_CASE("accordion: an interval without accumulated gradients is an error", "[policy][accordion][errors]") {
  // A device-memory trainer does not call accumulate(): Accordion must not decide on zeros.
  accordion_policy p(four_layers());
  p.observe(step_report{});
  CHECK_THROWS_WITH(p.on_interval(epoch_end(0.1)), Catch::Contains("accumulate"));
  CHECK_THROWS_WITH(p.accumulate(std::vector<float>(3)), Catch::Contains("elements"));
}

TEST_CASE("threads: ranks fed different gradients decide identically, on the rank average",
          "[policy][accordion][threads]") {
  constexpr int ranks = 4;
  const auto lay = four_layers();
  constexpr int steps = 16;  // epochs of 4 steps
  std::vector<std::vector<std::vector<double>>> kept(ranks);
  std::vector<std::vector<std::byte>> states(ranks);
  std::vector<std::size_t> gathers(ranks), others(ranks);
  // Layer fc: rank 0's gradient doubles in epoch 2 (r = 1 alone: critical), the others'
  // stay: the average of ||A|| goes from 1 to 1.25 (r = 0.25): quiet, high on every rank.
  // Layer conv: every rank's gradient shrinks to 0.3x in epoch 3: critical on every rank.
  auto grad = [&](int step, int rank) {
    const int e = step / 4;
    const double fc = rank == 0 && e >= 1 ? 2.0 : 1.0;
    const double conv = e >= 2 ? 0.3 : 1.0;
    auto g = with_norms(lay, {conv * (1 + rank), 1.0, fc, 1.0 + 0.5 * rank});
    for (std::size_t i = 0; i < g.size(); ++i)  // the same direction every step, signs by rank
      if ((i + static_cast<std::size_t>(rank)) % 3 == 0) g[i] = -g[i];
    return g;
  };
  run_ranks(ranks, [&](thread_communicator& inner) {
    counting_comm comm(inner);
    trainer<topk, allgather, accordion_policy> t(comm, lay, {.policy = {.compare_every = 1}});
    comm.reset();
    for (int s = 0; s < steps; ++s) {
      auto g = grad(s, inner.rank());
      t.step(std::span<float>(g));
      kept[inner.rank()].push_back(t.last_params().kept_fraction);
      if ((s + 1) % 4 == 0) t.end_interval({.step = 0, .epoch = 0, .learning_rate = 0.1, .samples = 0});
    }
    t.policy().save(states[inner.rank()]);  // the decision state (the accumulators are save_local's)
    gathers[inner.rank()] = comm.gathers;
    others[inner.rank()] = comm.others;
  });
  for (int r = 1; r < ranks; ++r) {
    CHECK(kept[r] == kept[0]);
    CHECK(states[r] == states[0]);
  }
  // Epoch e's decision applies from step 4 (e + 1) + 1. fc: low, then high from step 9
  // (epoch 2 against epoch 1, the average changes by 25%; rank 0's own by 100%).
  for (int s = 0; s < steps; ++s) {
    INFO("step " << s);
    CHECK(kept[0][s][2] == (s >= 9 ? 0.01 : 0.1));
    CHECK(kept[0][s][1] == 1.0);  // the bias stays dense
    // conv: high from step 9, low again from step 13 (epoch 3 against epoch 2: r = 0.7).
    CHECK(kept[0][s][0] == (s >= 9 && s < 13 ? 0.01 : 0.1));
  }
  // No collective besides each step's own (one Allgather), decisions included.
  for (int r = 0; r < ranks; ++r) {
    CHECK(gathers[r] == steps);
    CHECK(others[r] == 0);
  }
}

namespace {
// The full state of a policy: the decision state, then this rank's own.
std::vector<std::byte> full_state(const accordion_policy& p) {
  std::vector<std::byte> out;
  p.save(out);
  p.save_local(out);
  return out;
}
}  // namespace

TEST_CASE("accordion: save / load mid-interval and with a request in flight", "[policy][accordion][state]") {
  const auto lay = four_layers();
  const accordion_policy_options o{.interval_steps = 3, .compare_every = 2};
  auto grad_at = [&](int s) {
    const double a = 1.0 + 0.8 * std::sin(0.4 * s);
    return with_norms(lay, {a * (s / 9 % 2 ? 3.0 : 1.0), 2.0, 1.0 + 0.1 * s, 3.0 / (1 + s / 6)});
  };
  // Trainer order per step, with an epoch end (and a decay at step 27) every 7 steps.
  auto run = [&](accordion_policy& p, int from, int to, std::vector<std::vector<lv>>* out) {
    for (int s = from; s < to; ++s) {
      one_step(p, grad_at(s));
      if (s % 7 == 6) p.on_interval(epoch_end(s < 27 ? 0.1 : 0.01));
      if (out) out->push_back(levels(p));
    }
  };
  accordion_policy full(lay, o);
  std::vector<std::vector<lv>> expect;
  run(full, 0, 48, &expect);
  std::set<lv> seen;
  for (const auto& l : expect) seen.insert(l[0]);
  CHECK(seen.size() == 2);  // the script exercises both levels
  const auto end_state = full_state(full);
  int cuts_pending = 0, cuts_mid = 0;
  for (int cut = 1; cut < 48; ++cut) {
    INFO("restored after step " << cut);
    accordion_policy first(lay, o);
    run(first, 0, cut, nullptr);
    cuts_pending += first.decision_pending();
    cuts_mid += first.local_interval_norms()[0] > 0;
    std::vector<std::byte> shared, local;
    first.save(shared);
    first.save_local(local);
    accordion_policy second(lay, o);
    second.load(shared);
    second.load_local(local);
    CHECK(second.decision_pending() == first.decision_pending());
    CHECK(second.local_interval_norms() == first.local_interval_norms());
    CHECK(std::equal(second.agreement_request().begin(), second.agreement_request().end(),
                     first.agreement_request().begin(), first.agreement_request().end()));
    std::vector<std::vector<lv>> got;
    run(second, cut, 48, &got);
    CHECK(std::equal(got.begin(), got.end(), expect.begin() + cut));
    CHECK(full_state(second) == end_state);  // accumulators and statistics too
  }
  CHECK(cuts_pending > 0);  // some cuts fell with a request in flight...
  CHECK(cuts_mid > 0);      // ...and some mid-interval
}

TEST_CASE("threads: a restore with the rank-local state continues bit for bit", "[policy][accordion][state][threads]") {
  constexpr int ranks = 4, total = 30;
  const auto lay = test::mixed_layout();
  using T = trainer<topk, allgather, accordion_policy>;
  const T::options opt{.policy = {.interval_steps = 3, .compare_every = 1}};
  struct log {
    std::vector<std::vector<double>> kept;
    std::vector<std::vector<float>> out;
  };
  auto run = [&](T& t, int rank, int from, int to, log& l) {
    for (int s = from; s < to; ++s) {
      auto g = test::rank_gradient(lay, s, rank, test::amplitude_at(s));
      t.step(std::span<float>(g));
      l.kept.push_back(t.last_params().kept_fraction);
      l.out.push_back(std::move(g));
    }
  };
  std::vector<log> full(ranks);
  run_ranks(ranks, [&](thread_communicator& comm) {
    T t(comm, lay, opt);
    run(t, comm.rank(), 0, total, full[comm.rank()]);
  });
  std::set<double> seen;
  for (const auto& k : full[0].kept) seen.insert(k[0]);
  CHECK(seen == std::set<double>{0.01, 0.1});
  // Cuts mid-interval (4, 7) and with a decision in flight (6: interval 2 ended at step 5).
  for (int cut : {4, 6, 7}) {
    std::vector<log> part(ranks);
    std::vector<std::vector<std::byte>> shared(ranks), local(ranks);
    std::vector<std::vector<float>> residual(ranks);
    std::vector<char> pending(ranks);  // not vector<bool>: ranks write neighbouring elements
    run_ranks(ranks, [&](thread_communicator& comm) {
      T t(comm, lay, opt);
      run(t, comm.rank(), 0, cut, part[comm.rank()]);
      t.policy().save(shared[comm.rank()]);
      t.policy().save_local(local[comm.rank()]);
      pending[comm.rank()] = t.policy().decision_pending();
      const auto& ct = t;
      residual[comm.rank()].assign(ct.residual().begin(), ct.residual().end());
    });
    CHECK(pending[0] == (cut == 6));
    run_ranks(ranks, [&](thread_communicator& comm) {
      T t(comm, lay, opt);
      t.policy().load(shared[comm.rank()]);
      t.policy().load_local(local[comm.rank()]);
      std::copy(residual[comm.rank()].begin(), residual[comm.rank()].end(), t.residual().begin());
      t.set_steps(static_cast<std::uint64_t>(cut));
      run(t, comm.rank(), cut, total, part[comm.rank()]);
    });
    for (int r = 0; r < ranks; ++r) {
      INFO("cut " << cut << " rank " << r);
      CHECK(part[r].kept == full[r].kept);
      CHECK(part[r].out == full[r].out);
    }
  }
}

TEST_CASE("accordion: load alone restarts the accumulators from zero", "[policy][accordion][state]") {
  const auto lay = four_layers();
  const accordion_policy_options o{.interval_steps = 2, .compare_every = 1};
  const auto g = with_norms(lay, {1, 1, 1, 1});
  accordion_policy src(lay, o);
  for (int i = 0; i < 4; ++i) one_step(src, g);  // the second interval's request in flight
  one_step(src, g);                              // taken (high); the third interval is one step in
  one_step(src, g);                              // its request in flight
  REQUIRE(src.decision_pending());
  std::vector<std::byte> shared;
  src.save(shared);
  accordion_policy dst(lay, o);
  dst.load(shared);
  REQUIRE(dst.decision_pending());                           // every rank has the request (it shapes the collective)...
  for (double x : dst.agreement_request()) CHECK(x == 0.0);  // ...but without its local norms
  for (double x : dst.local_interval_norms()) CHECK(x == 0.0);
  CHECK(levels(dst) == levels(src));
  deliver(dst);  // zero norms against 2 * ||g||: r = 1, critical
  CHECK(levels(dst) == std::vector<lv>{lv::low, lv::dense, lv::low, lv::low});
}

TEST_CASE("accordion: load rejects bad bytes and changes nothing", "[policy][accordion][state]") {
  const auto lay = four_layers();
  const accordion_policy_options o{.interval_steps = 2, .compare_every = 1};
  accordion_policy src(lay, o);
  const auto g = with_norms(lay, {1, 1, 1, 1});
  for (int i = 0; i < 4; ++i) one_step(src, g);  // two intervals: the second's request in flight
  REQUIRE(src.decision_pending());
  std::vector<std::byte> bytes, local;
  src.save(bytes);
  src.save_local(local);

  accordion_policy same(lay, o);
  one_step(same, g);  // some state of its own, which a failed load must keep
  const auto before = full_state(same);
  auto unchanged = [&] { return full_state(same) == before; };
  accordion_policy other(lay, {.interval_steps = 2, .compare_every = 2});
  CHECK_THROWS_WITH(other.load(bytes), Catch::Contains("other options"));
  CHECK_THROWS_WITH(same.load(local), Catch::Contains("another policy"));
  auto cut = bytes;
  cut.resize(cut.size() - 3);
  CHECK_THROWS_WITH(same.load(cut), Catch::Contains("truncated"));
  CHECK(unchanged());
  auto trailing = bytes;
  trailing.push_back(std::byte{0});
  CHECK_THROWS_WITH(same.load(trailing), Catch::Contains("trailing"));
  CHECK(unchanged());
  // The decision state ends with the flags pending, has_prev and hold_low.
  const std::size_t has_prev_at = bytes.size() - 2;
  REQUIRE(bytes[has_prev_at] == std::byte{1});
  auto flag = bytes;
  flag[has_prev_at] = std::byte{7};
  CHECK_THROWS_WITH(same.load(flag), Catch::Contains("flag"));
  CHECK(unchanged());
  // has_prev = 0 with a decision already taken.
  auto no_prev = bytes;
  no_prev[has_prev_at] = std::byte{0};
  CHECK_THROWS_WITH(same.load(no_prev), Catch::Contains("decision without statistics"));
  CHECK(unchanged());
  // A hold after a decay without a decision in flight.
  auto hold = bytes;
  hold[bytes.size() - 3] = std::byte{0};
  hold[bytes.size() - 1] = std::byte{1};
  CHECK_THROWS_WITH(same.load(hold), Catch::Contains("hold"));
  // A level byte out of range (the levels follow the 16-byte header and the 8-byte length).
  auto level = bytes;
  level[24] = std::byte{9};
  CHECK_THROWS_WITH(same.load(level), Catch::Contains("level"));
  // The bias (layer 1) saved as compressed.
  level[24] = std::byte{0};
  level[25] = std::byte{0};
  CHECK_THROWS_WITH(same.load(level), Catch::Contains("dense flag"));
  CHECK(unchanged());
  // The local part: it must match the decision state (no decision in flight in `same`).
  CHECK_THROWS_WITH(same.load_local(local), Catch::Contains("does not match"));
  CHECK_THROWS_WITH(same.load_local(bytes), Catch::Contains("another policy"));
  CHECK(unchanged());
  same.load(bytes);
  auto local_cut = local;
  local_cut.pop_back();
  CHECK_THROWS_WITH(same.load_local(local_cut), Catch::Contains("truncated"));
  same.load_local(local);
  CHECK(same.decision_pending());
  CHECK(full_state(same) == full_state(src));
}
