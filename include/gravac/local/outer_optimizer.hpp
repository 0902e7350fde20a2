#pragma once
//! \file outer_optimizer.hpp
//! \brief The outer step of local-step training: how the global parameters move by the
//! rank-averaged pseudo-gradient (plain averaging as local SGD, or Nesterov momentum as DiLoCo).

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "gravac/core/error.hpp"

namespace gravac {

//! How the averaged pseudo-gradient d moves the global parameters x.
enum class outer_kind : std::uint8_t {
  //! x -= d: the ranks' parameters are averaged (local SGD). lr and momentum are ignored.
  averaging,
  //! m = momentum m + d; x -= lr (d + momentum m): SGD with Nesterov momentum (DiLoCo).
  nesterov,
};

//! Options of the outer optimizer; DiLoCo's published values by default.
struct outer_options {
  outer_kind kind = outer_kind::nesterov;  //!< the outer rule
  double lr = 0.7;                         //!< outer learning rate (nesterov), finite and > 0
  double momentum = 0.9;                   //!< outer momentum (nesterov), in [0, 1)

  //! Throws gravac::error when an option is out of its domain; \p who names the owner.
  void validate(const std::string& who) const {
    require(kind == outer_kind::averaging || kind == outer_kind::nesterov, who + ": unknown outer optimizer");
    require(std::isfinite(lr) && lr > 0, who + ": outer.lr must be finite and > 0, got " + std::to_string(lr));
    require(std::isfinite(momentum) && momentum >= 0 && momentum < 1,
            who + ": outer.momentum must be in [0, 1), got " + std::to_string(momentum));
  }
};

//! The outer optimizer over a flat parameter buffer of \p n elements. Float arithmetic,
//! element by element in index order, so every rank computes the same bits.
class outer_optimizer {
 public:
  //! An optimizer for \p n parameters; rejects invalid options.
  outer_optimizer(std::size_t n, const outer_options& opt) : options_(opt) {
    opt.validate("local_steps");
    if (opt.kind == outer_kind::nesterov) momentum_.assign(n, 0.0f);
  }

  //! Moves \p x by the averaged pseudo-gradient \p d (same length).
  void apply(std::span<float> x, std::span<const float> d) {
    require(x.size() == d.size(), "outer_optimizer: parameters and pseudo-gradient differ in length");
    if (options_.kind == outer_kind::averaging) {
      for (std::size_t i = 0; i < x.size(); ++i) x[i] -= d[i];
      return;
    }
    const auto mu = static_cast<float>(options_.momentum), lr = static_cast<float>(options_.lr);
    for (std::size_t i = 0; i < x.size(); ++i) {
      const float m = mu * momentum_[i] + d[i];
      momentum_[i] = m;
      x[i] -= lr * (d[i] + mu * m);
    }
  }

  //! The momentum buffer (empty for averaging): what a checkpoint saves.
  [[nodiscard]] std::vector<float>& momentum() noexcept { return momentum_; }
  //! The momentum buffer.
  [[nodiscard]] const std::vector<float>& momentum() const noexcept { return momentum_; }
  //! The options.
  [[nodiscard]] const outer_options& options() const noexcept { return options_; }

 private:
  outer_options options_;
  std::vector<float> momentum_;
};

}  // namespace gravac
