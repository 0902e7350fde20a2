// Policy state declared once (issue 45): the checkpoint bytes of each policy are pinned
// (golden size and FNV-1a of save() for scripted states, recorded before the field lists
// replaced the hand-written save/load; gravac's re-recorded for its state version 4, which
// appends the dense watch's timing anchor), load round-trips them, and a field appended to a
// field list is saved and restored with no other change.
#include <catch2/catch.hpp>
#include <map>

#include "gravac/core/detail/fnv1a.hpp"
#include "gravac/policy/accordion_policy.hpp"
#include "gravac/policy/adacomp_policy.hpp"
#include "gravac/policy/detail/persistent_fields.hpp"
#include "gravac/policy/gravac_policy.hpp"
#include "gravac/policy/moo_policy.hpp"
#include "gravac_test_util.hpp"
#include "policy_test_util.hpp"

using namespace gravac;

namespace {

// Size and FNV-1a of one saved state.
struct golden {
  std::size_t size;
  std::uint64_t hash;
};

golden digest(const std::vector<std::byte>& b) { return {b.size(), detail::fnv1a(b.data(), b.size())}; }

// The scripts use dyadic values (and window 3: alpha 1/2), so that every sum and EWMA is exact
// and the bytes do not depend on the compiler's floating-point contraction.
layout golden_layout() {
  layout l;
  l.add("w", {4, 4}, layer_kind::dense);
  l.add("w.bias", {4}, layer_kind::bias_or_norm);
  l.add("v", {2, 2}, layer_kind::conv);
  return l;
}

// Runs gravac_policy the way the trainer does (plan, then a report answering the plan's gain
// request), saving after the steps in `cuts`.
std::vector<std::vector<std::byte>> gravac_states(const gravac_policy_options& o, bool dense_script,
                                                  const std::vector<int>& cuts) {
  const auto lay = golden_layout();
  gravac_policy pol(lay, o);
  const std::map<long, double> gains{{10, 0.875}, {20, 0.75}, {40, 0.625}, {80, 0.5}, {160, 0.25}};
  std::vector<std::vector<std::byte>> out;
  double last = -1;
  for (int s = 0, c = 0; c < static_cast<int>(cuts.size()); ++s) {
    step_params p;
    p.step = static_cast<std::uint64_t>(s);
    pol.plan(p);
    step_report r;
    r.step = p.step;
    r.gain_candidates.assign(p.gain_candidates.begin(), p.gain_candidates.end());
    for (double f : p.gain_candidates) {
      auto it = gains.find(std::lround(1.0 / f));
      r.gain_curve.push_back(it == gains.end() ? 0.0 : it->second);
    }
    double secs = s % 2 ? 0.5 : 0.25;
    if (dense_script) {  // dense cheap, then costly, then cheap again (probes both ways)
      const double dense = s < 40 || s >= 80 ? 0.125 : 8.0;
      secs = p.global_fraction >= 1 ? dense : dense / 8;
    }
    r.iteration_s = secs;
    r.modeled_communicate_s = r.modeled_exposed_s = secs;
    r.previous_times_agreed = last >= 0;
    r.previous_times.iteration_s = last;
    last = secs;
    pol.observe(r);
    if (s % 6 == 5) pol.on_interval({.step = p.step, .epoch = 0, .learning_rate = 0.1, .samples = 64});
    if (s + 1 == cuts[static_cast<std::size_t>(c)]) {
      out.emplace_back();
      pol.save(out.back());
      ++c;
    }
  }
  return out;
}

std::vector<std::byte> adacomp_state(int steps) {
  const auto lay = golden_layout();
  adacomp_policy p(lay);
  for (int s = 0; s < steps; ++s) {
    step_report r;
    r.kept_fraction = {0.015625 * (s % 3 + 1), 1.0, 0.03125 / (s % 2 + 1)};
    p.observe(r);
  }
  std::vector<std::byte> out;
  p.save(out);
  return out;
}

// Accordion on gradients whose layer norms are exact: 4 x 4 and 2 x 2 layers filled with one
// dyadic value have norm 4 |v| and 2 |v|. Returns save() and save_local().
std::pair<std::vector<std::byte>, std::vector<std::byte>> accordion_state(int steps) {
  const auto lay = golden_layout();
  accordion_policy p(lay, {.interval_steps = 3, .compare_every = 2});
  for (int s = 0; s < steps; ++s) {
    const float a = s % 4 < 2 ? 0.5f : 0.25f;
    std::vector<float> g(lay.numel(), 0.125f);
    for (std::size_t j = 0; j < lay[0].numel; ++j) g[lay[0].offset + j] = a;
    test::single_rank_step(p, g);
    if (s % 5 == 4) p.on_interval({.step = 0, .epoch = 0, .learning_rate = s < 12 ? 0.1 : 0.01, .samples = 0});
  }
  std::pair<std::vector<std::byte>, std::vector<std::byte>> out;
  p.save(out.first);
  p.save_local(out.second);
  return out;
}

// moo_policy in its warm-up (gain smoothing 1/2: exact), then after its first decision (whose
// fraction comes from logarithms: only round-tripped, not pinned).
moo_policy_options moo_options() {
  moo_policy_options o;
  o.warmup_steps = 6;
  o.gain_smoothing = 0.5;
  o.source = network_source::fixed;
  o.network = network_params::from_gbps(1e-4, 1);
  return o;
}
std::vector<std::byte> moo_state(int steps) {
  const auto lay = golden_layout();
  moo_policy p(lay, moo_options());
  step_params sp = test::params_for(lay, 1.0);
  sp.ranks = 4;
  for (int s = 0; s < steps; ++s) {
    sp.step = static_cast<std::uint64_t>(s);
    p.plan(sp);
    step_report r;
    r.step = sp.step;
    r.gain_candidates = moo_options().candidates;
    r.gain_curve = {0.875, 0.75, 0.625 - 0.125 * (s % 2), 0.5, 0.25};
    r.collective = collective_kind::allgather;
    r.statistics_synchronized = true;
    p.observe(r);
    if (s % 3 == 2) p.on_interval({.step = sp.step, .epoch = 0, .learning_rate = 0.1, .samples = 0});
  }
  std::vector<std::byte> out;
  p.save(out);
  return out;
}

void check_golden(const std::vector<std::byte>& bytes, const golden& want) {
  const auto got = digest(bytes);
  INFO("bytes now: {" << got.size << ", 0x" << std::hex << got.hash << "ull}");
  CHECK(got.size == want.size);
  CHECK(got.hash == want.hash);
}

// Each state after its step has its golden size and hash, and loads and saves back to itself.
void check_gravac_states(const gravac_policy_options& o, const std::vector<int>& cuts,
                         const std::vector<std::vector<std::byte>>& states, const std::vector<golden>& want) {
  REQUIRE(states.size() == want.size());
  for (std::size_t i = 0; i < states.size(); ++i) {
    INFO("after step " << cuts[i]);
    check_golden(states[i], want[i]);
    gravac_policy q(golden_layout(), o);
    q.load(states[i]);
    std::vector<std::byte> again;
    q.save(again);
    CHECK(again == states[i]);
  }
}

}  // namespace

TEST_CASE("policy state: the checkpoint bytes are those of the hand-written save()", "[policy][state][golden]") {
  const auto lay = golden_layout();
  SECTION("gravac on a shared clock") {
    const gravac_policy_options o{
        .cf_max = 160, .window = 3, .warmup_steps = 3, .period_steps = 4, .time = {time_source::simulated, 0.0, false}};
    const std::vector<int> cuts{2, 5, 9, 17, 30};
    const std::vector<golden> want{{541, 0x9c238d56b7b5eaebull},
                                   {541, 0x1b33dd46d8cf958dull},
                                   {541, 0xcb7359e3ebb63388ull},
                                   {541, 0x331fe18250b7d5b0ull},
                                   {541, 0x831419bd52bb6536ull}};
    const auto states = gravac_states(o, false, cuts);
    check_gravac_states(o, cuts, states, want);
  }
  SECTION("gravac on a measured clock (a step read one step late, periods by interval)") {
    const gravac_policy_options o{.cf_max = 160, .window = 3, .warmup_steps = 3};
    const std::vector<int> cuts{1, 6, 13, 25};
    const std::vector<golden> want{{541, 0x5206513f0e271658ull},
                                   {541, 0x714dc2822615ccull},
                                   {541, 0x806687529e65826aull},
                                   {541, 0x570f3024944fa18dull}};
    const auto states = gravac_states(o, false, cuts);
    check_gravac_states(o, cuts, states, want);
  }
  SECTION("gravac with dense among the choices") {
    const gravac_policy_options o{.cf_max = 40,
                                  .window = 1,
                                  .warmup_steps = 3,
                                  .period_steps = 5,
                                  .samples_per_step = 1,
                                  .time = {time_source::simulated, 1.0, false},
                                  .dense_candidate = true,
                                  .dense_probe_steps = 4};
    const std::vector<int> cuts{2, 5, 8, 41, 43, 45, 83, 85, 120};
    const std::vector<golden> want{
        {525, 0x5fa27654b8f3fefcull}, {525, 0x570bd6c31415c3fbull}, {525, 0xacbe313b7c7e7168ull},
        {525, 0xa169811426a86baaull}, {525, 0xa1934c19e833f63cull}, {525, 0xba2458b22976a440ull},
        {525, 0x7bff9f8927edc26aull}, {525, 0x4cb128c076b102ceull}, {525, 0x616e0a3b2692bb79ull}};
    const auto states = gravac_states(o, true, cuts);
    check_gravac_states(o, cuts, states, want);
  }
  SECTION("adacomp") {
    const std::vector<golden> want{{104, 0x52b8ca851725bdb7ull}, {104, 0x0f5eeb1e983443d1ull}};
    for (int steps : {0, 5}) {
      const auto bytes = adacomp_state(steps);
      check_golden(bytes, want[steps ? 1 : 0]);
      adacomp_policy q(lay);
      q.load(bytes);
      std::vector<std::byte> again;
      q.save(again);
      CHECK(again == bytes);
    }
  }
  SECTION("moo") {
    const std::vector<golden> want{{160, 0xd2d1fb629e50f287ull}, {160, 0xae644ac0ac4bb014ull}};
    const std::vector<int> steps{0, 5, 9};
    for (std::size_t i = 0; i < steps.size(); ++i) {
      INFO("after step " << steps[i]);
      const auto bytes = moo_state(steps[i]);
      if (i < want.size()) check_golden(bytes, want[i]);
      moo_policy q(lay, moo_options());
      q.load(bytes);
      CHECK(q.decided() == (steps[i] > 6));
      std::vector<std::byte> again{std::byte{1}};  // save() replaces what the vector held
      q.save(again);
      CHECK(again == bytes);
    }
  }
  SECTION("accordion") {
    const std::vector<golden> want{{134, 0x71fdd79999d07badull}, {105, 0x8f21334629ff3cb9ull},
                                   {134, 0xc81f18dc0bf7b078ull}, {105, 0x57496ca0cf588139ull},
                                   {134, 0x9e77810ec415687bull}, {105, 0x2d4949643efed139ull}};
    const std::vector<int> steps{0, 11, 22};
    for (std::size_t i = 0; i < steps.size(); ++i) {
      INFO("after step " << steps[i]);
      const auto [shared, local] = accordion_state(steps[i]);
      check_golden(shared, want[2 * i]);
      check_golden(local, want[2 * i + 1]);
      accordion_policy q(lay, {.interval_steps = 3, .compare_every = 2});
      q.load(shared);
      q.load_local(local);
      std::vector<std::byte> again, again_local;
      q.save(again);
      q.save_local(again_local);
      CHECK(again == shared);
      CHECK(again_local == local);
    }
  }
}

// --- the mechanism: a policy-like struct whose state is a field list --------------------------
namespace {

// A test-only state with \p Extra one field more than the base list. save() and load() are
// written once, for both: the list alone decides what is stored.
template <bool Extra>
struct toy {
  struct inner {
    double x = 0;
    std::uint32_t n = 0;
    using persistent_fields = detail::field_list<detail::field<&inner::x>, detail::field<&inner::n>>;
    void check_loaded(const detail::state_reader& r) const {
      if (n > 100) r.fail("inner count out of range");
    }
  };
  std::uint64_t steps = 0;
  double value = 0;
  std::size_t index = 0;
  bool on = false, ready = false, more = false;
  std::vector<double> per_layer = std::vector<double>(3, 0.0);
  inner nested;
  enum class mode : std::uint8_t { a, b } m = mode::a;
  double appended = 0;  // in the list only when Extra

  using base = detail::field_list<
      detail::field<&toy::steps>, detail::field<&toy::value>, detail::field<&toy::index>,
      detail::packed_flags<std::uint8_t, detail::path<&toy::on>, detail::path<&toy::ready>, detail::path<&toy::more>>,
      detail::field<&toy::per_layer>, detail::field<&toy::nested>, detail::field<&toy::nested, &inner::x>,
      detail::field<&toy::m>>;
  using extended = detail::field_list<
      detail::field<&toy::steps>, detail::field<&toy::value>, detail::field<&toy::index>,
      detail::packed_flags<std::uint8_t, detail::path<&toy::on>, detail::path<&toy::ready>, detail::path<&toy::more>>,
      detail::field<&toy::per_layer>, detail::field<&toy::nested>, detail::field<&toy::nested, &inner::x>,
      detail::field<&toy::m>, detail::field<&toy::appended>>;
  using persistent_fields = std::conditional_t<Extra, extended, base>;

  void save(std::vector<std::byte>& out) const {
    detail::state_writer w(out);
    w.header(0x594f54, 1, 0);
    detail::save_fields<persistent_fields>(w, *this);
  }
  void load(std::span<const std::byte> in) {
    detail::state_reader r(in, "toy");
    r.header(0x594f54, 1, 0);
    detail::load_fields<persistent_fields>(r, *this, [&](const auto& s) {
      if (s.template get<&toy::m>() > mode::b) r.fail("unknown mode");
    });
  }
  bool operator==(const toy& o) const {
    return steps == o.steps && value == o.value && index == o.index && on == o.on && ready == o.ready &&
           more == o.more && per_layer == o.per_layer && nested.x == o.nested.x && nested.n == o.nested.n && m == o.m &&
           appended == o.appended;
  }
};

template <bool Extra>
toy<Extra> scripted_toy() {
  toy<Extra> t;
  t.steps = 17;
  t.value = 0.375;
  t.index = 4;
  t.on = true;
  t.more = true;
  t.per_layer = {1.5, -2.0, 0.25};
  t.nested = {2.5, 9};
  t.m = toy<Extra>::mode::b;
  t.appended = Extra ? 6.75 : 0.0;
  return t;
}

}  // namespace

TEST_CASE("persistent fields: the list alone decides the bytes, in order", "[policy][state][fields]") {
  const auto t = scripted_toy<false>();
  std::vector<std::byte> bytes;
  t.save(bytes);
  // Header 16, u64 8, double 8, size_t as u64 8, packed flags 1, vector 8 + 24, nested 8 + 4,
  // nested.x again 8, enum 1.
  CHECK(bytes.size() == 16 + 8 + 8 + 8 + 1 + 32 + 12 + 8 + 1);
  CHECK(bytes[16 + 24] == std::byte{0b101});  // on (bit 0) and more (bit 2)
  toy<false> u;
  u.load(bytes);
  CHECK(u == t);
}

TEST_CASE("persistent fields: appending a field to the list is all it takes", "[policy][state][fields]") {
  const auto base = scripted_toy<false>();
  const auto more = scripted_toy<true>();
  std::vector<std::byte> base_bytes, more_bytes;
  base.save(base_bytes);
  more.save(more_bytes);
  // The same bytes, then the appended field's.
  REQUIRE(more_bytes.size() == base_bytes.size() + sizeof(double));
  CHECK(std::equal(base_bytes.begin(), base_bytes.end(), more_bytes.begin()));
  toy<true> u;
  u.load(more_bytes);
  CHECK(u == more);
  CHECK(u.appended == 6.75);
  // The lists differ, so each refuses the other's bytes.
  toy<false> v;
  CHECK_THROWS_WITH(v.load(more_bytes), Catch::Contains("trailing"));
  CHECK_THROWS_WITH(u.load(base_bytes), Catch::Contains("truncated"));
}

TEST_CASE("persistent fields: a refused load changes nothing", "[policy][state][fields][errors]") {
  const auto t = scripted_toy<false>();
  std::vector<std::byte> good;
  t.save(good);
  toy<false> u;
  u.steps = 3;
  u.per_layer = {7.0, 8.0, 9.0};
  const auto before = u;
  const std::size_t flags_at = 16 + 24, vector_at = flags_at + 1, inner_n_at = vector_at + 32 + 8,
                    mode_at = good.size() - 1;
  auto bad = good;
  bad[flags_at] = std::byte{0b1000};  // a bit no flag owns
  CHECK_THROWS_WITH(u.load(bad), Catch::Contains("unknown flags"));
  bad = good;
  bad[vector_at] = std::byte{4};  // four values where the owner holds three
  CHECK_THROWS_WITH(u.load(bad), Catch::Contains("4 entries where 3"));
  bad = good;
  bad[inner_n_at] = std::byte{200};  // the nested struct's own check
  CHECK_THROWS_WITH(u.load(bad), Catch::Contains("inner count"));
  bad = good;
  bad[mode_at] = std::byte{5};  // the owner's check, after every field was read
  CHECK_THROWS_WITH(u.load(bad), Catch::Contains("unknown mode"));
  bad = good;
  bad.pop_back();
  CHECK_THROWS_WITH(u.load(bad), Catch::Contains("truncated"));
  CHECK(u == before);
  u.load(good);
  CHECK(u == t);
}

TEST_CASE("persistent fields: a corrupt bool is refused, in every policy's list", "[policy][state][fields][errors]") {
  const auto lay = golden_layout();
  const gravac_policy_options o{.window = 3, .warmup_steps = 3, .time = {time_source::simulated, 0.0, false}};
  gravac_policy p(lay, o);
  std::vector<std::byte> bytes;
  p.save(bytes);
  // gain_c_.ready follows the header, phase (1), observed, interval steps, candidate (3 x 8) and
  // gain_c_.value (8).
  auto bad = bytes;
  bad[16 + 1 + 24 + 8] = std::byte{2};
  CHECK_THROWS_WITH(p.load(bad), Catch::Contains("corrupt flag"));
  p.load(bytes);
}
