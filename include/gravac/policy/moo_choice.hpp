#pragma once
//! \file moo_choice.hpp
//! \brief The multi-objective choice of a kept fraction (docs/algorithms.md, "Multi-objective
//! choice of f"): information loss 1/gain(f) fitted over the candidates in log f, time
//! t(f) from a model, the exact Pareto front of the two curves by a dense 1-D scan, and
//! the front point that minimises an achievement scalarizing function (ASF) on
//! normalised objectives. Pure and deterministic: equal inputs give equal bits.

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <numeric>
#include <span>
#include <vector>

#include "gravac/core/error.hpp"
#include "gravac/policy/detail/quadratic_fit.hpp"

namespace gravac {

//! The point a multi-objective choice picked.
struct moo_decision {
  double fraction = 1;         //!< chosen kept fraction
  double time = 0;             //!< modeled time at that fraction
  double loss = 1;             //!< fitted information loss 1/gain at that fraction
  std::size_t front_size = 0;  //!< points on the Pareto front of the scan
};

//! Reusable workspace and algorithm of the multi-objective choice.
class moo_chooser {
 public:
  //! A chooser scanning \p scan_points values of log f (at least 2).
  explicit moo_chooser(std::size_t scan_points = 1001) : points_(scan_points) {
    require(scan_points >= 2, "moo_chooser: scan_points must be >= 2");
    x_.resize(points_);
    t_.resize(points_);
    l_.resize(points_);
    order_.resize(points_);
    front_.reserve(points_);
  }

  //! Picks a kept fraction between the smallest and largest candidate.
  //! \param candidates kept fractions where the loss is known (> 0)
  //! \param losses     1 / gain at each candidate
  //! \param time       callable: modeled seconds at kept fraction f
  //! \param w_time     ASF weight of time (0.6), \param w_loss ASF weight of the loss (0.4)
  template <class TimeFn>
  moo_decision choose(std::span<const double> candidates, std::span<const double> losses, TimeFn&& time,
                      double w_time = 0.6, double w_loss = 0.4) {
    require(!candidates.empty() && candidates.size() == losses.size(),
            "moo_chooser: one loss per candidate is required");
    xs_.resize(candidates.size());
    for (std::size_t i = 0; i < candidates.size(); ++i) {
      require(candidates[i] > 0, "moo_chooser: candidate fractions must be > 0");
      xs_[i] = std::log(candidates[i]);
    }
    double centre = 0;
    const auto c = detail::fit_quadratic(xs_, losses, centre);
    const auto [lo, hi] = std::minmax_element(xs_.begin(), xs_.end());
    const double x0 = *lo, x1 = *hi;
    // 1. Scan both fitted curves.
    for (std::size_t i = 0; i < points_; ++i) {
      const double x = points_ == 1 ? x0 : x0 + (x1 - x0) * static_cast<double>(i) / static_cast<double>(points_ - 1);
      const double dx = x - centre;
      x_[i] = x;
      t_[i] = time(std::exp(x));
      l_[i] = c[0] + c[1] * dx + c[2] * dx * dx;
    }
    // 2. The exact Pareto front of the scan: by time (then loss) ascending, keep each point
    //    whose loss is strictly below every faster point's.
    std::iota(order_.begin(), order_.end(), std::size_t{0});
    std::sort(order_.begin(), order_.end(), [&](std::size_t a, std::size_t b) {
      return t_[a] < t_[b] || (t_[a] == t_[b] && (l_[a] < l_[b] || (l_[a] == l_[b] && a < b)));
    });
    front_.clear();
    double best_loss = INFINITY;
    for (auto i : order_)
      if (l_[i] < best_loss) {
        front_.push_back(i);
        best_loss = l_[i];
      }
    // 3. ASF on objectives normalised over the front: max_j w_j z_j, plus a tiny sum term
    //    so that a weakly dominated point never wins a tie. Ties go to the faster point.
    double tmin = INFINITY, tmax = -INFINITY, lmin = INFINITY, lmax = -INFINITY;
    for (auto i : front_) {
      tmin = std::min(tmin, t_[i]);
      tmax = std::max(tmax, t_[i]);
      lmin = std::min(lmin, l_[i]);
      lmax = std::max(lmax, l_[i]);
    }
    const double tr = tmax > tmin ? tmax - tmin : 1.0, lr = lmax > lmin ? lmax - lmin : 1.0;
    std::size_t best = front_.front();
    double best_s = INFINITY;
    for (auto i : front_) {
      const double zt = (t_[i] - tmin) / tr, zl = (l_[i] - lmin) / lr;
      const double s = std::max(w_time * zt, w_loss * zl) + 1e-9 * (w_time * zt + w_loss * zl);
      if (s < best_s) {
        best_s = s;
        best = i;
      }
    }
    return {std::exp(x_[best]), t_[best], l_[best], front_.size()};
  }

  //! Indices (into the scan) of the last Pareto front, fastest first.
  [[nodiscard]] std::span<const std::size_t> front() const noexcept { return front_; }
  //! The last scan: log f, time and loss of point \p i.
  [[nodiscard]] std::array<double, 3> scan_point(std::size_t i) const { return {x_.at(i), t_.at(i), l_.at(i)}; }
  //! Points per scan.
  [[nodiscard]] std::size_t scan_points() const noexcept { return points_; }

 private:
  std::size_t points_;
  std::vector<double> xs_, x_, t_, l_;
  std::vector<std::size_t> order_, front_;
};

}  // namespace gravac
