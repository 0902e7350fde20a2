#pragma once
//! \file fixed_policy.hpp
//! \brief The static policy: one kept fraction for every step (dense when 1).

#include <cstddef>
#include <span>
#include <vector>

#include "gravac/concepts/concepts.hpp"
#include "gravac/core/error.hpp"
#include "gravac/policy/detail/policy_state.hpp"

namespace gravac {

//! Options of the fixed policy.
struct fixed_policy_options {
  double kept_fraction = 0.01;  //!< fraction kept of each compressed layer, in (0, 1]; 1 = dense
  bool one_dim_dense = false;   //!< send 1-D tensors (biases, norms) uncompressed
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
  //! Version of the bytes save() writes.
  static constexpr std::uint32_t state_version = 1;

  //! A policy for \p lay; rejects a kept fraction outside (0, 1].
  fixed_policy(const layout& lay, const options& opt = {}) : options_(opt) {
    require(opt.kept_fraction > 0.0 && opt.kept_fraction <= 1.0,
            "fixed_policy: kept_fraction must be in (0, 1], got " + std::to_string(opt.kept_fraction));
    fractions_.assign(lay.size(), opt.kept_fraction);
    if (opt.one_dim_dense)
      for (std::size_t i = 0; i < lay.size(); ++i)
        if (lay[i].rank() <= 1) fractions_[i] = dense_fraction;
    fingerprint_ = detail::fingerprint(lay)
                       .add(opt.kept_fraction)
                       .add(std::uint64_t{opt.one_dim_dense})
                       .add(std::uint64_t(opt.collective))
                       .value();
  }

  //! Same fractions every step.
  void plan(step_params& p) const {
    std::copy(fractions_.begin(), fractions_.end(), p.kept_fraction.begin());
    p.global_fraction = options_.kept_fraction;
    p.collective = options_.collective;
    p.gain_candidates.clear();
  }
  //! Nothing to learn.
  void observe(const step_report&) noexcept {}
  //! Nothing to do at interval ends.
  void on_interval(const interval_info&) noexcept {}
  //! Writes only the versioned header (there is no state), so that loading it into a
  //! different policy or configuration fails loudly.
  void save(std::vector<std::byte>& out) const {
    detail::state_writer w(out);
    w.header(state_tag, state_version, fingerprint_);
  }
  //! Checks what save() wrote; empty bytes are accepted (nothing to restore).
  void load(std::span<const std::byte> in) const {
    if (in.empty()) return;
    detail::state_reader r(in, "fixed_policy");
    r.header(state_tag, state_version, fingerprint_);
    r.finish();
  }

 private:
  static constexpr std::uint32_t state_tag = 0x44584946;  // "FIXD"

  options options_;
  std::vector<double> fractions_;
  std::uint64_t fingerprint_ = 0;
};
static_assert(Policy<fixed_policy>);

}  // namespace gravac
