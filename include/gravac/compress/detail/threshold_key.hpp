#pragma once
//! \file
//! \brief threshold's estimate from a histogram: the magnitude about k values lie at or
//! above, as a key.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include "gravac/compress/detail/fused_pass.hpp"
#include "gravac/stats/magnitude_histogram.hpp"

namespace gravac::detail {

//! Magnitude t such that about \p k of the values counted in \p h lie at or above it:
//! the histogram's boundary bin, interpolated inside the bin as if its values were spread
//! evenly. Returns a key; no_guess when k == 0.
[[nodiscard]] inline std::uint32_t threshold_key_from_histogram(const magnitude_histogram& h, double k) noexcept {
  const std::uint64_t kk = static_cast<std::uint64_t>(std::ceil(k));
  if (kk == 0 || h.finite_count() == 0) return no_guess;
  const auto hb = find_boundary(h, std::min<std::uint64_t>(kk, h.finite_count()));
  const std::uint64_t c = h.count(hb.bin);
  const double lo = key_magnitude(magnitude_histogram::lower_key(hb.bin));
  const double hi = hb.bin + 1 >= magnitude_histogram::first_non_finite_bin
                        ? static_cast<double>(std::numeric_limits<float>::max())
                        : static_cast<double>(key_magnitude(magnitude_histogram::lower_key(hb.bin + 1)));
  const double need = std::clamp(k - static_cast<double>(hb.above), 0.0, static_cast<double>(c));
  const double t = c == 0 ? lo : hi - need / static_cast<double>(c) * (hi - lo);
  return std::max(magnitude_key(static_cast<float>(t)), magnitude_histogram::lower_key(hb.bin));
}

}  // namespace gravac::detail
