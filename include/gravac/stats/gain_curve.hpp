#pragma once
//! \file
//! \brief The gain curve: the energy that exact top-k would keep at each candidate kept
//! fraction. The fast version reads a magnitude histogram (no extra pass, no sort); the
//! sort-based reference is kept for tests.

#include <algorithm>
#include <cstddef>
#include <functional>
#include <limits>
#include <span>
#include <vector>

#include "gravac/core/step.hpp"
#include "gravac/stats/detail/reference_gain_curve.hpp"
#include "gravac/stats/magnitude_histogram.hpp"

namespace gravac {

//! Energy of the top \p m of the \p c values of bin \p b whose energy is \p s. Inside the
//! bin the values are modelled as spread evenly between its edges; the model is scaled to
//! the bin's true energy, so the result is exact for m = 0 and m = c (at bin edges).
[[nodiscard]] inline double partial_bin_energy(std::uint32_t b, std::uint64_t m, std::uint64_t c, double s) noexcept {
  if (m == 0 || c == 0) return 0.0;
  if (m >= c) return s;
  const double lo = key_magnitude(magnitude_histogram::lower_key(b));
  const double hi = b + 1 >= magnitude_histogram::first_non_finite_bin
                        ? static_cast<double>(std::numeric_limits<float>::max())
                        : static_cast<double>(key_magnitude(magnitude_histogram::lower_key(b + 1)));
  const double q = static_cast<double>(m) / static_cast<double>(c);
  const double a = hi - q * (hi - lo);
  // mean of v^2 for v spread evenly over [x, y] is (x^2 + xy + y^2) / 3
  const auto mean_sq = [](double x, double y) { return (x * x + x * y + y * y) / 3.0; };
  return s * q * mean_sq(a, hi) / mean_sq(lo, hi);
}

//! Adds to \p kept_sq[c] the energy ||top-k_c(u)||^2 that exact top-k would keep of the
//! values in \p h (a layer of \p numel elements), with k = kept_count(numel, candidates[c]).
//! Exact when k falls on a bin edge; inside the boundary bin see partial_bin_energy.
//! Infinities and NaNs are never counted as kept. (For a histogram in which part of the
//! layer is a weighted sample, see detail::histogram_sampling, the curve is an estimate.)
inline void add_gain_curve(const magnitude_histogram& h, std::size_t numel, std::span<const double> candidates,
                           std::span<double> kept_sq) noexcept {
  if (h.empty()) return;
  const std::uint64_t finite = h.finite_count();
  for (std::size_t c = 0; c < candidates.size(); ++c) {
    const std::uint64_t k = std::min<std::uint64_t>(kept_count(numel, candidates[c]), finite);
    if (k == 0) continue;
    const histogram_boundary hb = find_boundary(h, k);
    kept_sq[c] += hb.above_sq + partial_bin_energy(hb.bin, hb.need, h.count(hb.bin), h.sumsq(hb.bin));
  }
}

}  // namespace gravac
