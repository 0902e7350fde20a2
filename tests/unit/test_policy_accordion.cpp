// accordion_policy, rule by rule: per-layer norms built by hand and the levels
// algorithms.md prescribes for them (derivations in the comments).
#include <catch2/catch.hpp>

#include <cmath>
#include <set>

#include "gravac/policy/accordion_policy.hpp"
#include "gravac_test_util.hpp"

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

void steps(accordion_policy& p, std::vector<double> norms, int n) {
  step_report r;
  r.layer_grad_norm = std::move(norms);
  for (int i = 0; i < n; ++i) p.observe(r);
}

std::vector<lv> levels(const accordion_policy& p) { return {p.levels().begin(), p.levels().end()}; }

interval_info epoch_end(double lr) { return {.step = 0, .epoch = 0, .learning_rate = lr, .samples = 0}; }

}  // namespace

TEST_CASE("accordion: first interval low, then the eta threshold per layer", "[policy][accordion]") {
  const auto lay = four_layers();
  accordion_policy p(lay);
  step_params sp;
  p.plan(sp);
  CHECK(levels(p) == std::vector<lv>{lv::low, lv::dense, lv::low, lv::low});  // 1-D bias dense
  CHECK(sp.kept_fraction == std::vector<double>{0.1, 1.0, 0.1, 0.1});
  CHECK(sp.global_fraction == Approx(0.1));
  CHECK(sp.gain_candidates.empty());

  // Interval 0: sums {2, -, 4, 2}. Nothing to compare with yet: stays low.
  steps(p, {1.0, 5.0, 2.0, 1.0}, 2);
  p.on_interval(epoch_end(0.1));
  CHECK(p.intervals() == 1);
  CHECK(levels(p) == std::vector<lv>{lv::low, lv::dense, lv::low, lv::low});
  CHECK(std::isnan(p.change_ratios()[0]));

  // Interval 1: sums {0.8, -, 3, 1}. r = 0.6 (>= 0.5: low), 0.25 (high), exactly 0.5 (low).
  steps(p, {0.4, 5.0, 1.5, 0.5}, 2);
  p.on_interval(epoch_end(0.1));
  CHECK(p.change_ratios()[0] == Approx(0.6));
  CHECK(p.change_ratios()[2] == Approx(0.25));
  CHECK(p.change_ratios()[3] == 0.5);
  CHECK(levels(p) == std::vector<lv>{lv::low, lv::dense, lv::high, lv::low});
  p.plan(sp);
  CHECK(sp.kept_fraction == std::vector<double>{0.1, 1.0, 0.01, 0.1});
  CHECK(sp.global_fraction == Approx((0.1 * 108 + 0.01 * 200 + 0.1 * 50) / 358));

  // Interval 2: same sums, r = 0 everywhere -> high; but the learning rate decays -> all low.
  steps(p, {0.4, 5.0, 1.5, 0.5}, 2);
  p.on_interval(epoch_end(0.01));
  CHECK(levels(p) == std::vector<lv>{lv::low, lv::dense, lv::low, lv::low});

  // Interval 3: no decay, r = 0: high again (the decay held for one interval only).
  steps(p, {0.4, 5.0, 1.5, 0.5}, 2);
  p.on_interval(epoch_end(0.01));
  CHECK(levels(p) == std::vector<lv>{lv::high, lv::dense, lv::high, lv::high});

  // A learning-rate increase (warm-up schedules) is not a decay.
  steps(p, {0.4, 5.0, 1.5, 0.5}, 2);
  p.on_interval(epoch_end(0.05));
  CHECK(levels(p) == std::vector<lv>{lv::high, lv::dense, lv::high, lv::high});
}

TEST_CASE("accordion: a zero previous norm", "[policy][accordion]") {
  accordion_policy p(four_layers());
  steps(p, {0.0, 0.0, 0.0, 1.0}, 1);
  p.on_interval(epoch_end(0.1));
  steps(p, {1.0, 0.0, 0.0, 1.0}, 1);  // conv: 0 -> 1 (infinite change: low); fc: 0 -> 0 (r = 0: high)
  p.on_interval(epoch_end(0.1));
  CHECK(std::isinf(p.change_ratios()[0]));
  CHECK(p.change_ratios()[2] == 0.0);
  CHECK(levels(p) == std::vector<lv>{lv::low, lv::dense, lv::high, lv::high});
}

TEST_CASE("accordion: intervals of F steps, and a decay between boundaries", "[policy][accordion]") {
  accordion_policy p(four_layers(), {.interval_steps = 2, .initial_learning_rate = 0.1});
  steps(p, {1, 1, 1, 1}, 2);  // boundary 1: first interval -> low
  CHECK(p.intervals() == 1);
  CHECK(levels(p)[0] == lv::low);
  steps(p, {1, 1, 1, 1}, 2);  // boundary 2: r = 0 -> high
  CHECK(p.intervals() == 2);
  CHECK(levels(p) == std::vector<lv>{lv::high, lv::dense, lv::high, lv::high});
  steps(p, {1, 1, 1, 1}, 1);
  p.on_interval(epoch_end(0.1));  // an epoch end without decay changes nothing in F mode
  CHECK(levels(p)[0] == lv::high);
  p.on_interval(epoch_end(0.01));  // decay mid-interval (known initial rate 0.1): low at once
  CHECK(levels(p) == std::vector<lv>{lv::low, lv::dense, lv::low, lv::low});
  steps(p, {1, 1, 1, 1}, 1);  // boundary 3: r = 0, but the next interval is still low
  CHECK(p.intervals() == 3);
  CHECK(levels(p) == std::vector<lv>{lv::low, lv::dense, lv::low, lv::low});
  steps(p, {1, 1, 1, 1}, 2);  // boundary 4: back to the rule
  CHECK(levels(p) == std::vector<lv>{lv::high, lv::dense, lv::high, lv::high});
  // A decay right at a boundary: low for exactly the interval that starts now.
  p.on_interval(epoch_end(0.001));
  CHECK(levels(p)[0] == lv::low);
  steps(p, {1, 1, 1, 1}, 2);
  CHECK(levels(p) == std::vector<lv>{lv::high, lv::dense, lv::high, lv::high});
}

TEST_CASE("accordion: 1-D tensors dense by default, configurable levels", "[policy][accordion]") {
  layout lay = four_layers();
  lay.add("empty", {0}, layer_kind::dense);
  accordion_policy dense1d(lay);
  CHECK(dense1d.level(4) == lv::dense);
  accordion_policy all(lay, {.low_compression = 0.5, .high_compression = 0.25, .one_dim_dense = false});
  step_params sp;
  all.plan(sp);
  CHECK(sp.kept_fraction == std::vector<double>{0.5, 0.5, 0.5, 0.5, 0.5});
  steps(all, {1, 1, 1, 1, 0}, 1);
  all.on_interval(epoch_end(0.1));
  steps(all, {1, 1, 1, 1, 0}, 1);
  all.on_interval(epoch_end(0.1));
  all.plan(sp);
  CHECK(sp.kept_fraction == std::vector<double>{0.25, 0.25, 0.25, 0.25, 0.25});
  // eta is configurable: with eta = 0.1 a 20% change is critical.
  accordion_policy eta(four_layers(), {.eta = 0.1});
  steps(eta, {1, 1, 1, 1}, 1);
  eta.on_interval(epoch_end(0.1));
  steps(eta, {1.2, 1, 1.05, 1}, 1);
  eta.on_interval(epoch_end(0.1));
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
  CHECK_THROWS_WITH(accordion_policy(lay, O{.eta = 0}), Catch::Contains("eta"));
  CHECK_THROWS_WITH(accordion_policy(lay, O{.eta = NAN}), Catch::Contains("eta"));
  CHECK_THROWS_WITH(accordion_policy(lay, O{.initial_learning_rate = -1}), Catch::Contains("initial_learning_rate"));
}

TEST_CASE("accordion: save / load mid-interval continues with the same levels", "[policy][accordion][state]") {
  const auto lay = four_layers();
  const accordion_policy_options o{.interval_steps = 3};
  auto norms_at = [](int s) {
    const double a = 1.0 + 0.8 * std::sin(0.4 * s);
    return std::vector<double>{a, 2.0, 1.0 + 0.1 * s, 3.0 / (1 + s)};
  };
  auto run = [&](accordion_policy& p, int from, int to, std::vector<std::vector<lv>>* out) {
    for (int s = from; s < to; ++s) {
      steps(p, norms_at(s), 1);
      if (s % 7 == 6) p.on_interval(epoch_end(s < 20 ? 0.1 : 0.01));
      if (out) out->push_back(levels(p));
    }
  };
  accordion_policy full(lay, o);
  std::vector<std::vector<lv>> expect;
  run(full, 0, 40, &expect);
  std::set<lv> seen;
  for (const auto& l : expect) seen.insert(l[0]);
  CHECK(seen.size() == 2);  // the script exercises both levels
  for (int cut : {1, 4, 13, 20, 22}) {
    INFO("restored after step " << cut);
    accordion_policy first(lay, o);
    run(first, 0, cut, nullptr);
    std::vector<std::byte> bytes;
    first.save(bytes);
    accordion_policy second(lay, o);
    second.load(bytes);
    std::vector<std::vector<lv>> got;
    run(second, cut, 40, &got);
    CHECK(std::equal(got.begin(), got.end(), expect.begin() + cut));
  }
  std::vector<std::byte> bytes;
  full.save(bytes);
  accordion_policy other(lay, {.interval_steps = 4});
  CHECK_THROWS_WITH(other.load(bytes), Catch::Contains("other options"));
  bytes.resize(bytes.size() - 3);
  accordion_policy same(lay, o);
  CHECK_THROWS_WITH(same.load(bytes), Catch::Contains("truncated"));
  CHECK(same.intervals() == 0);
}
