#pragma once
//! \file random_walk_profile.hpp
//! \brief Seeded random-walk network traces: bandwidth and latency that change every few
//! tens of steps by a random factor, within bounds. The reproduction's "networks that keep
//! changing", from a seed rather than a recorded file, and the same on every machine.

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "gravac/core/detail/random.hpp"
#include "gravac/core/error.hpp"
#include "gravac/network/network_profile.hpp"

namespace gravac {

//! The bounds and pace of a random walk (random_walk_trace). Both quantities walk in
//! log space: a change multiplies each by a factor drawn log-uniformly from
//! [10^-max_log10_step, 10^max_log10_step], reflected at its bounds.
struct random_walk_options {
  double min_gbps = 0.1;               //!< slowest bandwidth, Gbit/s (> 0)
  double max_gbps = 100.0;             //!< fastest bandwidth, Gbit/s (>= min_gbps)
  double min_latency_s = 10e-6;        //!< lowest latency, seconds (> 0)
  double max_latency_s = 5e-3;         //!< highest latency, seconds (>= min_latency_s)
  std::uint64_t min_hold_steps = 10;   //!< shortest time between changes, steps (>= 1)
  std::uint64_t max_hold_steps = 200;  //!< longest (>= min_hold_steps); each hold uniform in between
  double max_log10_step = 0.5;         //!< largest change per move, in decades (> 0; 0.5: about 3.2x)
  std::uint64_t steps = 100000;        //!< steps the trace covers; its last phase holds after
};

namespace detail {

inline void check_random_walk(const random_walk_options& o) {
  const auto positive = [](double x) { return x > 0 && std::isfinite(x); };
  require(positive(o.min_gbps) && positive(o.max_gbps) && o.min_gbps <= o.max_gbps,
          "random_walk_options: need 0 < min_gbps <= max_gbps, finite");
  require(positive(o.min_latency_s) && positive(o.max_latency_s) && o.min_latency_s <= o.max_latency_s,
          "random_walk_options: need 0 < min_latency_s <= max_latency_s, finite");
  require(o.min_hold_steps >= 1 && o.min_hold_steps <= o.max_hold_steps,
          "random_walk_options: need 1 <= min_hold_steps <= max_hold_steps");
  require(positive(o.max_log10_step), "random_walk_options: max_log10_step must be finite and > 0");
  require(o.steps >= 1, "random_walk_options: steps must be >= 1");
}

// x + d reflected into [lo, hi] (d may cross the interval several times).
inline double reflect_into(double x, double d, double lo, double hi) noexcept {
  if (hi <= lo) return lo;
  const double w = hi - lo;
  double y = std::fmod(x + d - lo, 2 * w);
  if (y < 0) y += 2 * w;
  return lo + (y <= w ? y : 2 * w - y);
}

}  // namespace detail

//! The phases of a random walk from \p seed: the first at a point drawn log-uniformly
//! within the bounds, then each after a hold drawn uniformly in [min_hold_steps,
//! max_hold_steps], until \p o.steps are covered. Drawn with splitmix64, so a seed gives the
//! same trace on every machine and standard library. Throws gravac::error
//! (invalid_argument) on invalid options.
inline std::vector<network_phase> random_walk_trace(const random_walk_options& o, std::uint64_t seed) {
  detail::check_random_walk(o);
  detail::splitmix64 rng(detail::mix_seed(seed, 0x6e6574776f726bull));  // "network"
  const double blo = std::log10(o.min_gbps), bhi = std::log10(o.max_gbps);
  const double llo = std::log10(o.min_latency_s), lhi = std::log10(o.max_latency_s);
  double b = blo + (bhi - blo) * rng.uniform();
  double l = llo + (lhi - llo) * rng.uniform();
  const std::uint64_t span = o.max_hold_steps - o.min_hold_steps + 1;
  std::vector<network_phase> phases;
  for (std::uint64_t at = 0; at < o.steps;) {
    std::uint64_t hold = o.min_hold_steps + rng.next() % span;
    if (hold > o.steps - at) hold = o.steps - at;
    phases.push_back({static_cast<double>(hold), network_params::from_gbps(std::pow(10.0, l), std::pow(10.0, b))});
    at += hold;
    b = detail::reflect_into(b, o.max_log10_step * (2 * rng.uniform() - 1), blo, bhi);
    l = detail::reflect_into(l, o.max_log10_step * (2 * rng.uniform() - 1), llo, lhi);
  }
  return phases;
}

//! The step-indexed profile of random_walk_trace(\p o, \p seed); the last phase holds after
//! \p o.steps.
inline network_profile random_walk_profile(const random_walk_options& o, std::uint64_t seed) {
  return network_profile::schedule(random_walk_trace(o, seed), profile_index::step, false);
}

//! Step-indexed \p phases as the CSV network_profile::parse_csv reads
//! (`step,latency_us,bandwidth_gbps`, 17 significant digits), so that a generated trace can be
//! saved, plotted and replayed.
inline std::string trace_csv(const std::vector<network_phase>& phases) {
  std::string out = "step,latency_us,bandwidth_gbps\n";
  double at = 0;
  char row[96];
  for (const auto& ph : phases) {
    std::snprintf(row, sizeof row, "%.17g,%.17g,%.17g\n", at, ph.net.alpha * 1e6, ph.net.gbps());
    out += row;
    at += ph.length;
  }
  return out;
}

}  // namespace gravac
