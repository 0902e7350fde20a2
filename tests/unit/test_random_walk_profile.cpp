// random_walk_trace / random_walk_profile: the reproduction's changing networks. Bounds,
// holds and the size of each move are checked on many seeds; a seed gives one trace (and a
// CSV that replays it exactly), other seeds other traces; bad options are refused.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <set>

#include "gravac/core/error.hpp"
#include "gravac/network/random_walk_profile.hpp"

using gravac::network_phase;
using gravac::random_walk_options;
using gravac::random_walk_trace;

TEST_CASE("a random walk stays within its bounds, holds and step size", "[network][random_walk]") {
  random_walk_options o;
  o.steps = 20000;
  for (std::uint64_t seed = 1; seed <= 20; ++seed) {
    INFO("seed " << seed);
    const auto tr = random_walk_trace(o, seed);
    REQUIRE(tr.size() >= 2);
    double total = 0;
    for (std::size_t i = 0; i < tr.size(); ++i) {
      const auto& ph = tr[i];
      total += ph.length;
      if (i + 1 < tr.size()) {  // the last hold is cut at o.steps
        CHECK(ph.length >= static_cast<double>(o.min_hold_steps));
        CHECK(ph.length <= static_cast<double>(o.max_hold_steps));
      }
      const double gbps = ph.net.gbps();
      CHECK(gbps >= o.min_gbps * (1 - 1e-12));
      CHECK(gbps <= o.max_gbps * (1 + 1e-12));
      CHECK(ph.net.alpha >= o.min_latency_s * (1 - 1e-12));
      CHECK(ph.net.alpha <= o.max_latency_s * (1 + 1e-12));
      if (i > 0) {  // one move: at most max_log10_step decades (reflection only shortens it)
        CHECK(std::fabs(std::log10(gbps / tr[i - 1].net.gbps())) <= o.max_log10_step + 1e-9);
        CHECK(std::fabs(std::log10(ph.net.alpha / tr[i - 1].net.alpha)) <= o.max_log10_step + 1e-9);
      }
    }
    CHECK(total == static_cast<double>(o.steps));
  }
}

TEST_CASE("a random walk visits its whole range and changes at the drawn pace", "[network][random_walk]") {
  random_walk_options o;
  o.steps = 200000;
  const auto tr = random_walk_trace(o, 7);
  double lo = 1e30, hi = 0, held = 0;
  for (const auto& ph : tr) {
    lo = std::min(lo, ph.net.gbps());
    hi = std::max(hi, ph.net.gbps());
    held += ph.length;
  }
  // Reflected, the walk covers the four decades: it comes within half a decade of each end.
  CHECK(lo < o.min_gbps * 3.2);
  CHECK(hi > o.max_gbps / 3.2);
  // Holds uniform in [10, 200]: a mean of 105 steps (within 5% over some 1,900 phases).
  const double mean_hold = held / static_cast<double>(tr.size());
  CHECK(mean_hold > 100);
  CHECK(mean_hold < 110);
}

TEST_CASE("a seed gives one random walk; other seeds, other walks", "[network][random_walk]") {
  random_walk_options o;
  o.steps = 5000;
  const auto a = random_walk_trace(o, 3), b = random_walk_trace(o, 3);
  REQUIRE(a.size() == b.size());
  for (std::size_t i = 0; i < a.size(); ++i) {
    CHECK(a[i].length == b[i].length);
    CHECK(a[i].net.alpha == b[i].net.alpha);
    CHECK(a[i].net.beta == b[i].net.beta);
  }
  std::set<double> first_bandwidths;
  for (std::uint64_t seed = 1; seed <= 8; ++seed) first_bandwidths.insert(random_walk_trace(o, seed)[0].net.beta);
  CHECK(first_bandwidths.size() == 8);
  // Pinned: the reproduction's tables name their seeds, so a seed's trace must not change
  // silently between versions (the holds are integer draws, the same on every machine).
  CHECK(a.size() == 55);
  CHECK(a[0].length == 188);
  CHECK(a[1].length == 35);
  CHECK(a[2].length == 179);
}

TEST_CASE("a random walk's profile and its CSV replay the trace exactly", "[network][random_walk]") {
  random_walk_options o;
  o.steps = 3000;
  const auto tr = random_walk_trace(o, 11);
  const auto p = gravac::random_walk_profile(o, 11);
  const auto q = gravac::network_profile::parse_csv(gravac::trace_csv(tr), "generated");
  REQUIRE(p.phases() == tr.size());
  REQUIRE(q.phases() == tr.size());
  std::uint64_t at = 0;
  for (const auto& ph : tr) {
    for (std::uint64_t s : {at, at + static_cast<std::uint64_t>(ph.length) - 1}) {
      INFO("step " << s);
      CHECK(p.at(s, 0).alpha == ph.net.alpha);
      CHECK(p.at(s, 0).beta == ph.net.beta);
      CHECK(q.at(s, 0).alpha == Approx(ph.net.alpha).epsilon(1e-15));
      CHECK(q.at(s, 0).beta == Approx(ph.net.beta).epsilon(1e-15));
    }
    at += static_cast<std::uint64_t>(ph.length);
  }
  // Past the end the last phase holds (not cyclic).
  CHECK(p.at(at + 12345, 0).beta == tr.back().net.beta);
}

TEST_CASE("random_walk_options are checked", "[network][random_walk]") {
  const auto refused = [](random_walk_options o) {
    try {
      (void)random_walk_trace(o, 1);
    } catch (const gravac::error& e) {
      return e.code() == gravac::status::invalid_argument;
    }
    return false;
  };
  random_walk_options o;
  CHECK_FALSE(refused(o));
  using edit = void (*)(random_walk_options&);
  const edit bad_edits[] = {
      [](random_walk_options& b) { b.min_gbps = 0; },
      [](random_walk_options& b) { b.max_gbps = b.min_gbps / 2; },
      [](random_walk_options& b) { b.max_latency_s = INFINITY; },
      [](random_walk_options& b) { b.min_hold_steps = 0; },
      [](random_walk_options& b) { b.max_hold_steps = b.min_hold_steps - 1; },
      [](random_walk_options& b) { b.max_log10_step = NAN; },
      [](random_walk_options& b) { b.steps = 0; },
  };
  int k = 0;
  for (const edit e : bad_edits) {
    INFO("edit " << k++);
    auto bad = o;
    e(bad);
    CHECK(refused(bad));
  }
  // Equal bounds are a constant network, not an error.
  auto flat = o;
  flat.min_gbps = flat.max_gbps = 10;
  flat.min_latency_s = flat.max_latency_s = 1e-4;
  for (const auto& ph : random_walk_trace(flat, 5)) CHECK(ph.net.gbps() == Approx(10).epsilon(1e-12));
}
