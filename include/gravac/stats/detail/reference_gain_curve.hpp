#pragma once
//! \file
//! \brief The gain curve by sorting: the reference the histogram-based gain curve is tested against.

#include <algorithm>
#include <cstddef>
#include <functional>
#include <limits>
#include <span>
#include <vector>

#include "gravac/core/step.hpp"
#include "gravac/stats/magnitude_histogram.hpp"

namespace gravac::detail {

//! Adds to \p kept_sq[c] the energy ||top-k_c(u)||^2 of \p u for each candidate fraction,
//! with k = kept_count(u.size(), candidates[c]). \p scratch is reused between calls.
inline void add_reference_gain_curve(std::span<const float> u, std::span<const double> candidates,
                                     std::span<double> kept_sq, std::vector<double>& scratch) {
  if (candidates.empty() || u.empty()) return;
  scratch.resize(u.size());
  for (std::size_t i = 0; i < u.size(); ++i) scratch[i] = static_cast<double>(u[i]) * u[i];
  std::sort(scratch.begin(), scratch.end(), std::greater<>());
  for (std::size_t c = 0; c < candidates.size(); ++c) {
    const std::size_t k = kept_count(u.size(), candidates[c]);
    double s = 0;
    for (std::size_t i = 0; i < k; ++i) s += scratch[i];
    kept_sq[c] += s;
  }
}

}  // namespace gravac::detail
