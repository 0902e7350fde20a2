#pragma once
//! \file network_estimate.hpp
//! \brief An online estimate of the network's (alpha, beta), fitted by robust least squares
//! from the timings of collectives the run already makes, accurate whatever its prior.
//!
//! Each timed call is one sample of the cost model; the fit weighs relative residuals
//! robustly because network noise is multiplicative and stalls happen. The fit and how the
//! prior counts: docs/algorithms.md, "The network estimate".

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <vector>

#include "gravac/core/error.hpp"
#include "gravac/network/cost_model.hpp"

namespace gravac {

//! Options of the network estimate.
struct network_estimate_options {
  std::size_t window = 64;  //!< most recent samples kept (older ones are forgotten)
  network_params prior{};   //!< value before any sample; its split (alpha : beta) is the fit's weak prior
  //! Weight of the pull towards the prior's split, in samples that know the split to within
  //! 100% (the real samples count with the fit's residual scale, so exact ones always win).
  double prior_weight = 1e-3;
  double huber_k = 1.345;  //!< Huber threshold in robust standard deviations
  int iterations = 12;     //!< IRLS iterations
};

//! Robust online least-squares estimate of (alpha, beta).
class network_estimate {
 public:
  //! Options (see network_estimate_options).
  using options = network_estimate_options;

  //! An estimate that starts at opt.prior; rejects an empty window or a bad prior.
  explicit network_estimate(const options& opt = {}) : options_(opt), current_(opt.prior) {
    require(opt.window >= 2, "network_estimate: window must hold at least 2 samples");
    require(opt.prior.alpha > 0 && opt.prior.beta > 0, "network_estimate: the prior alpha and beta must be > 0");
    require(opt.prior_weight >= 0 && opt.huber_k > 0 && opt.iterations > 0,
            "network_estimate: prior_weight >= 0, huber_k > 0 and iterations > 0 are required");
    samples_.resize(opt.window);
    weights_.resize(opt.window);
    scratch_.resize(opt.window);
  }

  //! Adds one timed call: \p seconds spent on a call whose cost is \p terms. Samples that
  //! are not finite and positive, or carry no cost, are ignored. Refits.
  void add(const cost_terms& terms, double seconds) {
    if (!(seconds > 0) || !std::isfinite(seconds) || !(terms.latency >= 0) || !(terms.bytes >= 0) ||
        !std::isfinite(terms.latency) || !std::isfinite(terms.bytes) || terms.latency + terms.bytes <= 0)
      return;
    samples_[next_] = {terms, seconds};
    next_ = (next_ + 1) % samples_.size();
    count_ = std::min(count_ + 1, samples_.size());
    fit();
  }

  //! The current estimate.
  [[nodiscard]] const network_params& params() const noexcept { return current_; }
  //! Whether the split between alpha and beta came from the samples. False before any
  //! sample, when all samples have one shape (proportional (latency, bytes): alpha and beta
  //! cannot be told apart, so params() is the prior scaled to match them), and when the
  //! samples separate alpha from beta so weakly that the prior's pull outweighs them.
  [[nodiscard]] bool identifiable() const noexcept { return identifiable_; }
  //! Samples in the window.
  [[nodiscard]] std::size_t samples() const noexcept { return count_; }
  //! Forgets every sample (after a known change of network).
  void clear() noexcept {
    count_ = next_ = 0;
    current_ = options_.prior;
    identifiable_ = false;
  }

 private:
  struct sample {
    cost_terms terms;
    double seconds = 0;
  };

  // Below this 1 - cos^2 of the angle between the (weighted, relative) latency and byte
  // columns, the samples count as one shape. Measured over 64 samples: exactly proportional
  // columns leave rounding below 1e-14; two sizes of one collective 1% apart give 2.5e-5,
  // a decade apart 0.4.
  static constexpr double one_shape_below = 1e-9;
  // Floor of the robust residual scale: exact samples still get finite Huber weights.
  static constexpr double min_residual_scale = 1e-9;

  // IRLS on relative residuals r_i = 1 - (p_i x + q_i y), with p_i = latency_i alpha1 / t_i,
  // q_i = bytes_i beta1 / t_i, in the unknowns x = alpha / alpha1, y = beta / beta1 where
  // (alpha1, beta1) is the prior scaled to the samples: x = y = 1 is the prior's split at the
  // samples' magnitude, and the units are well conditioned whatever the prior.
  void fit() {
    const double magnitude = prior_scale();
    const double a1 = options_.prior.alpha * magnitude, b1 = options_.prior.beta * magnitude;
    // The first pass weighs every sample alike; its pull uses the residuals of the scaled prior.
    double residual_scale = robust_scale(a1, b1, 1.0, 1.0);
    std::fill(weights_.begin(), weights_.begin() + static_cast<std::ptrdiff_t>(count_), 1.0);
    double x = 1, y = 1;
    bool split_from_data = false;
    for (int it = 0; it < options_.iterations; ++it) {
      double sw = 0, sxx = 0, sxy = 0, syy = 0, sx1 = 0, sy1 = 0;
      for (std::size_t i = 0; i < count_; ++i) {
        const auto& s = samples_[i];
        const double p = s.terms.latency * a1 / s.seconds, q = s.terms.bytes * b1 / s.seconds, w = weights_[i];
        sw += w;
        sxx += w * p * p;
        sxy += w * p * q;
        syy += w * q * q;
        sx1 += w * p;
        sy1 += w * q;
      }
      const double det = sxx * syy - sxy * sxy;
      double nx = 1, ny = 1;
      if (!(det > one_shape_below * sxx * syy)) {
        // One shape: only the common scale of the prior's split is observable.
        const double along = sxx + 2 * sxy + syy;
        nx = ny = along > 0 ? (sx1 + sy1) / along : 1.0;
        split_from_data = false;
      } else {
        // Pull towards x = y = 1 worth prior_weight average samples whose residual is 1,
        // against samples whose residual is residual_scale (a Gaussian prior's MAP).
        const double pull = options_.prior_weight * residual_scale * residual_scale / sw;
        const double lx = pull * sxx, ly = pull * syy;
        const double mxx = sxx + lx, myy = syy + ly, bx = sx1 + lx, by = sy1 + ly;
        const double m_det = mxx * myy - sxy * sxy;
        nx = (bx * myy - by * sxy) / m_det;
        ny = (mxx * by - sxy * bx) / m_det;
        // A negative coefficient is not physical: refit the other alone.
        if (nx < 0) {
          nx = 0;
          ny = by / myy;
        } else if (ny < 0) {
          ny = 0;
          nx = bx / mxx;
        }
        // The data decide the split when they outweigh the pull in their weakest direction:
        // relative to the pull (pull * diag), the data's information there is 1 - cos(angle).
        split_from_data = 1.0 - sxy / std::sqrt(sxx * syy) > pull;
      }
      const bool converged = std::fabs(nx - x) <= 1e-12 * std::max(1.0, std::fabs(x)) &&
                             std::fabs(ny - y) <= 1e-12 * std::max(1.0, std::fabs(y));
      x = nx;
      y = ny;
      if (converged) break;
      residual_scale = reweight(a1, b1, x, y);
    }
    current_ = {std::max(0.0, x * a1), std::max(0.0, y * b1)};
    identifiable_ = split_from_data;
  }

  // The prior's common scale that matches the samples: the median over the window of the
  // measured time over the time the prior models (robust to stalls, exact on exact samples).
  double prior_scale() {
    for (std::size_t i = 0; i < count_; ++i) {
      const auto& s = samples_[i];
      scratch_[i] = s.seconds / s.terms.seconds(options_.prior);
    }
    const auto mid = scratch_.begin() + static_cast<std::ptrdiff_t>(count_ / 2);
    std::nth_element(scratch_.begin(), mid, scratch_.begin() + static_cast<std::ptrdiff_t>(count_));
    return *mid;
  }

  // |relative residual| of each sample into scratch_; returns 1.4826 * their median (MAD),
  // found with weights_ as the work buffer (the caller sets the weights afterwards).
  double robust_scale(double a1, double b1, double x, double y) {
    for (std::size_t i = 0; i < count_; ++i) {
      const auto& s = samples_[i];
      scratch_[i] = std::fabs(1.0 - (s.terms.latency * a1 * x + s.terms.bytes * b1 * y) / s.seconds);
    }
    std::copy(scratch_.begin(), scratch_.begin() + static_cast<std::ptrdiff_t>(count_), weights_.begin());
    const auto mid = weights_.begin() + static_cast<std::ptrdiff_t>(count_ / 2);
    std::nth_element(weights_.begin(), mid, weights_.begin() + static_cast<std::ptrdiff_t>(count_));
    return std::max(1.4826 * *mid, min_residual_scale);
  }

  // Huber weights from the relative residuals at (x, y); returns the robust scale used.
  double reweight(double a1, double b1, double x, double y) {
    const double scale = robust_scale(a1, b1, x, y);
    const double k = options_.huber_k * scale;
    for (std::size_t i = 0; i < count_; ++i) weights_[i] = scratch_[i] <= k ? 1.0 : k / scratch_[i];
    return scale;
  }

  options options_;
  network_params current_;
  bool identifiable_ = false;
  std::vector<sample> samples_;
  std::vector<double> weights_;
  std::vector<double> scratch_;
  std::size_t next_ = 0;
  std::size_t count_ = 0;
};

}  // namespace gravac
