#pragma once
//! \file network_estimate.hpp
//! \brief An online estimate of the network's (alpha, beta), fitted by robust least
//! squares from the timings of collectives the run already makes.
//!
//! Each timed call contributes one sample `seconds ~ latency * alpha + bytes * beta`,
//! whose coefficients come from the cost model of the algorithm used (cost_terms).
//! The fit minimises *relative* residuals (network noise is multiplicative, and small
//! messages must count as much as large ones to pin down alpha), with Huber weights
//! re-estimated from the median absolute residual (IRLS), so a few stalls do not move it.
//! A weak pull towards a prior keeps it defined while every sample has the same shape
//! (one message size only). Samples live in a fixed ring buffer: no allocation per step.

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <vector>

#include "gravac/error.hpp"
#include "gravac/network/cost_model.hpp"

namespace gravac {

//! Options of the network estimate.
struct network_estimate_options {
  std::size_t window = 64;        //!< most recent samples kept (older ones are forgotten)
  network_params prior{};         //!< value before any sample, and the weak prior of the fit
  double prior_weight = 1e-3;     //!< weight of the prior relative to one sample
  double huber_k = 1.345;         //!< Huber threshold in robust standard deviations
  int iterations = 12;            //!< IRLS iterations
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
        terms.latency + terms.bytes <= 0)
      return;
    samples_[next_] = {terms, seconds};
    next_ = (next_ + 1) % samples_.size();
    count_ = std::min(count_ + 1, samples_.size());
    fit();
  }

  //! The current estimate.
  [[nodiscard]] const network_params& params() const noexcept { return current_; }
  //! Samples in the window.
  [[nodiscard]] std::size_t samples() const noexcept { return count_; }
  //! Forgets every sample (after a known change of network).
  void clear() noexcept {
    count_ = next_ = 0;
    current_ = options_.prior;
  }

 private:
  struct sample {
    cost_terms terms;
    double seconds = 0;
  };

  // IRLS on relative residuals r_i = (t_i - a_i alpha - b_i beta) / t_i, solved in the
  // scaled unknowns x = alpha / alpha0, y = beta / beta0 (well conditioned whatever the units).
  void fit() {
    const double a0 = options_.prior.alpha, b0 = options_.prior.beta;
    std::fill(weights_.begin(), weights_.begin() + static_cast<std::ptrdiff_t>(count_), 1.0);
    double x = 1, y = 1;
    for (int it = 0; it < options_.iterations; ++it) {
      // Normal equations of sum w_i (p_i x + q_i y - 1)^2 + lambda ((x-1)^2 + (y-1)^2).
      const double lambda = options_.prior_weight;
      double sxx = lambda, sxy = 0, syy = lambda, sx1 = lambda, sy1 = lambda;
      for (std::size_t i = 0; i < count_; ++i) {
        const auto& s = samples_[i];
        const double p = s.terms.latency * a0 / s.seconds, q = s.terms.bytes * b0 / s.seconds, w = weights_[i];
        sxx += w * p * p;
        sxy += w * p * q;
        syy += w * q * q;
        sx1 += w * p;
        sy1 += w * q;
      }
      const double det = sxx * syy - sxy * sxy;
      if (!(std::fabs(det) > 1e-300)) break;
      double nx = (sx1 * syy - sy1 * sxy) / det, ny = (sxx * sy1 - sxy * sx1) / det;
      // A negative coefficient is not physical: refit the other alone.
      if (nx < 0) {
        nx = 0;
        ny = sy1 / syy;
      } else if (ny < 0) {
        ny = 0;
        nx = sx1 / sxx;
      }
      const bool converged = std::fabs(nx - x) <= 1e-12 * std::max(1.0, std::fabs(x)) &&
                             std::fabs(ny - y) <= 1e-12 * std::max(1.0, std::fabs(y));
      x = nx;
      y = ny;
      if (converged || count_ < 3) break;
      reweight(x, y);
    }
    current_ = {std::max(0.0, x * a0), std::max(0.0, y * b0)};
  }

  // Huber weights from the relative residuals, scaled by 1.4826 * median |r| (MAD).
  void reweight(double x, double y) {
    const double a0 = options_.prior.alpha, b0 = options_.prior.beta;
    for (std::size_t i = 0; i < count_; ++i) {
      const auto& s = samples_[i];
      scratch_[i] = std::fabs(1.0 - (s.terms.latency * a0 * x + s.terms.bytes * b0 * y) / s.seconds);
    }
    std::copy(scratch_.begin(), scratch_.begin() + static_cast<std::ptrdiff_t>(count_), weights_.begin());
    auto mid = weights_.begin() + static_cast<std::ptrdiff_t>(count_ / 2);
    std::nth_element(weights_.begin(), mid, weights_.begin() + static_cast<std::ptrdiff_t>(count_));
    const double scale = std::max(1.4826 * *mid, 1e-9);
    const double k = options_.huber_k * scale;
    for (std::size_t i = 0; i < count_; ++i) weights_[i] = scratch_[i] <= k ? 1.0 : k / scratch_[i];
  }

  options options_;
  network_params current_;
  std::vector<sample> samples_;
  std::vector<double> weights_;
  std::vector<double> scratch_;
  std::size_t next_ = 0;
  std::size_t count_ = 0;
};

}  // namespace gravac
