#pragma once
//! \file sgd.hpp
//! \brief SGD with momentum and weight decay over a flat buffer, and a step-decay
//! learning-rate schedule.

#include <cmath>
#include <cstddef>
#include <gravac/compress/detail/eigen_core.hpp>  // <Eigen/Core>, without GCC 12's false positives
#include <span>
#include <vector>

namespace fmnist {

//! Learning rate lr0 * gamma^(number of milestones passed): step decay at given epochs.
struct step_decay {
  double base = 0.05;                   //!< learning rate of the first epochs
  double gamma = 0.1;                   //!< factor applied at each milestone
  std::vector<std::size_t> milestones;  //!< epochs (0-based) at which the rate is multiplied by gamma

  //! The learning rate of epoch \p epoch (0-based).
  [[nodiscard]] double at(std::size_t epoch) const noexcept {
    double lr = base;
    for (auto m : milestones)
      if (epoch >= m) lr *= gamma;
    return lr;
  }
};

//! Heavy-ball SGD: v = mu v + g + wd p; p -= lr v. Every rank applies it to the same
//! averaged gradient, so parameters stay identical across ranks.
class sgd_momentum {
 public:
  //! An optimizer for \p n parameters.
  sgd_momentum(std::size_t n, double momentum, double weight_decay)
      : velocity_(n, 0.0f), momentum_(static_cast<float>(momentum)), weight_decay_(static_cast<float>(weight_decay)) {}

  //! One update of \p params with gradient \p grads at learning rate \p lr.
  void step(std::span<float> params, std::span<const float> grads, double lr) {
    const auto n = static_cast<Eigen::Index>(params.size());
    Eigen::Map<Eigen::ArrayXf> p(params.data(), n), v(velocity_.data(), n);
    Eigen::Map<const Eigen::ArrayXf> g(grads.data(), n);
    v = momentum_ * v + g + weight_decay_ * p;
    p -= static_cast<float>(lr) * v;
  }

  //! The momentum buffer (a checkpoint saves and restores it).
  [[nodiscard]] std::span<const float> velocity() const noexcept { return velocity_; }
  //! The momentum buffer, writable (to restore a checkpoint).
  [[nodiscard]] std::span<float> velocity() noexcept { return velocity_; }

 private:
  std::vector<float> velocity_;
  float momentum_, weight_decay_;
};

}  // namespace fmnist
