#pragma once
//! \file
//! \brief Least-squares quadratic fits of the gain and time curves of the multi-objective choice.

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <numeric>
#include <span>
#include <vector>

#include "gravac/core/error.hpp"

namespace gravac::detail {

//! Least-squares polynomial y = c0 + c1 x + c2 x^2 through (x_i, y_i) (a line when fewer
//! than three distinct points). Normal equations solved by Gaussian elimination with
//! partial pivoting on centred x, which is well conditioned for a handful of points.
inline std::array<double, 3> fit_quadratic(std::span<const double> x, std::span<const double> y, double& centre) {
  const std::size_t n = x.size();
  centre = n ? std::accumulate(x.begin(), x.end(), 0.0) / static_cast<double>(n) : 0.0;
  const int deg = n >= 3 ? 2 : (n == 2 ? 1 : 0);
  double a[3][4] = {};
  for (std::size_t i = 0; i < n; ++i) {
    const double xi = x[i] - centre;
    const double p[3] = {1, xi, xi * xi};
    for (int r = 0; r <= deg; ++r) {
      for (int c = 0; c <= deg; ++c) a[r][c] += p[r] * p[c];
      a[r][3] += p[r] * y[i];
    }
  }
  for (int c = 0; c <= deg; ++c) {
    int piv = c;
    for (int r = c + 1; r <= deg; ++r)
      if (std::fabs(a[r][c]) > std::fabs(a[piv][c])) piv = r;
    for (int k = 0; k < 4; ++k) std::swap(a[c][k], a[piv][k]);
    if (std::fabs(a[c][c]) < 1e-300) return {n ? y[0] : 0.0, 0, 0};
    for (int r = 0; r <= deg; ++r) {
      if (r == c) continue;
      const double m = a[r][c] / a[c][c];
      for (int k = c; k < 4; ++k) a[r][k] -= m * a[c][k];
    }
  }
  std::array<double, 3> out{};
  for (int c = 0; c <= deg; ++c) out[static_cast<std::size_t>(c)] = a[c][3] / a[c][c];
  return out;
}

}  // namespace gravac::detail
