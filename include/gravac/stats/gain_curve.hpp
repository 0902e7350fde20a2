#pragma once
//! \file
//! \brief The gain curve: the energy that exact top-k would keep at each candidate kept
//! fraction. The fast version reads a magnitude histogram (no extra pass, no sort); the
//! sort-based reference is kept for tests.

#include <algorithm>
#include <cstddef>
#include <limits>
#include <span>

#include "gravac/core/step.hpp"
#include "gravac/stats/detail/reference_gain_curve.hpp"
#include "gravac/stats/magnitude_histogram.hpp"

namespace gravac {

//! Bits of the key dropped to form a gain bin: the curve reads the histogram in bins of
//! 1/8 octave (2048 of them, every bin within one exponent), the bins the device's histogram
//! holds, so that both compute the same curve bit for bit.
inline constexpr unsigned gain_bin_shift = 20;
//! Gain bins (finite and not).
inline constexpr std::uint32_t gain_bins = 1u << (31 - gain_bin_shift);
//! The first gain bin of infinity and NaN.
inline constexpr std::uint32_t first_non_finite_gain_bin = non_finite_key >> gain_bin_shift;

//! Energy of the top \p m of the \p c values of gain bin \p b whose energy is \p s.
//! Inside the bin the values are modelled as spread evenly between its edges; the model is
//! scaled to the bin's true energy, so the result is exact for m = 0 and m = c (at bin
//! edges). The device computes it with the same operations in the same order.
[[nodiscard]] inline double partial_bin_energy(std::uint32_t b, std::uint64_t m, std::uint64_t c, double s) noexcept {
  if (m == 0 || c == 0) return 0.0;
  if (m >= c) return s;
  const double lo = key_magnitude(b << gain_bin_shift);
  const double hi = b + 1 >= first_non_finite_gain_bin ? static_cast<double>(std::numeric_limits<float>::max())
                                                       : static_cast<double>(key_magnitude((b + 1) << gain_bin_shift));
  const double q = static_cast<double>(m) / static_cast<double>(c);
  const double a = hi - q * (hi - lo);
  // mean of v^2 for v spread evenly over [x, y] is (x^2 + xy + y^2) / 3
  const auto mean_sq = [](double x, double y) { return (x * x + x * y + y * y) / 3.0; };
  return s * q * mean_sq(a, hi) / mean_sq(lo, hi);
}

namespace detail {

//! The aligned binary tree over leaves [first, first + size) of \p leaf (size a power of
//! two), where the leaves outside [lo, hi] are zero: what the device adds with every leaf
//! present (a zero changes no sum).
[[nodiscard]] inline double tree_over(const double* leaf, std::uint32_t first, std::uint32_t size, std::uint32_t lo,
                                      std::uint32_t hi) noexcept {
  if (first > hi || first + size <= lo) return 0.0;
  if (size == 1) return leaf[first];
  const std::uint32_t half = size / 2;
  if (first + half <= lo) return tree_over(leaf, first + half, half, lo, hi);  // the left half is zero
  if (first + half > hi) return tree_over(leaf, first, half, lo, hi);          // the right half is zero
  return tree_over(leaf, first, half, lo, hi) + tree_over(leaf, first + half, half, lo, hi);
}

}  // namespace detail

//! Adds to \p kept_sq[c] the energy ||top-k_c(u)||^2 that exact top-k would keep of the
//! values in \p h (a layer of \p numel elements), with k = kept_count(numel, candidates[c]).
//! Read in gain bins: the k-th largest finite value's bin b, the energy of the bins above
//! it added in the aligned binary tree over all gain_bins bins (those at or below b as
//! zero), plus partial_bin_energy of b. Exact when k falls on a bin edge. Infinities and
//! NaNs are never counted as kept. (For a histogram in which part of the layer is a
//! weighted sample, see detail::histogram_sampling, the curve is an estimate.)
inline void add_gain_curve(const magnitude_histogram& h, std::size_t numel, std::span<const double> candidates,
                           std::span<double> kept_sq) noexcept {
  if (h.empty() || candidates.empty()) return;
  constexpr unsigned per = gain_bin_shift - magnitude_histogram::shift;  // histogram bins per gain bin: 2^per
  const std::uint32_t lo = h.low_bin() >> per;
  const std::uint32_t hi = std::min(h.high_bin() >> per, first_non_finite_gain_bin - 1);
  if (lo > hi) return;  // nothing finite
  // The gain bins used: counts and energies (integer units added exactly, then converted).
  // On the stack (32 KiB, only [lo, hi] touched): nothing to allocate, nothing to throw.
  std::uint64_t count[gain_bins];
  double energy[gain_bins];
  std::uint64_t finite = 0;
  for (std::uint32_t b = lo; b <= hi; ++b) {
    std::uint64_t c = 0, u = 0;
    for (std::uint32_t j = b << per; j < ((b + 1) << per); ++j) {
      c += h.count(j);
      u += h.units(j);
    }
    count[b] = c;
    energy[b] = units_energy(u, b >> (23 - gain_bin_shift));
    finite += c;
  }
  for (std::size_t c = 0; c < candidates.size(); ++c) {
    const std::uint64_t k = std::min<std::uint64_t>(kept_count(numel, candidates[c]), finite);
    if (k == 0) continue;
    std::uint64_t above = 0;
    std::uint32_t b = hi;
    for (;; --b) {  // the bin of the k-th largest: a bin with above + count >= k exists (k <= finite)
      if (above + count[b] >= k) break;
      above += count[b];
    }
    const double above_sq = b == hi ? 0.0 : detail::tree_over(energy, 0, gain_bins, b + 1, hi);
    kept_sq[c] += above_sq + partial_bin_energy(b, k - above, count[b], energy[b]);
  }
}

}  // namespace gravac
