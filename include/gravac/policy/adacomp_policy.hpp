#pragma once
//! \file adacomp_policy.hpp
//! \brief AdaComp's self-adjusting selection (Chen et al. 2017): the bin length L_T is
//! chosen by layer kind, and the compressor decides per bin how much to send. The policy
//! reports the compression that was achieved per layer.
//!
//! - adacomp_settings::bin_length (plan_settings()): conv_bin for convolution layers,
//!   dense_bin for dense, recurrent_bin for recurrent, bias_or_norm_bin for biases and
//!   norms (which are sent dense by default).
//! - step_params::kept_fraction: 1 / L_T for compressed layers. The AdaComp compressor
//!   only reads "below 1 = compress"; a compressor that needs a fraction (top-k, random-k)
//!   gets 1 / L_T, AdaComp's scale of about one value per bin, so the policy works with
//!   any compressor.
//! - Achieved compression: from step_report::kept_fraction, which the trainer averages
//!   over the ranks for this policy, so the running means (and the saved state) are the
//!   same on every rank; last step and running mean per layer and over the model.

#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "gravac/compress/step_settings.hpp"
#include "gravac/concepts/composition.hpp"
#include "gravac/concepts/concepts.hpp"
#include "gravac/core/error.hpp"
#include "gravac/policy/detail/persistent_fields.hpp"
#include "gravac/policy/detail/policy_state.hpp"

namespace gravac {

//! Options of adacomp_policy; defaults are those of docs/algorithms.md, "AdaComp's policy".
struct adacomp_policy_options {
  std::uint32_t conv_bin = 50;                              //!< L_T of convolution layers, >= 2
  std::uint32_t dense_bin = 500;                            //!< L_T of dense (fully connected) layers, >= 2
  std::uint32_t recurrent_bin = 500;                        //!< L_T of recurrent layers, >= 2
  std::uint32_t bias_or_norm_bin = 50;                      //!< L_T of biases and norms when they are compressed, >= 2
  bool bias_or_norm_dense = true;                           //!< send biases and norms uncompressed
  collective_kind collective = collective_kind::automatic;  //!< hint for switching collectives
};

//! AdaComp's bin length by layer kind, with a report of the compression achieved. Models
//! Policy. Its decisions are static, so they are identical on every rank by construction;
//! its report is built from rank-averaged kept fractions, so its state is too.
class adacomp_policy {
 public:
  //! Opt-in tag for the Policy concept.
  using policy_tag = void;
  //! What it decides (composition.hpp): the bin length by layer kind, and 1 / L_T as kept fraction.
  static constexpr decision decides = decision::kept_fraction | decision::bin_length;
  //! Options (see adacomp_policy_options).
  using options = adacomp_policy_options;
  //! The achieved kept fractions are averaged over the ranks (one small allreduce), so
  //! the report and the state are identical on every rank.
  static constexpr bool needs_statistics = true;
  //! Version of the bytes save() writes.
  static constexpr std::uint32_t state_version = 1;

  //! A policy for \p lay; throws gravac::error on a bin length below 2.
  adacomp_policy(const layout& lay, const options& opt = {}) : opt_(opt) {
    require(opt.conv_bin >= 2, "adacomp_policy: conv_bin must be >= 2, got " + std::to_string(opt.conv_bin));
    require(opt.dense_bin >= 2, "adacomp_policy: dense_bin must be >= 2, got " + std::to_string(opt.dense_bin));
    require(opt.recurrent_bin >= 2,
            "adacomp_policy: recurrent_bin must be >= 2, got " + std::to_string(opt.recurrent_bin));
    require(opt.bias_or_norm_bin >= 2,
            "adacomp_policy: bias_or_norm_bin must be >= 2, got " + std::to_string(opt.bias_or_norm_bin));
    const std::size_t n = lay.size();
    bins_.resize(n);
    fractions_.resize(n);
    numel_.resize(n);
    for (std::size_t i = 0; i < n; ++i) {
      numel_[i] = static_cast<double>(lay[i].numel);
      bins_[i] = bin_for(lay[i].kind);
      const bool dense = lay[i].kind == layer_kind::bias_or_norm && opt.bias_or_norm_dense;
      fractions_[i] = dense ? dense_fraction : 1.0 / static_cast<double>(bins_[i]);
    }
    last_.assign(n, std::numeric_limits<double>::quiet_NaN());
    sum_.assign(n, 0.0);
    fingerprint_ = detail::fingerprint(lay)
                       .add(std::uint64_t{opt.conv_bin})
                       .add(std::uint64_t{opt.dense_bin})
                       .add(std::uint64_t{opt.recurrent_bin})
                       .add(std::uint64_t{opt.bias_or_norm_bin})
                       .add(std::uint64_t{opt.bias_or_norm_dense})
                       .add(std::uint64_t(opt.collective))
                       .value();
  }

  //! Compressed layers marked with 1 / L_T, dense ones with 1 (L_T itself: plan_settings()).
  void plan(step_params& p) const {
    p.kept_fraction.assign(fractions_.begin(), fractions_.end());
    double kept = 0, total = 0;
    for (std::size_t i = 0; i < fractions_.size(); ++i)
      if (fractions_[i] < dense_fraction) {
        kept += fractions_[i] * numel_[i];
        total += numel_[i];
      }
    p.global_fraction = total > 0 ? kept / total : dense_fraction;
    p.collective = opt_.collective;
    p.gain_candidates.clear();
  }

  //! AdaComp's settings for the step plan() planned: L_T per layer (the bins of the layers
  //! sent dense too; the compressor sends those raw).
  void plan_settings(adacomp_settings& s) const { s.bin_length.assign(bins_.begin(), bins_.end()); }

  //! Records the kept fraction each layer achieved.
  void observe(const step_report& r) {
    if (r.skipped || r.kept_fraction.size() != last_.size()) return;
    double kept = 0, total = 0;
    for (std::size_t i = 0; i < last_.size(); ++i) {
      last_[i] = r.kept_fraction[i];
      sum_[i] += r.kept_fraction[i];
      kept += r.kept_fraction[i] * numel_[i];
      total += numel_[i];
    }
    last_model_ = total > 0 ? kept / total : 0.0;
    sum_model_ += last_model_;
    ++observed_;
  }
  //! Nothing happens at interval ends.
  void on_interval(const interval_info&) noexcept {}

  //! Appends the full state (versioned) to \p out: the fields of persistent_fields, in order.
  void save(std::vector<std::byte>& out) const {
    detail::state_writer w(out);
    w.header(state_tag, state_version, fingerprint_);
    detail::save_fields<persistent_fields>(w, *this);
  }
  //! Restores what save() wrote; throws gravac::error (and changes nothing) on bytes from
  //! another policy, version, options or layout, or on truncated bytes.
  void load(std::span<const std::byte> in) {
    detail::state_reader r(in, "adacomp_policy");
    r.header(state_tag, state_version, fingerprint_);
    detail::load_fields<persistent_fields>(r, *this, [](const auto&) {});  // any values are valid
  }

  //! L_T of layer \p i.
  [[nodiscard]] std::uint32_t bin_length(std::size_t i) const { return bins_.at(i); }
  //! True when layer \p i is compressed (not sent dense).
  [[nodiscard]] bool compressed(std::size_t i) const { return fractions_.at(i) < dense_fraction; }
  //! Kept fraction layer \p i achieved at the last step (NaN before the first).
  [[nodiscard]] double achieved_fraction(std::size_t i) const { return last_.at(i); }
  //! Compression factor layer \p i achieved at the last step (1 / fraction; infinite when
  //! nothing was sent, 1 for an empty layer, NaN before the first step).
  [[nodiscard]] double achieved_cf(std::size_t i) const { return cf_of(last_.at(i), numel_.at(i)); }
  //! Mean kept fraction of layer \p i over the steps observed (NaN before the first).
  [[nodiscard]] double mean_fraction(std::size_t i) const {
    return observed_ ? sum_.at(i) / static_cast<double>(observed_) : std::numeric_limits<double>::quiet_NaN();
  }
  //! Compression factor of layer \p i over the steps observed: 1 / mean_fraction(i).
  [[nodiscard]] double mean_cf(std::size_t i) const { return cf_of(mean_fraction(i), numel_.at(i)); }
  //! Compression factor over the whole model at the last step (elements / values sent).
  [[nodiscard]] double model_cf() const noexcept { return observed_ ? cf_of(last_model_, 1) : nan(); }
  //! Compression factor over the whole model and the steps observed.
  [[nodiscard]] double mean_model_cf() const noexcept {
    return observed_ ? cf_of(sum_model_ / static_cast<double>(observed_), 1) : nan();
  }
  //! Steps observed.
  [[nodiscard]] std::uint64_t steps_observed() const noexcept { return observed_; }
  //! The options.
  [[nodiscard]] const options& get_options() const noexcept { return opt_; }

 private:
  static constexpr std::uint32_t state_tag = 0x50434441;  // "ADCP"

  static double nan() noexcept { return std::numeric_limits<double>::quiet_NaN(); }
  static double cf_of(double fraction, double numel) noexcept {
    if (fraction != fraction) return nan();
    if (numel == 0) return 1.0;
    return fraction > 0 ? 1.0 / fraction : std::numeric_limits<double>::infinity();
  }
  std::uint32_t bin_for(layer_kind k) const noexcept {
    switch (k) {
      case layer_kind::conv:
        return opt_.conv_bin;
      case layer_kind::dense:
        return opt_.dense_bin;
      case layer_kind::recurrent:
        return opt_.recurrent_bin;
      case layer_kind::bias_or_norm:
        return opt_.bias_or_norm_bin;
    }
    return opt_.dense_bin;
  }

  options opt_;
  std::vector<std::uint32_t> bins_;
  std::vector<double> fractions_;
  std::vector<double> numel_;
  std::uint64_t fingerprint_ = 0;
  // Report state (saved and restored).
  std::vector<double> last_;
  std::vector<double> sum_;
  double last_model_ = 0;
  double sum_model_ = 0;
  std::uint64_t observed_ = 0;

  // What a checkpoint holds, in the order of its bytes (the vectors hold one value per layer).
  using persistent_fields =
      detail::field_list<detail::field<&adacomp_policy::last_>, detail::field<&adacomp_policy::sum_>,
                         detail::field<&adacomp_policy::last_model_>, detail::field<&adacomp_policy::sum_model_>,
                         detail::field<&adacomp_policy::observed_>>;
};
static_assert(Policy<adacomp_policy>);

}  // namespace gravac
