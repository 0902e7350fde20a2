// gravac_policy, rule by rule: scripted statistics (step_report values built by hand) and
// the decisions docs/algorithms.md ("GraVAC") prescribes for them, derived by hand in the comments.
#include <catch2/catch.hpp>
#include <cmath>
#include <map>

#include "gravac/policy/accordion_policy.hpp"
#include "gravac/policy/gravac_policy.hpp"
#include "gravac_test_util.hpp"

using namespace gravac;

namespace {

// The rules are scripted on a clock every rank shares (simulated, without measured codec
// time), which the policy reads at once; a clock with measured parts is read one step late
// (see "a measured clock is read one step late" below).
gravac_policy_options on_shared_clock(gravac_policy_options o) {
  if (o.time.source == time_source::measured) o.time = {time_source::simulated, 0.0, false};
  return o;
}

// Drives the policy the way the trainer does: plan, then observe a report whose gain
// curve answers the candidates the plan asked for, index by index.
struct driver {
  gravac_policy pol;
  step_params p;
  std::uint64_t step = 0;
  double last_seconds = -1;  // the previous step's time, which the trainer carries in the next step

  driver(const layout& lay, const gravac_policy_options& o, bool shared_clock = true)
      : pol(lay, shared_clock ? on_shared_clock(o) : o) {
    p.kept_fraction.assign(lay.size(), 1.0);
  }

  // The CF the next step sends (1 = dense).
  double plan() {
    p.step = step;
    pol.plan(p);
    return p.global_fraction >= 1 ? 1.0 : std::round(1.0 / p.global_fraction);
  }
  // The candidate CFs the plan asked gains for.
  std::vector<double> asked() const {
    std::vector<double> cfs;
    for (double f : p.gain_candidates) cfs.push_back(std::round(1.0 / f));
    return cfs;
  }
  // One step: gains by CF (a CF absent from the table has gain 0), `seconds` of measured time.
  double run(const std::map<long, double>& gains, double seconds) {
    const double cf = plan();
    step_report r;
    r.step = step++;
    r.gain_candidates.assign(p.gain_candidates.begin(), p.gain_candidates.end());
    for (double f : p.gain_candidates) {
      auto it = gains.find(std::lround(1.0 / f));
      r.gain_curve.push_back(it == gains.end() ? 0.0 : it->second);
    }
    r.iteration_s = seconds;                                  // time_source::measured adds the (zero) codec times
    r.modeled_communicate_s = r.modeled_exposed_s = seconds;  // the shared (simulated) clock, synchronous
    r.previous_times_agreed = last_seconds >= 0;
    r.previous_times.iteration_s = last_seconds;
    last_seconds = seconds;
    pol.observe(r);
    return cf;
  }
};

layout two_layers() {
  layout l;
  l.add("fc.weight", {40, 50}, layer_kind::dense);
  l.add("fc.bias", {40}, layer_kind::bias_or_norm);
  return l;
}

}  // namespace

TEST_CASE("gravac: candidates double from CF_min and end at CF_max", "[policy][gravac]") {
  const auto lay = two_layers();
  gravac_policy def(lay);
  CHECK(std::vector<double>(def.candidates().begin(), def.candidates().end()) ==
        std::vector<double>{10, 20, 40, 80, 160, 320, 640, 1000});
  gravac_policy odd(lay, {.cf_min = 10, .cf_max = 100});
  CHECK(std::vector<double>(odd.candidates().begin(), odd.candidates().end()) ==
        std::vector<double>{10, 20, 40, 80, 100});
  gravac_policy one(lay, {.cf_min = 50, .cf_max = 50});
  CHECK(one.candidates().size() == 1);
  gravac_policy quarter(lay, {.cf_min = 4, .cf_max = 64, .scale = 0.25});
  CHECK(std::vector<double>(quarter.candidates().begin(), quarter.candidates().end()) ==
        std::vector<double>{4, 16, 64});
}

TEST_CASE("gravac: the warm-up sends at CF_min whatever the gain, then the eps rule applies", "[policy][gravac]") {
  driver d(two_layers(), {.window = 4, .warmup_steps = 4, .period_steps = 3});
  for (int s = 0; s < 4; ++s) {
    INFO("warm-up step " << s);
    CHECK(d.pol.phase() == gravac_phase::warmup);
    CHECK(d.run({{10, 0.1}}, 1.0) == 10);              // gain far below eps = 0.7: still CF_min
    CHECK(d.pol.fallback() == fallback_reason::none);  // by design, not a fallback
    CHECK(d.asked() == std::vector<double>{10, 20});   // CF_min, and the next candidate
  }
  CHECK(d.pol.phase() == gravac_phase::searching);
  // Smoothed gain(CF_min) = 0.1 < eps and the candidate is CF_min: dense.
  CHECK(d.plan() == 1);
  CHECK(d.pol.fallback() == fallback_reason::minimum_gain_below_eps);
  CHECK(d.p.kept_fraction == std::vector<double>{1.0, 1.0});
}

TEST_CASE("gravac: the gain is an EWMA with alpha = 2 / (w + 1)", "[policy][gravac]") {
  driver d(two_layers(), {.window = 3, .warmup_steps = 10});  // alpha = 0.5
  d.run({{10, 1.0}}, 1);
  CHECK(d.pol.smoothed_gain_min() == 1.0);  // the first sample starts the average
  d.run({{10, 0.5}}, 1);
  CHECK(d.pol.smoothed_gain_min() == Approx(0.75));
  d.run({{10, 0.3}}, 1);
  CHECK(d.pol.smoothed_gain_min() == Approx(0.525));
  // A window of 1 follows the last sample exactly.
  driver e(two_layers(), {.window = 1, .warmup_steps = 10});
  e.run({{10, 0.9}}, 1);
  e.run({{10, 0.2}}, 1);
  CHECK(e.pol.smoothed_gain_min() == Approx(0.2));
}

TEST_CASE("gravac: send at c, else at CF_min, else dense; one gain request for both", "[policy][gravac]") {
  // Candidates 10, 20, 40; window 1 (the smoothed gain is the last one); periods of 2 steps.
  driver d(two_layers(), {.cf_max = 40, .window = 1, .warmup_steps = 1, .period_steps = 2});
  CHECK(d.run({{10, 0.9}}, 1.0) == 10);             // warm-up
  CHECK(d.run({{10, 0.9}}, 1.0) == 10);             // candidate 10: gain 0.9 >= 0.7
  CHECK(d.asked() == std::vector<double>{10, 20});  // the candidate (CF_min) and the next one
  CHECK(d.run({{10, 0.9}}, 1.0) == 10);             // end of period: CT(10) = 2 / 2 s * 0.9 = 0.9
  CHECK(d.pol.throughput_table()[0] == Approx(0.9));
  CHECK(d.pol.candidate_cf() == 20);  // advanced
  // First step at 20: gain(20) not measured yet, counts as below eps -> CF_min (0.9 >= eps).
  CHECK(d.run({{20, 0.8}, {10, 0.9}}, 0.5) == 10);
  CHECK(d.pol.fallback() == fallback_reason::candidate_gain_below_eps);
  CHECK(d.asked() == std::vector<double>{20, 10, 40});  // all gains from the same u
  CHECK(d.run({{20, 0.6}, {10, 0.65}}, 0.5) == 20);     // gain(20) = 0.8 >= eps
  CHECK(d.pol.fallback() == fallback_reason::none);
  // Only the step sent at 20 counts: CT(20) = 1 / 0.5 s * 0.6 = 1.2; the best two (1.2, 0.9)
  // differ by 25% > omega, CT rose, 20 < CF_max: advance to 40.
  CHECK(d.pol.throughput_table()[1] == Approx(1.2));
  CHECK(d.pol.candidate_cf() == 40);
  CHECK(d.pol.searching());
  // gain(40), measured alongside as 0 (absent from the script), and gain(10) = 0.65 < eps: dense.
  CHECK(d.run({{40, 0.75}, {10, 0.9}}, 0.5) == 1);
  CHECK(d.pol.fallback() == fallback_reason::minimum_gain_below_eps);
  // gain(40) = 0.75 >= eps: send at 40.
  CHECK(d.plan() == 40);
  CHECK(d.pol.fallback() == fallback_reason::none);
  CHECK(d.p.kept_fraction[0] == 1.0 / 40);
  CHECK(d.p.kept_fraction[1] == 1.0 / 40);  // 1-D tensors compressed unless one_dim_dense
  // CT(40) = 1 / 0.1 s * 0.5 = 5 (the dense step does not count; rising) and 40 is CF_max:
  // the search ends.
  // gain(40) = 0.5 is below eps but gain(10) is fine: CF_min.
  d.run({{40, 0.5}, {10, 0.9}}, 0.1);
  CHECK(d.pol.phase() == gravac_phase::monitoring);
  CHECK(d.pol.candidate_cf() == 40);
  CHECK(d.plan() == 10);
  CHECK(d.pol.fallback() == fallback_reason::candidate_gain_below_eps);
}

TEST_CASE("gravac: stop when the two best CTs are within omega, keeping the more aggressive", "[policy][gravac]") {
  // One-step periods, window 1; one sample per step so CT = gain / seconds. Each step also
  // measures the next candidate's gain, so a new candidate is sent from its first step.
  driver d(two_layers(), {.cf_max = 80, .window = 1, .warmup_steps = 1, .period_steps = 1});
  d.run({{10, 0.9}, {20, 0.8}}, 1.0);             // warm-up
  d.run({{10, 0.9}, {20, 0.8}}, 1.0);             // CT(10) = 0.9
  d.run({{20, 0.8}, {10, 0.9}, {40, 0.8}}, 0.5);  // CT(20) = 1.6: 44% above 0.9 -> advance
  CHECK(d.pol.candidate_cf() == 40);
  d.run({{40, 0.8}, {10, 0.9}}, 0.49);  // CT(40) = 1.6327: within 2% of 1.6 -> stop
  CHECK(d.pol.phase() == gravac_phase::monitoring);
  CHECK(d.pol.candidate_cf() == 40);
  CHECK(std::isnan(d.pol.throughput_table()[3]));  // 80 never evaluated
  CHECK(d.plan() == 40);                           // gain(40) = 0.8 >= eps

  // The omega rule comes first: CT fell slightly for 40 (1.58 < 1.6), but the two best are
  // within omega, so the more aggressive (40) is kept rather than the best (20).
  driver e(two_layers(), {.cf_max = 80, .window = 1, .warmup_steps = 1, .period_steps = 1});
  e.run({{10, 0.9}, {20, 0.8}}, 1.0);
  e.run({{10, 0.9}, {20, 0.8}}, 1.0);
  e.run({{20, 0.8}, {10, 0.9}, {40, 0.79}}, 0.5);
  e.run({{40, 0.79}, {10, 0.9}}, 0.5);  // CT(40) = 1.58
  CHECK(e.pol.phase() == gravac_phase::monitoring);
  CHECK(e.pol.candidate_cf() == 40);

  // A larger omega stops already at the first comparison when CTs are close.
  driver f(two_layers(), {.cf_max = 80, .window = 1, .warmup_steps = 1, .omega = 0.5, .period_steps = 1});
  f.run({{10, 0.9}, {20, 0.8}}, 1.0);
  f.run({{10, 0.9}, {20, 0.8}}, 1.0);  // CT(10) = 0.9
  f.run({{20, 0.8}, {10, 0.9}}, 0.5);  // CT(20) = 1.6: (1.6 - 0.9) / 1.6 = 44% < 50%
  CHECK(f.pol.phase() == gravac_phase::monitoring);
  CHECK(f.pol.candidate_cf() == 20);
}

TEST_CASE("gravac: stop when CT falls for the new candidate, keeping the best so far", "[policy][gravac]") {
  driver d(two_layers(), {.cf_max = 80, .window = 1, .warmup_steps = 1, .period_steps = 1});
  d.run({{10, 0.9}, {20, 0.8}}, 1.0);
  d.run({{10, 0.9}, {20, 0.8}}, 1.0);             // CT(10) = 0.9
  d.run({{20, 0.8}, {10, 0.9}, {40, 0.8}}, 0.5);  // CT(20) = 1.6
  d.run({{40, 0.8}, {10, 0.9}}, 0.8);             // CT(40) = 1.0: best two 1.6 / 1.0 (38% apart), CT fell
  CHECK(d.pol.phase() == gravac_phase::monitoring);
  CHECK(d.pol.candidate_cf() == 20);
  CHECK(d.pol.candidate_index() == 1);
  // The kept ratio's gain is measured afresh: first CF_min (gain 0.9), then 20.
  CHECK(d.plan() == 10);
  CHECK(d.asked() == std::vector<double>{20, 10});
  d.run({{20, 0.75}, {10, 0.9}}, 0.5);
  CHECK(d.plan() == 20);
  // Monitoring keeps applying the fallback rule, and never moves on.
  d.run({{20, 0.3}, {10, 0.5}}, 0.5);
  CHECK(d.plan() == 1);
  for (int s = 0; s < 10; ++s) d.run({{20, 0.9}, {10, 0.95}}, 0.01);
  CHECK(d.plan() == 20);
  CHECK(d.pol.candidate_cf() == 20);
}

TEST_CASE("gravac: the search stops at CF_max", "[policy][gravac]") {
  driver d(two_layers(), {.cf_max = 40, .window = 1, .warmup_steps = 1, .period_steps = 1});
  d.run({{10, 0.9}, {20, 0.8}}, 1.0);
  d.run({{10, 0.9}, {20, 0.8}}, 1.0);             // 0.9
  d.run({{20, 0.8}, {10, 0.9}, {40, 0.8}}, 0.5);  // 1.6
  CHECK(d.pol.searching());
  d.run({{40, 0.8}, {10, 0.9}}, 0.25);  // 3.2: rising, not close, but 40 is CF_max
  CHECK(d.pol.phase() == gravac_phase::monitoring);
  CHECK(d.pol.candidate_cf() == 40);
  CHECK(d.plan() == 40);
  // A single candidate (CF_min == CF_max) is evaluated once and kept.
  driver e(two_layers(), {.cf_min = 10, .cf_max = 10, .window = 1, .warmup_steps = 1, .period_steps = 2});
  for (int s = 0; s < 3; ++s) e.run({{10, 0.9}}, 1.0);
  CHECK(e.pol.phase() == gravac_phase::monitoring);
  CHECK(e.pol.candidate_cf() == 10);
  CHECK(e.pol.throughput_table()[0] == Approx(0.9));
}

TEST_CASE("gravac: an epoch is the default period and its samples give CT", "[policy][gravac]") {
  driver d(two_layers(), {.cf_max = 40, .window = 1, .warmup_steps = 2});
  d.run({{10, 0.9}}, 0.5);
  d.pol.on_interval({.step = 1, .epoch = 1, .learning_rate = 0.1, .samples = 100});  // during warm-up: no CT
  CHECK(std::isnan(d.pol.throughput_table()[0]));
  d.run({{10, 0.9}}, 0.5);  // warm-up ends
  for (int s = 0; s < 3; ++s) d.run({{10, 0.8}}, 0.5);
  CHECK(d.pol.period_steps_done() == 3);
  // 4 steps in this interval carried 400 samples: 100 per step; the period is the last 3.
  // CT(10) = 300 samples / 1.5 s * 0.8 = 160.
  d.pol.on_interval({.step = 5, .epoch = 2, .learning_rate = 0.1, .samples = 400});
  CHECK(d.pol.throughput_table()[0] == Approx(160));
  CHECK(d.pol.candidate_cf() == 20);

  // samples_per_step overrides the interval's count; periods in steps need no interval.
  driver e(two_layers(), {.cf_max = 40, .window = 1, .warmup_steps = 1, .period_steps = 2, .samples_per_step = 64});
  e.run({{10, 0.9}}, 1.0);
  e.run({{10, 0.8}}, 0.25);
  e.run({{10, 0.7}}, 0.25);  // both sent at 10 (smoothed gains 0.9, 0.8 >= eps): CT = 128 / 0.5 * 0.75 = 192
  CHECK(e.pol.throughput_table()[0] == Approx(192));
  e.pol.on_interval({.step = 3, .epoch = 1, .learning_rate = 0.1, .samples = 1e6});  // no effect on CT
  CHECK(e.pol.throughput_table()[0] == Approx(192));
  CHECK(e.pol.candidate_cf() == 20);
}

TEST_CASE("gravac: time sources", "[policy][gravac][time]") {
  step_report r;
  r.iteration_s = 1.0;
  r.compress_s = 0.1;
  r.communicate_s = 0.5;
  r.decompress_s = 0.05;
  r.modeled_communicate_s = 2.0;
  r.modeled_exposed_s = 2.0;  // a synchronous step: backward hides none of it
  CHECK(step_seconds(r, {time_source::measured}) == Approx(1.65));
  CHECK(step_seconds(r, {time_source::modeled}) == Approx(3.15));
  CHECK(step_seconds(r, {time_source::simulated, 0.25}) == Approx(2.4));  // with the measured codec time
  CHECK(step_seconds(r, {time_source::simulated, 0.25, false}) == Approx(2.25));
  CHECK(communication_seconds(r, {time_source::measured}) == Approx(0.5));
  CHECK(communication_seconds(r, {time_source::simulated}) == Approx(2.0));
  // Overlapped with backward, a step costs only what backward did not hide.
  r.modeled_exposed_s = 0.5;
  CHECK(step_seconds(r, {time_source::modeled}) == Approx(1.65));
  CHECK(step_seconds(r, {time_source::simulated, 0.25, false}) == Approx(0.75));
  CHECK(communication_seconds(r, {time_source::modeled}) == Approx(0.5));
  CHECK_THROWS_WITH(time_options({time_source::simulated, -1}).validate("x"), Catch::Contains("compute_s"));

  // The modeled clock drives CT: the measured communication is ignored. It has measured
  // parts (the caller's compute, the codec), so a step's time is read one step late, from
  // the ranks' average the trainer carries in the next step.
  gravac_policy pol(two_layers(),
                    {.cf_max = 20, .window = 1, .warmup_steps = 1, .period_steps = 1, .time = {time_source::modeled}});
  step_params p;
  p.kept_fraction.assign(2, 1.0);
  step_report s;
  s.communicate_s = 100;                              // ignored
  s.modeled_communicate_s = s.modeled_exposed_s = 2;  // used
  s.gain_curve = {0.8, 0.8};                          // CF 10, and the next candidate
  pol.plan(p);                                        // warm-up step
  pol.observe(s);
  pol.plan(p);  // the first step of the search, sent at CF 10
  s.previous_times_agreed = true;
  s.previous_times = {0.0, 100.0, 0.0, 0.0};
  pol.observe(s);
  CHECK(std::isnan(pol.throughput_table()[0]));  // its time is not known yet
  pol.plan(p);
  pol.observe(s);
  CHECK(pol.throughput_table()[0] == Approx(0.4));  // 1 sample / 2 s * 0.8
}

TEST_CASE("gravac: a measured clock is read one step late and judges the same periods", "[policy][gravac][time]") {
  // The same script on the shared clock and on the measured one: the measured clock's
  // periods close one step later, with the same CT values.
  const gravac_policy_options o{.cf_min = 10,
                                .cf_max = 40,
                                .window = 1,
                                .warmup_steps = 0,
                                .epsilon = 0.5,
                                .period_steps = 2,
                                .samples_per_step = 64};
  driver shared(two_layers(), o), late(two_layers(), o, false);
  const std::map<long, double> gains{{10, 0.9}, {20, 0.8}, {40, 0.6}};
  for (int s = 0; s < 2; ++s) {
    shared.run(gains, 0.5);
    late.run(gains, 0.5);
  }
  CHECK(shared.pol.throughput_table()[0] == Approx(64 / 0.5 * 0.9));
  CHECK(std::isnan(late.pol.throughput_table()[0]));  // the second step's time comes with the third
  shared.run(gains, 0.25);
  late.run(gains, 0.25);  // sent at CF 10 still: planned before the period was judged
  CHECK(late.pol.throughput_table()[0] == Approx(64 / 0.5 * 0.9));
  // The late policy's third step was sent at CF 10, not at the new candidate: it does not count
  // for CF 20, so its period needs two more steps sent at 20.
  for (int s = 0; s < 2; ++s) {
    shared.run(gains, 0.25);
    late.run(gains, 0.25);
  }
  CHECK(shared.pol.throughput_table()[1] == Approx(64 / 0.25 * 0.8));
  CHECK(std::isnan(late.pol.throughput_table()[1]));
  late.run(gains, 0.25);
  CHECK(late.pol.throughput_table()[1] == Approx(64 / 0.25 * 0.8));
}

TEST_CASE("gravac: 1-D tensors dense on request, the collective hint passes through", "[policy][gravac]") {
  driver d(two_layers(), {.one_dim_dense = true, .collective = collective_kind::allreduce_compatible});
  CHECK(d.plan() == 10);
  CHECK(d.p.kept_fraction == std::vector<double>{0.1, 1.0});
  CHECK(d.p.collective == collective_kind::allreduce_compatible);
}

TEST_CASE("gravac: skipped steps change nothing", "[policy][gravac]") {
  driver d(two_layers(), {.window = 1, .warmup_steps = 2});
  step_report r;
  r.skipped = true;
  r.gain_candidates = {0.1};
  r.gain_curve = {0.1};
  d.pol.observe(r);
  CHECK(d.pol.steps_observed() == 0);
  CHECK(std::isnan(d.pol.smoothed_gain_min()));
}

TEST_CASE("gravac: invalid options are rejected at construction", "[policy][gravac][errors]") {
  const auto lay = two_layers();
  using O = gravac_policy_options;
  CHECK_THROWS_WITH(gravac_policy(lay, O{.cf_min = 0.5}), Catch::Contains("cf_min"));
  CHECK_THROWS_WITH(gravac_policy(lay, O{.cf_min = NAN}), Catch::Contains("cf_min"));
  CHECK_THROWS_WITH(gravac_policy(lay, O{.cf_min = 100, .cf_max = 10}), Catch::Contains("cf_max"));
  CHECK_THROWS_WITH(gravac_policy(lay, O{.cf_max = INFINITY}), Catch::Contains("cf_max"));
  CHECK_THROWS_WITH(gravac_policy(lay, O{.scale = 1.0}), Catch::Contains("scale"));
  CHECK_THROWS_WITH(gravac_policy(lay, O{.scale = 0.0}), Catch::Contains("scale"));
  CHECK_THROWS_WITH(gravac_policy(lay, O{.window = 0}), Catch::Contains("window"));
  CHECK_THROWS_WITH(gravac_policy(lay, O{.epsilon = 1.5}), Catch::Contains("epsilon"));
  CHECK_THROWS_WITH(gravac_policy(lay, O{.epsilon = -0.1}), Catch::Contains("epsilon"));
  CHECK_THROWS_WITH(gravac_policy(lay, O{.omega = 1.0}), Catch::Contains("omega"));
  CHECK_THROWS_WITH(gravac_policy(lay, O{.samples_per_step = -1}), Catch::Contains("samples_per_step"));
  CHECK_THROWS_WITH(gravac_policy(lay, O{.time = {time_source::simulated, -2}}), Catch::Contains("compute_s"));
  CHECK_THROWS_WITH(gravac_policy(lay, O{.cf_min = 1, .cf_max = 1e300, .scale = 0.999}), Catch::Contains("candidates"));
  try {
    gravac_policy(lay, O{.omega = 2});
    FAIL("no exception");
  } catch (const gravac::error& e) {
    CHECK(e.code() == status::invalid_argument);
  }
}

TEST_CASE("gravac: save / load mid-search continues with the same decisions", "[policy][gravac][state]") {
  const auto lay = two_layers();
  const gravac_policy_options o{.cf_max = 160, .window = 3, .warmup_steps = 3, .period_steps = 4};
  // A scripted run whose gains and times vary from step to step.
  auto gains_at = [](int s) {
    const double g = 0.6 + 0.3 * std::sin(0.7 * s);
    return std::map<long, double>{{10, g + 0.05}, {20, g}, {40, g - 0.05}, {80, g - 0.1}, {160, g - 0.2}};
  };
  auto secs_at = [](int s) { return 0.3 + 0.1 * std::cos(1.3 * s); };
  driver full(lay, o);
  std::vector<double> expect;
  for (int s = 0; s < 40; ++s) expect.push_back(full.run(gains_at(s), secs_at(s)));

  for (int cut : {2, 5, 9, 17, 26}) {
    INFO("restored after step " << cut);
    driver first(lay, o);
    for (int s = 0; s < cut; ++s) first.run(gains_at(s), secs_at(s));
    std::vector<std::byte> bytes;
    first.pol.save(bytes);
    driver second(lay, o);
    second.pol.load(bytes);
    second.step = static_cast<std::uint64_t>(cut);
    for (int s = cut; s < 40; ++s) {
      INFO("step " << s);
      CHECK(second.run(gains_at(s), secs_at(s)) == expect[s]);
    }
    std::vector<std::byte> again;
    second.pol.save(again);
    std::vector<std::byte> ref;
    full.pol.save(ref);
    CHECK(again == ref);
  }
  // The scripted run did search and settle (otherwise this test would prove little).
  CHECK(full.pol.phase() == gravac_phase::monitoring);
}

TEST_CASE("gravac: load rejects foreign, mismatched or truncated state", "[policy][gravac][state][errors]") {
  const auto lay = two_layers();
  driver d(lay, {.window = 1, .warmup_steps = 1, .period_steps = 1});
  d.run({{10, 0.9}}, 1.0);
  d.run({{10, 0.9}}, 1.0);
  std::vector<std::byte> good;
  d.pol.save(good);
  gravac_policy other(lay, on_shared_clock({.window = 1, .warmup_steps = 1, .period_steps = 1}));
  const double before = other.current_cf();
  SECTION("truncated") {
    good.pop_back();
    CHECK_THROWS_WITH(other.load(good), Catch::Contains("truncated"));
  }
  SECTION("trailing bytes") {
    good.push_back(std::byte{0});
    CHECK_THROWS_WITH(other.load(good), Catch::Contains("trailing"));
  }
  SECTION("other options") {
    gravac_policy eps(lay, {.window = 1, .warmup_steps = 1, .epsilon = 0.5, .period_steps = 1});
    CHECK_THROWS_WITH(eps.load(good), Catch::Contains("other options"));
  }
  SECTION("another policy") {
    accordion_policy acc(lay);
    std::vector<std::byte> theirs;
    acc.save(theirs);
    CHECK_THROWS_WITH(other.load(theirs), Catch::Contains("another policy"));
  }
  SECTION("corrupt phase") {
    good[16] = std::byte{7};  // after tag, version and fingerprint
    CHECK_THROWS_WITH(other.load(good), Catch::Contains("phase"));
  }
  CHECK(other.current_cf() == before);  // a failed load changes nothing
  CHECK(other.steps_observed() == 0);
}

// --- dense among the choices (options::dense_candidate) ------------------------------------
// The scripts below run on the shared clock with 1 s of compute per step: run(gains, c)
// is a step whose communication took c seconds, so it lasted 1 + c seconds.
namespace {

gravac_policy_options with_dense(gravac_policy_options o) {
  o.dense_candidate = true;
  o.dense_probe_steps = 4;  // the first is not timed
  o.window = 1;             // the smoothed values are the last ones
  o.samples_per_step = 1;
  o.time = {time_source::simulated, 1.0, false};
  return o;
}

// The dense probe (4 steps), then the warm-up at CF 10 (3 steps) with gain 0.9 and CF 10's
// communication taking \p c10 seconds, dense's \p dense.
void probe_and_warm_up(driver& d, double dense, double c10) {
  for (int s = 0; s < 4; ++s) {
    CHECK(d.pol.phase() == gravac_phase::dense_probe);
    CHECK(d.run({}, dense) == 1);
    CHECK(d.asked().empty());  // no gain asked for: dense runs without the compressor
    CHECK(d.pol.fallback() == fallback_reason::none);
  }
  for (int s = 0; s < 3; ++s) {
    CHECK(d.pol.phase() == gravac_phase::warmup);
    CHECK(d.run({{10, 0.9}, {20, 0.8}}, c10) == 10);
  }
}

}  // namespace

TEST_CASE("gravac + dense: dense that beats a ratio even without its communication wins once timed afresh",
          "[policy][gravac][dense]") {
  driver d(two_layers(), with_dense({.cf_max = 40, .warmup_steps = 3, .period_steps = 10}));
  // Dense: 1.1 s a step (rate 1 / 1.1 = 0.909). CF 10 at gain 0.9 without its 0.01 s of
  // communication: 0.9 / 1.0 = 0.9 <= 0.909, and no larger ratio can do better. Dense's
  // timing is from before the warm-up, so CF 10 and dense are timed afresh first.
  probe_and_warm_up(d, 0.1, 0.01);
  CHECK(d.pol.phase() == gravac_phase::monitoring);
  CHECK_FALSE(d.pol.dense_kept());
  CHECK(d.pol.rechecks() == 1);
  CHECK(d.pol.dense_throughput() == Approx(1 / 1.1));
  for (int s = 0; s < 4; ++s) CHECK(d.run({{10, 0.9}, {20, 0.8}}, 0.01) == 10);  // CF 10 afresh
  for (int s = 0; s < 4; ++s) CHECK(d.run({}, 0.1) == 1);                        // dense afresh
  CHECK(d.pol.dense_kept());  // 0.909 >= 0.891: no hysteresis when confirming the search
  CHECK(d.pol.switches() == 1);
  for (int s = 0; s < 20; ++s) CHECK(d.run({}, 0.1) == 1);  // a steady network: dense, no probe
  CHECK(d.asked().empty());
  CHECK(d.pol.rechecks() == 1);
}

TEST_CASE("gravac + dense: a dense probe timed on a fast network does not decide on a slow one",
          "[policy][gravac][dense]") {
  driver d(two_layers(), with_dense({.cf_max = 40, .warmup_steps = 3, .period_steps = 10}));
  // The dense probe sees 0.1 s of communication; then the network slows 10x, so that CF 10
  // takes 0.1 s too during the warm-up: dense "dominates" on the stale timing (0.909 >= 0.9).
  for (int s = 0; s < 4; ++s) CHECK(d.run({}, 0.1) == 1);
  for (int s = 0; s < 3; ++s) CHECK(d.run({{10, 0.9}, {20, 0.8}}, 0.1) == 10);
  REQUIRE(d.pol.rechecks() == 1);
  // Timed afresh on the slow network: CF 10 0.9 / 1.1 = 0.818, dense 1 / 2 = 0.5. CF 10 stays.
  for (int s = 0; s < 4; ++s) CHECK(d.run({{10, 0.9}, {20, 0.8}}, 0.1) == 10);
  for (int s = 0; s < 4; ++s) CHECK(d.run({}, 1.0) == 1);
  CHECK_FALSE(d.pol.dense_kept());
  CHECK(d.pol.switches() == 0);
  for (int s = 0; s < 20; ++s) CHECK(d.run({{10, 0.9}, {20, 0.8}}, 0.1) == 10);
  CHECK(d.pol.rechecks() == 1);
}

TEST_CASE("gravac + dense: on a slow network the search runs and keeps a ratio", "[policy][gravac][dense]") {
  driver d(two_layers(), with_dense({.cf_max = 20, .warmup_steps = 3, .period_steps = 10}));
  probe_and_warm_up(d, 10, 1);  // dense 11 s a step; CF 10 at most 0.9 / 1 s: not dominated
  CHECK(d.pol.phase() == gravac_phase::searching);
  for (int s = 0; s < 10; ++s) CHECK(d.run({{10, 0.9}, {20, 0.8}}, 1) == 10);  // CT(10) = 0.9 / 2 s
  CHECK(d.pol.throughput_table()[0] == Approx(0.45));
  CHECK(d.pol.dense_throughput() == Approx(1 / 11.0));
  for (int s = 0; s < 10; ++s) CHECK(d.run({{20, 0.8}, {10, 0.9}}, 0.5) == 20);  // CT(20) = 0.8 / 1.5 s
  CHECK(d.pol.phase() == gravac_phase::monitoring);
  CHECK_FALSE(d.pol.dense_kept());
  CHECK(d.pol.candidate_cf() == 20);
  CHECK(d.plan() == 20);
}

TEST_CASE("gravac + dense: the search ends on dense when dense's CT beats the best ratio's",
          "[policy][gravac][dense]") {
  driver d(two_layers(), with_dense({.cf_max = 20, .warmup_steps = 3, .period_steps = 10}));
  // Dense 1.2 s (0.833); CF 10 without communication 0.9 / 1 s: not dominated.
  probe_and_warm_up(d, 0.2, 0.15);
  for (int s = 0; s < 10; ++s) d.run({{10, 0.9}, {20, 0.8}}, 0.15);  // CT(10) = 0.9 / 1.15 = 0.783
  CHECK(d.pol.searching());
  // CT(20) = 0.8 / 1.1 = 0.727; even without its communication CF 20 (0.8) cannot beat dense.
  for (int s = 0; s < 10; ++s) d.run({{20, 0.8}, {10, 0.9}}, 0.1);
  CHECK(d.pol.phase() == gravac_phase::monitoring);
  CHECK(d.pol.candidate_cf() == 10);  // the best ratio, kept for a later probe
  CHECK_FALSE(d.pol.dense_kept());    // 0.833 >= 0.783 on the search's timings: confirmed afresh
  CHECK(d.plan() == 10);
  for (int s = 0; s < 4; ++s) CHECK(d.run({{10, 0.9}, {20, 0.8}}, 0.15) == 10);
  for (int s = 0; s < 4; ++s) CHECK(d.run({}, 0.2) == 1);
  CHECK(d.pol.dense_kept());
  CHECK(d.plan() == 1);
}

TEST_CASE("gravac + dense: a network that slows or speeds up is followed from the last paired timing",
          "[policy][gravac][dense]") {
  driver d(two_layers(), with_dense({.cf_max = 40, .warmup_steps = 3, .period_steps = 10}));
  probe_and_warm_up(d, 0.1, 0.01);
  for (int s = 0; s < 4; ++s) d.run({{10, 0.9}, {20, 0.8}}, 0.01);
  for (int s = 0; s < 4; ++s) d.run({}, 0.1);
  REQUIRE(d.pol.dense_kept());
  REQUIRE(d.pol.rechecks() == 1);
  // The pair: dense 0.1 s of communication, CF 10 0.01 s (gain 0.9). The network slows 100x:
  // CF 10 is predicted at 0.9 / (1 + 1) = 0.45 against dense's 1 / 11: dense is timed afresh
  // for 4 steps, then CF 10 for 4, whatever its gain.
  CHECK(d.run({}, 10) == 1);
  CHECK(d.pol.rechecks() == 2);
  for (int s = 0; s < 4; ++s) CHECK(d.run({}, 10) == 1);
  for (int s = 0; s < 4; ++s) {
    CHECK(d.run({{10, 0.9}, {20, 0.8}}, 1) == 10);
    CHECK_FALSE(d.asked().empty());
  }
  CHECK_FALSE(d.pol.dense_kept());
  CHECK(d.pol.switches() == 2);
  CHECK(d.plan() == 10);
  for (int s = 0; s < 30; ++s) CHECK(d.run({{10, 0.9}, {20, 0.8}}, 1) == 10);  // steady: no probe
  CHECK(d.pol.rechecks() == 2);
  // The network gets 100x faster: dense is predicted at 1 / 1.1 = 0.909 against CF 10's
  // 0.9 / 1.01 = 0.891, 2% better, within the margin (omega times 1 + sqrt(window / steps
  // watched)): no probe.
  for (int s = 0; s < 10; ++s) CHECK(d.run({{10, 0.9}, {20, 0.8}}, 0.01) == 10);
  CHECK(d.pol.rechecks() == 2);
  // 1000x faster: dense predicted at 1 / 1.01 = 0.990 against 0.9 / 1.001 = 0.899, 10% better:
  // probed (CF 10 afresh, then dense) and switched.
  CHECK(d.run({{10, 0.9}, {20, 0.8}}, 0.001) == 10);
  CHECK(d.pol.rechecks() == 3);
  for (int s = 0; s < 4; ++s) CHECK(d.run({{10, 0.9}, {20, 0.8}}, 0.001) == 10);
  for (int s = 0; s < 4; ++s) CHECK(d.run({}, 0.01) == 1);
  CHECK(d.pol.dense_kept());
  CHECK(d.pol.switches() == 3);
  CHECK(d.plan() == 1);
}

TEST_CASE(
    "gravac + dense: a network that changes faster than the window is followed on average, without "
    "oscillating",
    "[policy][gravac][dense]") {
  auto o = with_dense({.cf_max = 40, .warmup_steps = 3, .period_steps = 10});
  o.window = 8;
  driver d(two_layers(), o);
  probe_and_warm_up(d, 0.1, 0.01);
  for (int s = 0; s < 4; ++s) d.run({{10, 0.9}, {20, 0.8}}, 0.01);
  for (int s = 0; s < 4; ++s) d.run({}, 0.1);
  REQUIRE(d.pol.dense_kept());
  // The network alternates every 3 steps between dense at 0.1 s and at 0.3 s (CF 10 at a
  // tenth), faster than the window of 8: on average dense takes 1.2 s (0.833) and CF 10
  // 1.02 s (0.882), within 3 omega. The probes find the two close, each doubles the wait
  // before the next (8, 16, 32, 64, 128 steps), and nothing switches back and forth.
  const auto comm = [](int s, double cf) { return (s / 3 % 2 == 0 ? 0.1 : 0.3) / cf; };
  std::vector<std::uint64_t> probes_by_step;
  for (int s = 0; s < 300; ++s) {
    const double cf = d.plan();
    d.run({{10, 0.9}, {20, 0.8}}, comm(s, cf));
    probes_by_step.push_back(d.pol.rechecks());
  }
  CHECK(d.pol.switches() == 1);  // the confirmation of dense only
  CHECK(d.pol.rechecks() <= 5);
  CHECK(probes_by_step[299] - probes_by_step[169] <= 1);  // the last 130 steps: one probe at most
  // Then the network settles 30x slower: CF 10 must be found and kept.
  for (int s = 0; s < 60; ++s) {
    const double cf = d.plan();
    d.run({{10, 0.9}, {20, 0.8}}, 3.0 / cf);
  }
  CHECK_FALSE(d.pol.dense_kept());
  CHECK(d.plan() == 10);
}

TEST_CASE("gravac + dense: save / load in every phase continues with the same decisions",
          "[policy][gravac][dense][state]") {
  const auto lay = two_layers();
  const auto o = with_dense({.cf_max = 40, .warmup_steps = 3, .period_steps = 5});
  // Dense is cheap for 40 steps, then costly for 40, then cheap again.
  const auto comm_at = [](int s, double cf) {
    const double dense = s < 40 || s >= 80 ? 0.1 : 10.0;
    return cf <= 1 ? dense : dense / cf;
  };
  const std::map<long, double> gains{{10, 0.9}, {20, 0.8}, {40, 0.75}};
  const auto run = [&](driver& d, int s) {
    const double cf = d.plan();
    return d.run(gains, comm_at(s, cf));
  };
  driver full(lay, o);
  std::vector<double> expect;
  for (int s = 0; s < 120; ++s) expect.push_back(run(full, s));
  CHECK(full.pol.rechecks() >= 2);  // the script probed both ways
  for (int cut : {2, 5, 8, 41, 43, 45, 83, 85}) {
    INFO("restored after step " << cut);
    driver first(lay, o);
    for (int s = 0; s < cut; ++s) run(first, s);
    std::vector<std::byte> bytes;
    first.pol.save(bytes);
    driver second(lay, o);
    second.pol.load(bytes);
    second.step = static_cast<std::uint64_t>(cut);
    second.last_seconds = first.last_seconds;
    for (int s = cut; s < 120; ++s) {
      INFO("step " << s);
      CHECK(run(second, s) == expect[static_cast<std::size_t>(s)]);
    }
  }
}

TEST_CASE("gravac + dense: invalid options are rejected", "[policy][gravac][dense][errors]") {
  const auto lay = two_layers();
  using O = gravac_policy_options;
  CHECK_THROWS_WITH(gravac_policy(lay, O{.dense_candidate = true, .dense_probe_steps = 1}),
                    Catch::Contains("dense_probe_steps"));
  CHECK_THROWS_WITH(gravac_policy(lay, O{.recheck_drift = 0}), Catch::Contains("recheck_drift"));
  CHECK_THROWS_WITH(gravac_policy(lay, O{.recheck_drift = NAN}), Catch::Contains("recheck_drift"));
}
