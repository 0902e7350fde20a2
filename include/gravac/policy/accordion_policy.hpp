#pragma once
//! \file accordion_policy.hpp
//! \brief Accordion (Agarwal et al., MLSys 2021): per layer, low compression in critical
//! regimes (the gradient norm changes fast) and high compression otherwise.
//!
//! The rules (algorithms.md, "Accordion"):
//! - Per layer, ||g_l|| (averaged over ranks by the trainer) is summed over an interval:
//!   an epoch (each end_interval call) or every `interval_steps` steps.
//! - At each interval end, r = |n_prev - n_cur| / n_prev; r >= eta gives the layer the
//!   low-compression level for the next interval, else the high-compression level
//!   (n_prev = 0: r is 0 when n_cur is 0 too, infinite otherwise).
//! - The first interval is low, and so is the one after it: a decision needs two
//!   intervals to compare, and without evidence the layer is treated as critical.
//! - When the learning rate decays (interval_info::learning_rate below the previous
//!   one), every layer goes low at once and for the whole next interval.
//! - 1-D tensors (biases, norms) are sent dense.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "gravac/concepts.hpp"
#include "gravac/error.hpp"
#include "gravac/policy/detail/policy_state.hpp"

namespace gravac {

//! Options of accordion_policy; defaults are those of algorithms.md.
struct accordion_policy_options {
  double low_compression = 0.1;     //!< kept fraction in a critical regime, in (0, 1]
  double high_compression = 0.01;   //!< kept fraction otherwise, in (0, low_compression]
  double eta = 0.5;                 //!< eta > 0: relative norm change that marks a critical regime
  std::uint64_t interval_steps = 0; //!< F: steps per interval; 0 = an interval is an epoch (end_interval)
  bool one_dim_dense = true;        //!< send 1-D tensors uncompressed (Accordion compresses only matrices)
  double initial_learning_rate = 0; //!< learning rate of the first interval (0: unknown, the first end_interval sets it)
  collective_kind collective = collective_kind::automatic;  //!< hint for switching collectives
};

//! The level a layer is sent at.
enum class accordion_level : std::uint8_t {
  low,    //!< low compression (critical regime)
  high,   //!< high compression
  dense,  //!< uncompressed (1-D tensors)
};

//! Short name of an Accordion level.
constexpr std::string_view to_string(accordion_level l) noexcept {
  switch (l) {
    case accordion_level::low: return "low";
    case accordion_level::high: return "high";
    case accordion_level::dense: return "dense";
  }
  return "unknown";
}

//! Accordion's per-layer switch between two compression levels. Models Policy. Decisions
//! use the trainer's rank-averaged norms, so all ranks decide identically.
class accordion_policy {
 public:
  //! Opt-in tag for the Policy concept.
  using policy_tag = void;
  //! Options (see accordion_policy_options).
  using options = accordion_policy_options;
  //! Decisions use per-layer norms averaged over the ranks.
  static constexpr bool needs_statistics = true;
  //! Version of the bytes save() writes.
  static constexpr std::uint32_t state_version = 1;

  //! A policy for \p lay; throws gravac::error on an option out of its domain.
  accordion_policy(const layout& lay, const options& opt = {}) : opt_(opt) {
    const auto num = [](double v) { return std::to_string(v); };
    require(opt.low_compression > 0 && opt.low_compression <= 1,
            "accordion_policy: low_compression must be in (0, 1], got " + num(opt.low_compression));
    require(opt.high_compression > 0 && opt.high_compression <= opt.low_compression,
            "accordion_policy: high_compression must be in (0, low_compression], got " + num(opt.high_compression));
    require(std::isfinite(opt.eta) && opt.eta > 0, "accordion_policy: eta must be finite and > 0, got " + num(opt.eta));
    require(std::isfinite(opt.initial_learning_rate) && opt.initial_learning_rate >= 0,
            "accordion_policy: initial_learning_rate must be finite and >= 0, got " + num(opt.initial_learning_rate));
    const std::size_t n = lay.size();
    numel_.resize(n);
    levels_.resize(n);
    for (std::size_t i = 0; i < n; ++i) {
      numel_[i] = static_cast<double>(lay[i].numel);
      levels_[i] = opt.one_dim_dense && lay[i].rank() <= 1 ? accordion_level::dense : accordion_level::low;
    }
    norm_cur_.assign(n, 0.0);
    norm_prev_.assign(n, 0.0);
    ratio_.assign(n, std::numeric_limits<double>::quiet_NaN());
    learning_rate_ = opt.initial_learning_rate;
    fingerprint_ = detail::fingerprint(lay)
                       .add(opt.low_compression).add(opt.high_compression).add(opt.eta).add(opt.interval_steps)
                       .add(std::uint64_t{opt.one_dim_dense}).add(opt.initial_learning_rate)
                       .add(std::uint64_t(opt.collective))
                       .value();
  }

  //! Kept fraction per layer from its level; the whole-buffer fraction is the
  //! numel-weighted mean over the compressed layers (the same total budget).
  void plan(step_params& p) const {
    p.kept_fraction.resize(levels_.size());
    double kept = 0, total = 0;
    for (std::size_t i = 0; i < levels_.size(); ++i) {
      const double f = fraction(levels_[i]);
      p.kept_fraction[i] = f;
      if (levels_[i] != accordion_level::dense) {
        kept += f * numel_[i];
        total += numel_[i];
      }
    }
    p.global_fraction = total > 0 ? kept / total : dense_fraction;
    p.collective = opt_.collective;
    p.gain_candidates = {};
  }

  //! Adds the step's rank-averaged per-layer norms to the interval's sums.
  void observe(const step_report& r) {
    if (r.skipped) return;
    const std::size_t n = std::min(norm_cur_.size(), r.layer_grad_norm.size());
    for (std::size_t i = 0; i < n; ++i) norm_cur_[i] += r.layer_grad_norm[i];
    ++steps_;
    if (opt_.interval_steps > 0 && steps_ == opt_.interval_steps) end_of_interval();
  }

  //! Sees the learning rate (a decay sends every layer low) and, when intervals are
  //! epochs, closes the interval.
  void on_interval(const interval_info& info) {
    if (learning_rate_ > 0 && info.learning_rate < learning_rate_) {
      for (auto& l : levels_)
        if (l != accordion_level::dense) l = accordion_level::low;
      // ...and for the whole next interval: the one that starts at the next boundary, unless
      // this is a boundary already (epoch intervals, or F steps just completed).
      low_pending_ = opt_.interval_steps == 0 || steps_ > 0;
    }
    learning_rate_ = info.learning_rate;
    if (opt_.interval_steps == 0) end_of_interval();
  }

  //! Appends the full state (versioned) to \p out.
  void save(std::vector<std::byte>& out) const {
    detail::state_writer w(out);
    w.header(state_tag, state_version, fingerprint_);
    std::vector<std::uint8_t> levels(levels_.size());
    for (std::size_t i = 0; i < levels.size(); ++i) levels[i] = static_cast<std::uint8_t>(levels_[i]);
    w.put_vector(levels);
    w.put_vector(norm_cur_);
    w.put_vector(norm_prev_);
    w.put_vector(ratio_);
    w.put<std::uint64_t>(steps_);
    w.put<std::uint64_t>(intervals_);
    w.put(learning_rate_);
    w.put<std::uint8_t>(has_prev_);
    w.put<std::uint8_t>(low_pending_);
  }
  //! Restores what save() wrote; throws gravac::error (and changes nothing) on bytes from
  //! another policy, version, options or layout, or on truncated or corrupt bytes.
  void load(std::span<const std::byte> in) {
    detail::state_reader r(in, "accordion_policy");
    r.header(state_tag, state_version, fingerprint_);
    const std::size_t n = levels_.size();
    std::vector<std::uint8_t> levels;
    std::vector<double> cur, prev, ratio;
    r.get_vector(levels, n);
    r.get_vector(cur, n);
    r.get_vector(prev, n);
    r.get_vector(ratio, n);
    const auto steps = r.get<std::uint64_t>();
    const auto intervals = r.get<std::uint64_t>();
    const auto lr = r.get<double>();
    const auto has_prev = r.get<std::uint8_t>();
    const auto low_pending = r.get<std::uint8_t>();
    r.finish();
    for (std::size_t i = 0; i < n; ++i) {
      if (levels[i] > static_cast<std::uint8_t>(accordion_level::dense)) r.fail("unknown level");
      if ((levels[i] == static_cast<std::uint8_t>(accordion_level::dense)) != (levels_[i] == accordion_level::dense))
        r.fail("a layer's dense flag differs from the layout");
    }
    for (std::size_t i = 0; i < n; ++i) levels_[i] = static_cast<accordion_level>(levels[i]);
    norm_cur_ = std::move(cur);
    norm_prev_ = std::move(prev);
    ratio_ = std::move(ratio);
    steps_ = steps;
    intervals_ = intervals;
    learning_rate_ = lr;
    has_prev_ = has_prev != 0;
    low_pending_ = low_pending != 0;
  }

  //! The level of layer \p i for the next step.
  [[nodiscard]] accordion_level level(std::size_t i) const { return levels_.at(i); }
  //! The levels of all layers for the next step.
  [[nodiscard]] std::span<const accordion_level> levels() const noexcept { return levels_; }
  //! The kept fraction of a level.
  [[nodiscard]] double fraction(accordion_level l) const noexcept {
    return l == accordion_level::low ? opt_.low_compression
           : l == accordion_level::high ? opt_.high_compression
                                        : dense_fraction;
  }
  //! r of each layer at the last interval end (NaN before the first comparison).
  [[nodiscard]] std::span<const double> change_ratios() const noexcept { return ratio_; }
  //! Per-layer norm sums of the interval in progress.
  [[nodiscard]] std::span<const double> interval_norms() const noexcept { return norm_cur_; }
  //! Intervals completed.
  [[nodiscard]] std::uint64_t intervals() const noexcept { return intervals_; }
  //! The options.
  [[nodiscard]] const options& get_options() const noexcept { return opt_; }

 private:
  static constexpr std::uint32_t state_tag = 0x44434341;  // "ACCD"

  void end_of_interval() {
    if (steps_ > 0) {
      for (std::size_t i = 0; i < levels_.size(); ++i) {
        if (levels_[i] == accordion_level::dense) continue;
        if (!has_prev_) {
          levels_[i] = accordion_level::low;
          continue;
        }
        const double prev = norm_prev_[i], cur = norm_cur_[i];
        const double r = prev > 0 ? std::fabs(prev - cur) / prev
                         : cur > 0 ? std::numeric_limits<double>::infinity()
                                   : 0.0;
        ratio_[i] = r;
        levels_[i] = r >= opt_.eta ? accordion_level::low : accordion_level::high;
      }
      norm_prev_ = norm_cur_;
      std::fill(norm_cur_.begin(), norm_cur_.end(), 0.0);
      has_prev_ = true;
      steps_ = 0;
      ++intervals_;
    }
    if (low_pending_) {
      for (auto& l : levels_)
        if (l != accordion_level::dense) l = accordion_level::low;
      low_pending_ = false;
    }
  }

  options opt_;
  std::vector<double> numel_;
  std::uint64_t fingerprint_ = 0;
  // Decision state (saved and restored).
  std::vector<accordion_level> levels_;
  std::vector<double> norm_cur_;
  std::vector<double> norm_prev_;
  std::vector<double> ratio_;
  std::uint64_t steps_ = 0;
  std::uint64_t intervals_ = 0;
  double learning_rate_ = 0;
  bool has_prev_ = false;
  bool low_pending_ = false;
};
static_assert(Policy<accordion_policy>);

}  // namespace gravac
