#pragma once
// What the CPU benchmarks share: the generated data, and the baselines a kernel is timed
// against call by call (paired_ratio) in the same process:
//   memcpy_of       a memcpy of the gradient buffer (N floats), the common yardstick;
//   ef_floor_of     the traffic every error-feedback compressor must generate: read g and
//                   e, write e, and write a packet of the kernel's size. A kernel's ratio to
//                   it says how much of its time is computation that did not overlap memory;
//   nth_element_of  copy + abs + std::nth_element, the naive selection.

#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <map>
#include <optional>
#include <random>
#include <utility>
#include <vector>

namespace gravac_bench {

using clock_type = std::chrono::steady_clock;

inline double seconds(clock_type::time_point a, clock_type::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

//! Gradient and residual of one (N, distribution), generated once per process.
struct dataset {
  std::vector<float> g, e0;
};

//! Generates the data of \p n elements: Gaussian (\p dist 0) or Laplace (1) gradients, and
//! a residual of 0.3 times the same law (a few earlier steps' leftovers), from \p seed.
inline dataset make_dataset(std::size_t n, int dist, std::uint64_t seed) {
  dataset d;
  std::mt19937_64 rng(seed + n + static_cast<std::uint64_t>(dist));
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::exponential_distribution<float> expo(1.0f);
  auto draw = [&] { return dist == 0 ? normal(rng) : ((rng() & 1) ? 1.0f : -1.0f) * expo(rng); };
  d.g.resize(n);
  d.e0.resize(n);
  for (auto& x : d.g) x = draw();
  for (auto& x : d.e0) x = 0.3f * draw();
  return d;
}

//! make_dataset(n, dist, seed), generated once per process for each (n, dist). \p seed
//! varies per binary.
inline const dataset& data(std::size_t n, int dist, std::uint64_t seed) {
  static std::map<std::pair<std::size_t, int>, dataset> cache;
  auto& d = cache[{n, dist}];
  if (d.g.size() != n) d = make_dataset(n, dist, seed);
  return d;
}

//! Median over \p pairs alternations of (time of \p kernel) / (time of \p baseline), each
//! side timed over enough calls (\p calls) to last about a millisecond; \p prepare runs
//! untimed before every call of either side (to restore a residual, and to leave the
//! caches alike for both). The memory bandwidth of a shared
//! machine drifts over seconds: a kernel timed for half a second and its baseline for the
//! next differ by that drift (up to 30% on a shared 2-core VM), while a ratio of neighbouring
//! calls does not. This is the figure the ratio counters report.
inline double paired_ratio(const std::function<void()>& prepare, const std::function<void()>& kernel,
                           const std::function<void()>& baseline, std::size_t calls, int pairs = 9) {
  std::vector<double> ratios;
  for (int r = 0; r < pairs; ++r) {
    double tb = 0, tk = 0;
    for (std::size_t c = 0; c < calls; ++c) {
      prepare();
      const auto a = clock_type::now();
      baseline();
      tb += seconds(a, clock_type::now());
    }
    for (std::size_t c = 0; c < calls; ++c) {
      prepare();
      const auto a = clock_type::now();
      kernel();
      tk += seconds(a, clock_type::now());
    }
    ratios.push_back(tk / tb);
  }
  std::nth_element(ratios.begin(), ratios.begin() + static_cast<std::ptrdiff_t>(ratios.size() / 2), ratios.end());
  return ratios[ratios.size() / 2];
}

//! Calls per side of paired_ratio for buffers of \p n floats: about a millisecond of memcpy.
inline std::size_t calls_for(std::size_t n) { return std::max<std::size_t>(1, (std::size_t{1} << 22) / n); }

//! A memcpy of \p src into a buffer of its size (the buffer kept between calls).
inline std::function<void()> memcpy_of(const std::vector<float>& src) {
  static std::vector<float> dst;
  dst.resize(src.size());
  return [&src] {
    std::memcpy(dst.data(), src.data(), src.size() * sizeof(float));
    benchmark::DoNotOptimize(dst.data());
    benchmark::ClobberMemory();
  };
}

//! The naive selection baseline: |g + e| of \p d copied out, then std::nth_element for the
//! \p k-th largest.
inline std::function<void()> nth_element_of(const dataset& d, std::size_t k) {
  static std::vector<float> tmp;
  tmp.resize(d.g.size());
  return [&d, k] {
    for (std::size_t i = 0; i < tmp.size(); ++i) tmp[i] = std::fabs(d.g[i] + d.e0[i]);
    std::nth_element(tmp.begin(), tmp.begin() + static_cast<std::ptrdiff_t>(k - 1), tmp.end(), std::greater<>());
    benchmark::DoNotOptimize(tmp.data());
  };
}

//! The error-feedback floor: e += g over \p g.size() elements (read g and e, write e) and
//! \p packet_bytes written to a packet as the elements go, in chunks of 1024 elements as the
//! quantizers write their codes. No kernel that reads g and e, writes the residual and
//! emits that packet can move less data. With \p second_pass (EF-sign, whose one scale per
//! layer must be known before any residual), e is then read and written once more.
inline std::function<void()> ef_floor_of(const std::vector<float>& g, std::size_t packet_bytes,
                                         bool second_pass = false) {
  static std::vector<float> e;
  static std::vector<std::byte> packet;
  e.assign(g.size(), 0.5f);
  packet.resize(std::max<std::size_t>(packet_bytes, 1));
  return [&g, packet_bytes, second_pass] {
    constexpr std::size_t chunk = 1024;
    const std::size_t n = g.size();
    float* __restrict ep = e.data();
    const float* __restrict gp = g.data();
    for (std::size_t c = 0; c < n; c += chunk) {
      const std::size_t m = std::min(chunk, n - c);
      for (std::size_t i = c; i < c + m; ++i) ep[i] += gp[i];
      // This chunk's share of the packet: bytes [c, c + m) * packet_bytes / n.
      const std::size_t from = c * packet_bytes / n, to = (c + m) * packet_bytes / n;
      std::memset(packet.data() + from, static_cast<int>(c & 0xff), to - from);
    }
    if (second_pass)
      for (std::size_t i = 0; i < n; ++i) ep[i] *= 0.5f;
    benchmark::DoNotOptimize(e.data());
    benchmark::DoNotOptimize(packet.data());
    benchmark::ClobberMemory();
  };
}

//! Sets the ratio counters of a benchmark whose call is \p kernel (\p prepare untimed
//! before each), on a buffer of the gradient \p g's size, by paired_ratio:
//! ratio_to_memcpy, and with \p packet_bytes (a compress) ratio_to_ef_floor (the kernel
//! against ef_floor_of) and ef_floor_to_memcpy (their quotient).
inline void set_ratio_counters(benchmark::State& state, const std::function<void()>& prepare,
                               const std::function<void()>& kernel, const std::vector<float>& g,
                               std::optional<std::size_t> packet_bytes, bool second_pass = false) {
  const std::size_t calls = calls_for(g.size());
  const double to_memcpy = paired_ratio(prepare, kernel, memcpy_of(g), calls);
  state.counters["ratio_to_memcpy"] = to_memcpy;
  if (!packet_bytes) return;
  const double to_floor = paired_ratio(prepare, kernel, ef_floor_of(g, *packet_bytes, second_pass), calls);
  state.counters["ratio_to_ef_floor"] = to_floor;
  state.counters["ef_floor_to_memcpy"] = to_memcpy / to_floor;
}

}  // namespace gravac_bench
