// The multi-objective choice of the kept fraction: the hand-computed point on constructed
// curves, on the Pareto front; moo_policy's warm-up, re-decisions, save/load, and the
// same decision on every rank.
#include <catch2/catch.hpp>
#include <cmath>

#include "gravac/policy/moo_policy.hpp"
#include "gravac_test_util.hpp"

using namespace gravac;

namespace {
const std::vector<double> candidates{0.1, 0.033, 0.011, 0.004, 0.001};

// No scan point may dominate the chosen one.
bool on_front(const moo_chooser& ch, const moo_decision& d) {
  for (std::size_t i = 0; i < ch.scan_points(); ++i) {
    const auto p = ch.scan_point(i);
    if (p[1] <= d.time && p[2] <= d.loss && (p[1] < d.time || p[2] < d.loss)) return false;
  }
  return true;
}
}  // namespace

TEST_CASE("quadratic fit in log f reproduces a quadratic exactly", "[moo]") {
  std::vector<double> x, y;
  for (double c : candidates) {
    x.push_back(std::log(c));
    y.push_back(2.0 - 0.3 * std::log(c) + 0.05 * std::log(c) * std::log(c));
  }
  double centre = 0;
  const auto k = detail::fit_quadratic(x, y, centre);
  for (std::size_t i = 0; i < x.size(); ++i) {
    const double dx = x[i] - centre;
    CHECK(k[0] + k[1] * dx + k[2] * dx * dx == Approx(y[i]).epsilon(1e-12));
  }
}

TEST_CASE("multi-objective choice on constructed curves equals the hand-computed point", "[moo]") {
  moo_chooser ch(1001);
  const double grid = std::log(100.0) / 1000;  // one scan step in log f
  SECTION("time and loss both linear in log f") {
    // t = ln f; loss = 3 - ln(f / 0.001) / ln 100 (3 at f = 0.001, 2 at f = 0.1). Normalised
    // over the front: t_n = u, loss_n = 1 - u with u = ln(f/0.001)/ln(100); the ASF
    // max(0.6 u, 0.4 (1 - u)) is smallest at u = 0.4: f* = 0.001 * 100^0.4 = 0.0063096.
    std::vector<double> loss;
    for (double c : candidates) loss.push_back(3 - std::log(c / 0.001) / std::log(100.0));
    const auto d = ch.choose(candidates, loss, [](double f) { return std::log(f); });
    CHECK(std::fabs(std::log(d.fraction) - std::log(0.0063096)) <= grid);
    CHECK(d.front_size == 1001);  // every point trades time for loss
    CHECK(on_front(ch, d));
  }
  SECTION("time with a minimum inside: the slow side is dominated") {
    // t = (ln f - ln 0.01)^2 is smallest at f = 0.01, so f < 0.01 (slower and lossier) is off
    // the front. On [0.01, 0.1], v = log10(f / 0.01): t_n = v^2, loss_n = 1 - v;
    // 0.6 v^2 = 0.4 (1 - v) gives v = (-0.4 + sqrt(0.16 + 0.96)) / 1.2 = 0.548584,
    // f* = 0.01 * 10^0.548584 = 0.035361.
    std::vector<double> loss;
    for (double c : candidates) loss.push_back(3 - std::log(c / 0.001) / std::log(100.0));
    const double a = std::log(0.01);
    const auto d = ch.choose(candidates, loss, [&](double f) { return (std::log(f) - a) * (std::log(f) - a); });
    CHECK(std::fabs(std::log(d.fraction) - std::log(0.035361)) <= grid);
    CHECK(on_front(ch, d));
    CHECK(d.front_size == Approx(501).margin(1));  // the half from 0.01 to 0.1
    for (auto i : ch.front()) CHECK(ch.scan_point(i)[0] >= std::log(0.01) - grid);
  }
  SECTION("weights move the point: all weight on time picks the fastest") {
    std::vector<double> loss;
    for (double c : candidates) loss.push_back(3 - std::log(c / 0.001) / std::log(100.0));
    CHECK(ch.choose(
                candidates, loss, [](double f) { return f; }, 1.0, 0.0)
              .fraction == Approx(0.001));
    CHECK(ch.choose(
                candidates, loss, [](double f) { return f; }, 0.0, 1.0)
              .fraction == Approx(0.1));
  }
  CHECK_THROWS_AS(moo_chooser(1), error);
}

namespace {
layout policy_layout() {
  layout lay;
  lay.add("conv.weight", {32, 4, 3, 3}, layer_kind::conv);
  lay.add("fc.weight", {200, 100}, layer_kind::dense);
  lay.add("fc.bias", {200}, layer_kind::bias_or_norm);
  return lay;
}
step_report report_with(std::uint64_t step, const std::vector<double>& gains) {
  step_report r;
  r.step = step;
  r.gain_candidates = candidates;
  r.gain_curve = gains;
  r.collective = collective_kind::allgather;
  r.statistics_synchronized = true;
  return r;
}
std::vector<double> gains_for(double scale) {  // a gain curve rising with f
  std::vector<double> g;
  for (double c : candidates) g.push_back(std::min(1.0, scale * (0.9 + 0.1 * std::log10(c))));
  return g;
}
}  // namespace

TEST_CASE("moo_policy: warm-up, the decision, re-decisions and save/load", "[moo][policy]") {
  const auto lay = policy_layout();
  moo_policy_options opt;
  opt.warmup_steps = 10;
  opt.source = network_source::fixed;
  opt.network = network_params::from_gbps(1e-4, 1);
  opt.one_dim_dense = true;
  moo_policy pol(lay, opt);
  step_params p = test::params_for(lay, 1.0);
  p.ranks = 4;
  for (std::uint64_t s = 0; s < 10; ++s) {
    p.step = s;
    pol.plan(p);
    CHECK(p.kept_fraction[0] == Approx(1.0 - 0.9 * static_cast<double>(s) / 9));  // 1.0 -> 0.1 linearly
    CHECK(p.kept_fraction[2] == dense_fraction);                                  // the bias stays dense
    CHECK(p.gain_candidates.size() == candidates.size());
    CHECK_FALSE(pol.decided());
    pol.observe(report_with(s, gains_for(1.0)));
  }
  REQUIRE(pol.decided());
  // The decision equals the chooser's on the same curves with the policy's time model.
  std::vector<double> loss;
  for (double g : gains_for(1.0)) loss.push_back(1 / g);
  moo_chooser ch;
  const auto expect = ch.choose(candidates, loss, [&](double f) { return pol.modeled_time(f, opt.network, 4); });
  CHECK(pol.last_decision().fraction == Approx(expect.fraction).epsilon(0.01));
  p.step = 10;
  pol.plan(p);
  CHECK(p.kept_fraction[0] == pol.last_decision().fraction);
  CHECK(pol.decisions() == 1);

  // A 5% change of gain does not re-decide; a 20% change does (after smoothing).
  for (std::uint64_t s = 10; s < 20; ++s) pol.observe(report_with(s, gains_for(0.95)));
  CHECK(pol.decisions() == 1);
  for (std::uint64_t s = 20; s < 40; ++s) pol.observe(report_with(s, gains_for(0.7)));
  CHECK(pol.decisions() >= 2);

  // Save / load carries the decision.
  std::vector<std::byte> state;
  pol.save(state);
  moo_policy other(lay, opt);
  other.load(state);
  CHECK(other.decided());
  CHECK(other.current_fraction(99) == pol.current_fraction(99));
  CHECK(other.decisions() == pol.decisions());
  state.pop_back();
  CHECK_THROWS_AS(other.load(state), error);

  moo_policy_options bad = opt;
  bad.candidates = {0.1, 1.5};
  CHECK_THROWS_AS(moo_policy(lay, bad), error);
  bad = opt;
  bad.source = network_source::profile;
  CHECK_THROWS_AS(moo_policy(lay, bad), error);
}

TEST_CASE("moo_policy re-decides when the network profile changes", "[moo][policy]") {
  const auto lay = policy_layout();
  moo_policy_options opt;
  opt.warmup_steps = 2;
  opt.source = network_source::profile;
  // Bandwidth-bound, then latency-bound: the time curve's shape changes, and so may f.
  opt.profile = std::make_shared<network_profile>(network_profile::schedule(
      {{5, network_params::from_gbps(1e-6, 1)}, {5, network_params::from_gbps(32e-3, 25)}}, profile_index::step));
  moo_policy pol(lay, opt);
  step_params p = test::params_for(lay, 1.0);
  p.ranks = 8;
  for (std::uint64_t s = 0; s < 12; ++s) {
    p.step = s;
    pol.plan(p);
    pol.observe(report_with(s, gains_for(1.0)));
  }
  CHECK(pol.decisions() == 3);  // after the warm-up, at the switch to slow, and back to fast
}

TEST_CASE("moo_policy with the flexible collective decides the same on every rank", "[moo][policy]") {
  constexpr int n = 4;
  const auto lay = policy_layout();
  std::vector<std::vector<double>> fractions(n);
  std::vector<std::vector<collective_kind>> kinds(n);
  std::vector<std::uint64_t> decisions(n);
  run_ranks(n, [&](thread_communicator& comm) {
    trainer<topk, flexible, moo_policy>::options opt;
    opt.policy.warmup_steps = 3;
    opt.policy.gain_change = 0.02;  // re-decide often
    trainer<topk, flexible, moo_policy> t(comm, lay, opt);
    for (int s = 0; s < 10; ++s) {
      // Different data on every rank, and a scale that drifts: gains move, decisions follow.
      auto g = test::make_data(lay.numel(), 17 * s + comm.rank(),
                               (s + comm.rank()) % 2 ? test::distribution::laplace : test::distribution::gaussian);
      t.step(g);
      fractions[static_cast<std::size_t>(comm.rank())].push_back(t.last_params().kept_fraction[1]);
      kinds[static_cast<std::size_t>(comm.rank())].push_back(t.last_report().collective);
    }
    decisions[static_cast<std::size_t>(comm.rank())] = t.policy().decisions();
  });
  CHECK(decisions[0] >= 1);
  for (int r = 0; r < n; ++r) {
    CHECK(fractions[static_cast<std::size_t>(r)] == fractions[0]);
    CHECK(kinds[static_cast<std::size_t>(r)] == kinds[0]);
    CHECK(decisions[static_cast<std::size_t>(r)] == decisions[0]);
  }
  // After the warm-up the fraction is one of the scan's points between the candidates.
  CHECK(fractions[0].back() >= 0.001 - 1e-12);
  CHECK(fractions[0].back() <= 0.1 + 1e-12);
}

TEST_CASE("moo_policy warm-up counted in intervals (epochs)", "[moo][policy]") {
  const auto lay = policy_layout();
  moo_policy_options opt;
  opt.warmup_intervals = 3;
  opt.source = network_source::fixed;
  moo_policy pol(lay, opt);
  step_params p = test::params_for(lay, 1.0);
  p.ranks = 2;
  std::uint64_t step = 0;
  const double expect[3] = {1.0, 0.55, 0.1};  // 1.0 -> 0.1 linearly over three epochs
  for (int epoch = 0; epoch < 3; ++epoch) {
    for (int s = 0; s < 4; ++s, ++step) {
      p.step = step;
      pol.plan(p);
      CHECK(p.kept_fraction[0] == Approx(expect[epoch]));
      pol.observe(report_with(step, gains_for(1.0)));
    }
    CHECK_FALSE(pol.decided());
    pol.on_interval({step, static_cast<std::uint64_t>(epoch + 1), 0.1, 0});
  }
  pol.observe(report_with(step, gains_for(1.0)));
  CHECK(pol.decided());
  CHECK(pol.decisions() == 1);
}
