#pragma once
//! \file accordion_policy.hpp
//! \brief Accordion (Agarwal et al., MLSys 2021): per layer, low compression in critical
//! regimes (the gradient changes fast) and high compression otherwise.
//!
//! A layer's statistic is the norm of its interval-summed local gradient (the per-step noise
//! largely cancels in it); the rules, their timing and why: docs/algorithms.md, "Accordion".

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

#include "gravac/compress/step_settings.hpp"
#include "gravac/concepts/composition.hpp"
#include "gravac/concepts/concepts.hpp"
#include "gravac/core/error.hpp"
#include "gravac/policy/detail/persistent_fields.hpp"
#include "gravac/policy/detail/policy_state.hpp"

namespace gravac {

//! Options of accordion_policy. Kept fractions are this library's defaults (the authors'
//! top-k levels keep 99% and 10%); ranks are the authors' PowerSGD levels (2 / 1).
struct accordion_policy_options {
  double low_compression = 0.1;      //!< kept fraction in a critical regime, in (0, 1]
  double high_compression = 0.01;    //!< kept fraction otherwise, in (0, low_compression]
  std::uint32_t low_rank = 2;        //!< PowerSGD rank in a critical regime, >= 1
  std::uint32_t high_rank = 1;       //!< PowerSGD rank otherwise, in [1, low_rank]
  double eta = 0.5;                  //!< eta > 0: relative norm change that marks a critical regime
  std::uint64_t interval_steps = 0;  //!< F: steps per interval; 0 = an interval is an epoch (end_interval)
  //! C >= 1: intervals between decisions (the authors: 10 epochs for CIFAR, 5 for the language model)
  std::uint64_t compare_every = 10;
  bool one_dim_dense = true;  //!< send 1-D tensors uncompressed (Accordion compresses only matrices)
  //! learning rate of the first interval (0: unknown, the first end_interval sets it)
  double initial_learning_rate = 0;
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
    case accordion_level::low:
      return "low";
    case accordion_level::high:
      return "high";
    case accordion_level::dense:
      return "dense";
  }
  return "unknown";
}

//! Accordion's per-layer switch between two compression levels. Models Policy. Decisions
//! use the norms of the interval-summed local gradients averaged over the ranks (they ride
//! in a step's own collective), so all ranks decide identically.
class accordion_policy {
 public:
  //! Opt-in tag for the Policy concept.
  using policy_tag = void;
  //! What it decides (composition.hpp): each layer's kept fraction or PowerSGD rank.
  static constexpr decision decides = decision::kept_fraction | decision::approximation_rank;
  //! Options (see accordion_policy_options).
  using options = accordion_policy_options;
  //! No per-step statistics: the policy keeps its own accumulators and agrees on their
  //! norms only at a decision.
  static constexpr bool needs_statistics = false;
  //! Version of the bytes save() and save_local() write (2: summed gradients, decisions every C intervals).
  static constexpr std::uint32_t state_version = 2;

  //! A policy for \p lay; throws gravac::error on an option out of its domain.
  accordion_policy(const layout& lay, const options& opt = {}) : opt_(opt) {
    const auto num = [](double v) { return std::to_string(v); };
    require(opt.low_compression > 0 && opt.low_compression <= 1,
            "accordion_policy: low_compression must be in (0, 1], got " + num(opt.low_compression));
    require(opt.high_compression > 0 && opt.high_compression <= opt.low_compression,
            "accordion_policy: high_compression must be in (0, low_compression], got " + num(opt.high_compression));
    require(opt.low_rank >= 1, "accordion_policy: low_rank must be at least 1");
    require(opt.high_rank >= 1 && opt.high_rank <= opt.low_rank,
            "accordion_policy: high_rank must be in [1, low_rank], got " + std::to_string(opt.high_rank));
    require(std::isfinite(opt.eta) && opt.eta > 0, "accordion_policy: eta must be finite and > 0, got " + num(opt.eta));
    require(opt.compare_every >= 1, "accordion_policy: compare_every must be at least 1");
    require(std::isfinite(opt.initial_learning_rate) && opt.initial_learning_rate >= 0,
            "accordion_policy: initial_learning_rate must be finite and >= 0, got " + num(opt.initial_learning_rate));
    const std::size_t n = lay.size();
    numel_.resize(n);
    levels_.resize(n);
    std::size_t acc = 0;
    for (std::size_t i = 0; i < n; ++i) {
      numel_[i] = static_cast<double>(lay[i].numel);
      numel_total_ += lay[i].numel;
      levels_[i] = opt.one_dim_dense && lay[i].rank() <= 1 ? accordion_level::dense : accordion_level::low;
      if (levels_[i] == accordion_level::dense || lay[i].numel == 0) continue;
      segments_.push_back({i, lay[i].offset, lay[i].numel, acc});
      acc += lay[i].numel;
    }
    acc_.assign(acc, 0.0f);  // only compressed layers are watched: no memory for the dense ones
    norm_prev_.assign(n, 0.0);
    ratio_.assign(n, std::numeric_limits<double>::quiet_NaN());
    request_.reserve(n);
    learning_rate_ = opt.initial_learning_rate;
    fingerprint_ = detail::fingerprint(lay)
                       .add(opt.low_compression)
                       .add(opt.high_compression)
                       .add(opt.eta)
                       .add(opt.interval_steps)
                       .add(std::uint64_t{opt.one_dim_dense})
                       .add(opt.initial_learning_rate)
                       .add(std::uint64_t(opt.collective))
                       .add(opt.compare_every)
                       .add(std::uint64_t{opt.low_rank})
                       .add(std::uint64_t{opt.high_rank})
                       .value();
  }

  //! Kept fraction per layer from its level (the rank: plan_settings()); the whole-buffer
  //! fraction is the numel-weighted mean over the compressed layers (the same total
  //! budget). Records the number of ranks (agreed() divides the sums by it).
  void plan(step_params& p) {
    ranks_ = p.ranks > 0 ? p.ranks : 1;
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
    p.gain_candidates.clear();
  }

  //! PowerSGD's settings for the step plan() planned: the rank of each layer from its level
  //! (0 for a dense layer: the compressor's own, unused since the layer is sent raw).
  void plan_settings(powersgd_settings& s) const {
    s.approximation_rank.resize(levels_.size());
    for (std::size_t i = 0; i < levels_.size(); ++i) s.approximation_rank[i] = rank(levels_[i]);
  }

  //! Trainer hook, every step before aggregation: adds this rank's flat local gradient
  //! (layout order) to the accumulators of the compressed layers.
  void accumulate(std::span<const float> local_grad) { accumulate(local_grad, 0, numel_.size()); }
  //! Trainer hook of a bucketed step: adds the layers [\p first_layer, \p last_layer) of
  //! this rank's flat local gradient (layout order; only those layers are read). The trainer
  //! hands a step's buckets from the last layer to the first, so the step is counted once,
  //! by the range that holds layer 0.
  void accumulate(std::span<const float> local_grad, std::size_t first_layer, std::size_t last_layer) {
    if (local_grad.size() != numel_total_)
      throw error(status::invalid_argument, "accordion_policy::accumulate: the gradient has " +
                                                std::to_string(local_grad.size()) + " elements, the layout " +
                                                std::to_string(numel_total_));
    for (const auto& s : segments_) {
      if (s.layer < first_layer || s.layer >= last_layer) continue;
      float* a = acc_.data() + s.acc_at;
      const float* g = local_grad.data() + s.offset;
      for (std::size_t j = 0; j < s.numel; ++j) a[j] += g[j];
    }
    if (first_layer == 0) ++accumulated_;
  }

  //! Trainer hook, before each step's collective: the per-layer ||A_l|| of a decision
  //! waiting to be summed over the ranks (0 for dense layers); empty when none is.
  [[nodiscard]] std::span<const double> agreement_request() const noexcept { return request_; }

  //! Trainer hook, after the collective that carried the request: \p sums are its sums over
  //! the ranks. Takes the decision (it applies from the next plan()).
  void agreed(std::span<const double> sums) {
    if (request_.empty()) return;
    if (sums.size() != request_.size())
      throw error(status::invalid_argument, "accordion_policy::agreed: " + std::to_string(sums.size()) +
                                                " sums for a request of " + std::to_string(request_.size()));
    const double inv = 1.0 / ranks_;
    for (std::size_t i = 0; i < request_.size(); ++i) request_[i] = sums[i] * inv;
    decide(request_);
    request_.clear();
  }

  //! Counts the step; closes the interval after `interval_steps` steps (when set).
  void observe(const step_report& r) {
    if (r.skipped) return;
    ++steps_;
    if (opt_.interval_steps > 0 && steps_ == opt_.interval_steps) end_of_interval();
  }

  //! Closes the interval when intervals are epochs, and sees the learning rate (a decay
  //! sends every compressed layer low until the next decision).
  void on_interval(const interval_info& info) {
    if (opt_.interval_steps == 0) end_of_interval();
    if (learning_rate_ > 0 && info.learning_rate < learning_rate_) {
      for (auto& l : levels_)
        if (l != accordion_level::dense) l = accordion_level::low;
      // A decision in flight was measured before the decay: it must not lift the layers.
      if (!request_.empty()) hold_low_ = true;
    }
    learning_rate_ = info.learning_rate;
  }

  //! Appends the decision state (versioned) to \p out: levels, the previous decision's
  //! statistics, counters and flags. It is the same on every rank (checkpoints compare it);
  //! the rank-local part (accumulators, the pending request's local norms) is save_local()'s.
  void save(std::vector<std::byte>& out) const {
    detail::state_writer w(out);
    w.header(state_tag, state_version, fingerprint_);
    detail::save_fields<persistent_fields>(w, *this);
  }
  //! Restores what save() wrote; throws gravac::error (and changes nothing) on bytes from
  //! another policy, version, options or layout, or on truncated or inconsistent bytes.
  //! The accumulators restart from zero, and a decision in flight from zero norms (every
  //! layer critical), until load_local() restores this rank's part.
  void load(std::span<const std::byte> in) {
    detail::state_reader r(in, "accordion_policy");
    r.header(state_tag, state_version, fingerprint_);
    detail::load_fields<persistent_fields>(r, *this, [&](const state_stage& s) { check_loaded(s, r); });
    std::fill(acc_.begin(), acc_.end(), 0.0f);
  }

  //! Appends this rank's own state (versioned) to \p out: the accumulators of its gradient
  //! and, while a decision is in flight, its local norms. Checkpoints keep it per rank,
  //! beside the residual.
  void save_local(std::vector<std::byte>& out) const {
    detail::state_writer w(out);
    w.header(local_tag, state_version, fingerprint_);
    w.put<std::uint8_t>(!request_.empty());
    w.put_vector(acc_);
    if (!request_.empty()) w.put_vector(request_);
  }
  //! Restores what save_local() wrote, after load() (it must belong to the same decision
  //! state: a decision in flight on both sides or on neither); throws gravac::error and
  //! changes nothing otherwise, or on truncated or corrupt bytes.
  void load_local(std::span<const std::byte> in) {
    detail::state_reader r(in, "accordion_policy");
    r.header(local_tag, state_version, fingerprint_);
    const auto pending = r.get<std::uint8_t>();
    if (pending > 1) r.fail("corrupt flag");
    if ((pending != 0) != decision_pending())
      r.fail("the rank-local state does not match the decision state (a decision in flight on one side only)");
    std::vector<float> acc;
    std::vector<double> request;
    r.get_vector(acc, acc_.size());
    if (pending) r.get_vector(request, levels_.size());
    r.finish();
    if (negative(request)) r.fail("a negative norm");
    acc_ = std::move(acc);
    std::copy(request.begin(), request.end(), request_.begin());
  }

  //! The level of layer \p i for the next step.
  [[nodiscard]] accordion_level level(std::size_t i) const { return levels_.at(i); }
  //! The levels of all layers for the next step.
  [[nodiscard]] std::span<const accordion_level> levels() const noexcept { return levels_; }
  //! The kept fraction of a level.
  [[nodiscard]] double fraction(accordion_level l) const noexcept {
    return l == accordion_level::low    ? opt_.low_compression
           : l == accordion_level::high ? opt_.high_compression
                                        : dense_fraction;
  }
  //! The PowerSGD rank of a level (0 for dense: the layer is sent raw).
  [[nodiscard]] std::uint32_t rank(accordion_level l) const noexcept {
    return l == accordion_level::low ? opt_.low_rank : l == accordion_level::high ? opt_.high_rank : 0;
  }
  //! r of each layer at the last decision (NaN before the first comparison).
  [[nodiscard]] std::span<const double> change_ratios() const noexcept { return ratio_; }
  //! Per layer, the rank-averaged ||A_l|| of the last decision: what the next one compares with.
  [[nodiscard]] std::span<const double> decision_norms() const noexcept { return norm_prev_; }
  //! Per layer ||A_l|| of this rank's interval in progress (0 for dense layers).
  [[nodiscard]] std::vector<double> local_interval_norms() const {
    std::vector<double> out(levels_.size(), 0.0);
    for (const auto& s : segments_) out[s.layer] = norm_of(s);
    return out;
  }
  //! True while a decision waits for the sums of its statistics over the ranks.
  [[nodiscard]] bool decision_pending() const noexcept { return !request_.empty(); }
  //! Intervals completed.
  [[nodiscard]] std::uint64_t intervals() const noexcept { return intervals_; }
  //! Decisions taken.
  [[nodiscard]] std::uint64_t decisions() const noexcept { return decisions_; }
  //! The options.
  [[nodiscard]] const options& get_options() const noexcept { return opt_; }

 private:
  static constexpr std::uint32_t state_tag = 0x44434341;  // "ACCD"
  static constexpr std::uint32_t local_tag = 0x4c434341;  // "ACCL"

  // Norms and ratios are >= 0 (NaN or infinity only from gradients that were not finite).
  static bool negative(const std::vector<double>& v) {
    return std::any_of(v.begin(), v.end(), [](double x) { return x < 0; });
  }

  // A compressed layer's place in the gradient and in the accumulators.
  struct segment {
    std::size_t layer, offset, numel, acc_at;
  };

  // ||A_l|| in double: float squares overflow above about 1.8e19.
  [[nodiscard]] double norm_of(const segment& s) const noexcept {
    double sq = 0;
    for (std::size_t j = 0; j < s.numel; ++j) sq += static_cast<double>(acc_[s.acc_at + j]) * acc_[s.acc_at + j];
    return std::sqrt(sq);
  }

  // An interval without steps (two end_interval calls in a row) is no interval.
  void end_of_interval() {
    if (steps_ == 0) return;
    if (accumulated_ == 0 && !segments_.empty())
      throw error(status::invalid_argument,
                  "accordion_policy: an interval ended without any accumulated gradient (the trainer calls "
                  "accumulate() only for host-memory gradients; Accordion needs them)");
    ++intervals_;
    if ((intervals_ - 1) % opt_.compare_every == 0) {
      // A request still unanswered here (no step carried it) is superseded by the newer one.
      request_.assign(levels_.size(), 0.0);
      for (const auto& s : segments_) request_[s.layer] = norm_of(s);
    }
    std::fill(acc_.begin(), acc_.end(), 0.0f);
    steps_ = 0;
    accumulated_ = 0;
  }

  // The rule on the rank-averaged statistics \p avg of the interval that just ended.
  void decide(std::span<const double> avg) {
    for (std::size_t i = 0; i < levels_.size(); ++i) {
      if (levels_[i] == accordion_level::dense) continue;  // empty layers too: their norm is 0
      if (!has_prev_) {
        levels_[i] = accordion_level::low;
        continue;
      }
      const double prev = norm_prev_[i], cur = avg[i];
      const double r = prev > 0                ? std::fabs(prev - cur) / prev
                       : cur > 0               ? std::numeric_limits<double>::infinity()
                       : prev == 0 && cur == 0 ? 0.0
                                               : std::numeric_limits<double>::quiet_NaN();
      ratio_[i] = r;
      levels_[i] = hold_low_ || !(r < opt_.eta) ? accordion_level::low : accordion_level::high;
    }
    std::copy(avg.begin(), avg.end(), norm_prev_.begin());
    has_prev_ = true;
    hold_low_ = false;
    ++decisions_;
  }

  options opt_;
  std::vector<double> numel_;
  std::size_t numel_total_ = 0;
  std::vector<segment> segments_;
  std::uint64_t fingerprint_ = 0;
  int ranks_ = 1;  // from the last plan(); not state: every step plans before it agrees
  // Decision state: save() / load(), but the values of acc_ and request_: save_local() / load_local().
  std::vector<accordion_level> levels_;
  std::vector<float> acc_;         // A_l of the compressed layers, back to back
  std::vector<double> norm_prev_;  // rank-averaged n_l of the last decision
  std::vector<double> ratio_;      // r of the last decision
  std::vector<double> request_;    // ||A_l|| waiting to be summed over the ranks; empty: none
  std::uint64_t steps_ = 0;        // steps observed in the interval in progress
  std::uint64_t accumulated_ = 0;  // accumulate() calls in the interval in progress
  std::uint64_t intervals_ = 0;
  std::uint64_t decisions_ = 0;
  double learning_rate_ = 0;
  bool has_prev_ = false;
  bool hold_low_ = false;

  // The decision state a checkpoint holds, in the order of its bytes. Of the request only
  // whether one is pending is shared (the local norms are save_local()'s).
  using self = accordion_policy;
  static std::uint8_t pending_of(const std::vector<double>& request) noexcept { return !request.empty(); }
  // Every rank has the request or none (its length shapes the step's collective).
  static void restore_pending(const detail::state_reader& r, std::uint8_t pending, std::vector<double>& request,
                              const accordion_policy& current) {
    if (pending > 1) r.fail("corrupt flag");
    if (pending)
      request.assign(current.levels_.size(), 0.0);
    else
      request.clear();
  }
  using persistent_fields =
      detail::field_list<detail::field<&self::levels_>, detail::field<&self::norm_prev_>, detail::field<&self::ratio_>,
                         detail::field<&self::steps_>, detail::field<&self::accumulated_>,
                         detail::field<&self::intervals_>, detail::field<&self::decisions_>,
                         detail::field<&self::learning_rate_>,
                         detail::encoded<std::uint8_t, &self::pending_of, &self::restore_pending, &self::request_>,
                         detail::field<&self::has_prev_>, detail::field<&self::hold_low_>>;
  using state_stage = detail::field_stage<accordion_policy, persistent_fields>;

  // Refuses a loaded state these options and this layout cannot hold (corrupt bytes).
  void check_loaded(const state_stage& s, const detail::state_reader& r) const {
    const auto& levels = s.get<&self::levels_>();
    const bool pending = !s.get<&self::request_>().empty(), has_prev = s.get<&self::has_prev_>();
    const auto decisions = s.get<&self::decisions_>();
    bool any_high = false, all_low = true;
    for (std::size_t i = 0; i < levels.size(); ++i) {
      if (levels[i] > accordion_level::dense) r.fail("unknown level");
      const bool dense = levels[i] == accordion_level::dense;
      if (dense != (levels_[i] == accordion_level::dense)) r.fail("a layer's dense flag differs from the layout");
      any_high |= levels[i] == accordion_level::high;
      all_low &= dense || levels[i] == accordion_level::low;
    }
    if (negative(s.get<&self::norm_prev_>()) || negative(s.get<&self::ratio_>())) r.fail("a negative norm or ratio");
    if (opt_.interval_steps > 0 && s.get<&self::steps_>() >= opt_.interval_steps)
      r.fail("more steps than an interval holds");
    const double lr = s.get<&self::learning_rate_>();
    if (!std::isfinite(lr) || lr < 0) r.fail("invalid learning rate");
    if (!has_prev && (any_high || decisions != 0)) r.fail("a decision without statistics");
    if (s.get<&self::hold_low_>() && (!pending || !all_low))
      r.fail("a hold after a decay without its decision in flight");
    if (decisions > s.get<&self::intervals_>()) r.fail("more decisions than intervals");
  }
};
static_assert(Policy<accordion_policy>);

}  // namespace gravac
