#pragma once
//! \file fixed_policy.hpp
//! \brief The static policy: one kept fraction for every step (dense when 1).

#include <cstddef>
#include <span>
#include <vector>

#include "gravac/concepts.hpp"
#include "gravac/error.hpp"

namespace gravac {

//! Options of the fixed policy.
struct fixed_policy_options {
  double kept_fraction = 0.01;   //!< fraction kept of each compressed layer, in (0, 1]; 1 = dense
  bool one_dim_dense = false;    //!< send 1-D tensors (biases, norms) uncompressed
  collective_kind collective = collective_kind::automatic;  //!< hint for switching collectives
};

//! Sends every step at one kept fraction (CF = 1 / fraction). Models Policy.
class fixed_policy {
 public:
  //! Opt-in tag for the Policy concept.
  using policy_tag = void;
  //! Options (see fixed_policy_options).
  using options = fixed_policy_options;
  //! The fixed policy needs no statistics from the ranks.
  static constexpr bool needs_statistics = false;

  //! A policy for \p lay; rejects a kept fraction outside (0, 1].
  fixed_policy(const layout& lay, const options& opt = {}) : options_(opt) {
    require(opt.kept_fraction > 0.0 && opt.kept_fraction <= 1.0,
            "fixed_policy: kept_fraction must be in (0, 1], got " + std::to_string(opt.kept_fraction));
    fractions_.assign(lay.size(), opt.kept_fraction);
    if (opt.one_dim_dense)
      for (std::size_t i = 0; i < lay.size(); ++i)
        if (lay[i].rank() <= 1) fractions_[i] = dense_fraction;
  }

  //! Same fractions every step.
  void plan(step_params& p) const {
    std::copy(fractions_.begin(), fractions_.end(), p.kept_fraction.begin());
    p.global_fraction = options_.kept_fraction;
    p.collective = options_.collective;
    p.gain_candidates = {};
  }
  //! Nothing to learn.
  void observe(const step_report&) noexcept {}
  //! Nothing to do at interval ends.
  void on_interval(const interval_info&) noexcept {}
  //! No state to save.
  void save(std::vector<std::byte>&) const noexcept {}
  //! No state to restore.
  void load(std::span<const std::byte>) noexcept {}

 private:
  options options_;
  std::vector<double> fractions_;
};
static_assert(Policy<fixed_policy>);

}  // namespace gravac
