#pragma once
//! \file moo_policy.hpp
//! \brief moo_policy: the multi-objective choice of the kept fraction of the
//! flexible-communication paper (Tyagi & Swany 2023, arXiv 2312.02493), without replaying
//! batches: the gain curve of the live step gives gain(f) at every candidate.
//!
//! Its inputs are rank averages carried by the step's own collective (or a modeled clock
//! every rank shares), so all ranks decide alike; the steps and why: docs/algorithms.md,
//! "Multi-objective choice of f".

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "gravac/concepts/composition.hpp"
#include "gravac/concepts/concepts.hpp"
#include "gravac/core/error.hpp"
#include "gravac/network/cost_model.hpp"
#include "gravac/network/network_estimate.hpp"
#include "gravac/network/network_profile.hpp"
#include "gravac/network/network_source.hpp"
#include "gravac/policy/detail/persistent_fields.hpp"
#include "gravac/policy/detail/policy_state.hpp"
#include "gravac/policy/moo_choice.hpp"

namespace gravac {

//! Options of moo_policy.
struct moo_policy_options {
  std::uint64_t warmup_steps = 100;    //!< warm-up length in steps (used when warmup_intervals is 0)
  std::uint64_t warmup_intervals = 0;  //!< warm-up length in intervals (epochs); 0: use warmup_steps
  double warmup_start = 1.0;           //!< kept fraction at the first warm-up step
  double warmup_end = 0.1;             //!< kept fraction at the last warm-up step
  std::vector<double> candidates{0.1, 0.033, 0.011, 0.004, 0.001};  //!< kept fractions evaluated
  double weight_time = 0.6;                                         //!< ASF weight of the communication time
  double weight_gain = 0.4;                                         //!< ASF weight of the information loss 1/gain
  double gain_change = 0.1;     //!< re-decide when the smoothed relative change of gain reaches this
  double gain_smoothing = 0.2;  //!< EWMA weight of the newest gain curve, in (0, 1]
  double network_change = 0.2;  //!< re-decide when alpha or beta move by this (relative)
  network_source source = network_source::measured;         //!< where alpha and beta come from
  network_params network{};                                 //!< fixed network, and the prior of the fitted estimate
  std::shared_ptr<const network_profile> profile{};         //!< step-indexed profile for network_source::profile
  collective_kind collective = collective_kind::automatic;  //!< the collective to use (and to price)
  bool ar_topk_possible = true;                             //!< automatic: the compressor can use AR-Topk
  std::size_t scan_points = 1001;                           //!< points of the dense scan of log f
  bool one_dim_dense = false;                               //!< send 1-D tensors (biases, norms) uncompressed
};

//! Multi-objective (time vs information loss) choice of the kept fraction. Models Policy.
class moo_policy {
 public:
  //! Opt-in tag for the Policy concept.
  using policy_tag = void;
  //! What it decides (composition.hpp): the kept fraction (and the collective).
  static constexpr decision decides = decision::kept_fraction;
  //! Options (see moo_policy_options).
  using options = moo_policy_options;
  //! Gains and times must be averaged (maxed) over ranks before observe.
  static constexpr bool needs_statistics = true;

  //! A policy for \p lay; rejects options out of their domain.
  moo_policy(const layout& lay, const options& opt = {})
      : layout_(lay),
        options_(opt),
        chooser_(std::max<std::size_t>(opt.scan_points, 2)),
        estimate_(network_estimate_options{.window = 64, .prior = opt.network}) {
    require(!opt.candidates.empty(), "moo_policy: at least one candidate fraction is required");
    for (double c : opt.candidates)
      require(c > 0 && c < 1, "moo_policy: candidate fractions must be in (0, 1), got " + std::to_string(c));
    require(opt.warmup_start > 0 && opt.warmup_start <= 1 && opt.warmup_end > 0 && opt.warmup_end <= 1,
            "moo_policy: warm-up fractions must be in (0, 1]");
    require(opt.weight_time >= 0 && opt.weight_gain >= 0 && opt.weight_time + opt.weight_gain > 0,
            "moo_policy: weights must be >= 0 and not both 0");
    require(opt.gain_change > 0 && opt.network_change > 0, "moo_policy: change thresholds must be > 0");
    require(opt.gain_smoothing > 0 && opt.gain_smoothing <= 1, "moo_policy: gain_smoothing must be in (0, 1]");
    require(opt.scan_points >= 2, "moo_policy: scan_points must be >= 2");
    require(opt.source != network_source::profile || opt.profile != nullptr,
            "moo_policy: network_source::profile needs options.profile");
    require(opt.network.alpha > 0 && opt.network.beta > 0, "moo_policy: network alpha and beta must be > 0");
    compressible_.assign(lay.size(), true);
    for (std::size_t i = 0; i < lay.size(); ++i) {
      if (opt.one_dim_dense && lay[i].rank() <= 1) compressible_[i] = false;
      (compressible_[i] ? d_comp_ : d_dense_) += static_cast<double>(lay[i].numel);
    }
    smoothed_.assign(opt.candidates.size(), 0.0);
    reference_.assign(opt.candidates.size(), 0.0);
    losses_.assign(opt.candidates.size(), 1.0);
  }

  //! Fills the kept fractions (warm-up value or the chosen one), the collective and the
  //! gain candidates for step params.step.
  void plan(step_params& p) {
    ranks_ = std::max(p.ranks, 1);
    step_ = p.step;
    const double f = current_fraction(p.step);
    for (std::size_t i = 0; i < layout_.size(); ++i) p.kept_fraction[i] = compressible_[i] ? f : dense_fraction;
    p.global_fraction = f;
    p.collective = options_.collective;
    p.gain_candidates = options_.candidates;
    last_planned_ = f;
  }

  //! Learns the gain curve and the network from the (rank-synchronised) report, and
  //! re-decides after the warm-up when the gain or the network changed enough.
  void observe(const step_report& r) {
    steps_seen_ = r.step + 1;
    if (r.gain_curve.size() == smoothed_.size()) {
      const double a = has_gain_ ? options_.gain_smoothing : 1.0;
      for (std::size_t c = 0; c < smoothed_.size(); ++c) smoothed_[c] = (1 - a) * smoothed_[c] + a * r.gain_curve[c];
      has_gain_ = true;
    }
    learn_network(r);
    if (in_warmup(steps_seen_) || !has_gain_) return;
    const network_params net = network_at(steps_seen_);
    if (!decided_ || gain_moved() || network_moved(net)) decide(net);
  }

  //! Counts intervals for an interval-based warm-up.
  void on_interval(const interval_info& info) {
    ++intervals_;
    interval_start_step_ = info.step;
  }

  //! Serialises the state (decision, smoothed gains, warm-up progress, network reference)
  //! into \p out, replacing what it held: the fields of persistent_fields, in order.
  void save(std::vector<std::byte>& out) const {
    out.clear();
    detail::state_writer w(out);
    detail::save_fields<persistent_fields>(w, *this);
  }
  //! Restores a state written by save; throws gravac::error (and changes nothing) on a
  //! candidate count or format mismatch, or on truncated bytes.
  void load(std::span<const std::byte> in) {
    detail::state_reader r(in, "moo_policy");
    detail::load_fields<persistent_fields>(r, *this, [](const auto&) {});  // any values are valid
  }

  //! The kept fraction of step \p step (warm-up value until the first decision).
  [[nodiscard]] double current_fraction(std::uint64_t step) const noexcept {
    if (decided_) return chosen_;
    return warmup_fraction(step);
  }
  //! The last decision's point.
  [[nodiscard]] const moo_decision& last_decision() const noexcept { return decision_; }
  //! Decisions taken so far.
  [[nodiscard]] std::uint64_t decisions() const noexcept { return decisions_; }
  //! Whether the warm-up is over and a fraction was chosen.
  [[nodiscard]] bool decided() const noexcept { return decided_; }
  //! The smoothed gain at each candidate.
  [[nodiscard]] std::span<const double> smoothed_gains() const noexcept { return smoothed_; }
  //! The network used by the last decision.
  [[nodiscard]] const network_params& decision_network() const noexcept { return ref_net_; }
  //! The chooser (its last scan and Pareto front).
  [[nodiscard]] const moo_chooser& chooser() const noexcept { return chooser_; }
  //! Modeled communication seconds at kept fraction \p f (of the compressed layers) under
  //! \p net for \p ranks ranks: what the policy minimises.
  [[nodiscard]] double modeled_time(double f, const network_params& net, int ranks) const {
    const double d = d_comp_ + d_dense_;
    const double fe = d > 0 ? (d_dense_ + f * d_comp_) / d : 1.0;
    const auto c = cost_model::candidate_costs(ranks, d, fe, net, allreduce_algorithm::ring, options_.ar_topk_possible);
    switch (options_.collective) {
      case collective_kind::dense_allreduce:
        return c[0];
      case collective_kind::allreduce_compatible:
        return c[1];
      case collective_kind::allgather:
        return c[2];
      default:
        return std::min({c[0], c[1], c[2]});
    }
  }

 private:
  static constexpr std::uint64_t magic = 0x31304f4f4d415647ull;  // "GVAMOO01"

  [[nodiscard]] bool in_warmup(std::uint64_t steps_done) const noexcept {
    return options_.warmup_intervals > 0 ? intervals_ < options_.warmup_intervals : steps_done < options_.warmup_steps;
  }
  [[nodiscard]] double warmup_fraction(std::uint64_t step) const noexcept {
    const double a = options_.warmup_start, b = options_.warmup_end;
    double progress = 1;
    if (options_.warmup_intervals > 0) {
      progress = options_.warmup_intervals > 1
                     ? static_cast<double>(intervals_) / static_cast<double>(options_.warmup_intervals - 1)
                     : 1.0;
    } else if (options_.warmup_steps > 1) {
      progress = static_cast<double>(step) / static_cast<double>(options_.warmup_steps - 1);
    }
    return a + (b - a) * std::clamp(progress, 0.0, 1.0);
  }
  [[nodiscard]] network_params network_at(std::uint64_t step) const {
    switch (options_.source) {
      case network_source::fixed:
        return options_.network;
      case network_source::profile:
        return options_.profile->at(step, 0.0);
      default:
        return estimate_.params();
    }
  }
  // Feeds the estimate with the step's (rank-synchronised) time and the cost terms of the
  // collective that ran at the planned fraction: identical inputs on every rank.
  void learn_network(const step_report& r) {
    if (options_.source != network_source::measured && options_.source != network_source::modeled) return;
    const double d = d_comp_ + d_dense_;
    const double fe = d > 0 ? (d_dense_ + last_planned_ * d_comp_) / d : 1.0;
    cost_terms t{};
    switch (r.collective) {
      case collective_kind::allreduce_compatible:
        t = cost_model::ar_topk(ranks_, d, fe);
        break;
      case collective_kind::allgather:
        t = cost_model::allgather_topk(ranks_, d, fe);
        break;
      default:
        t = cost_model::dense_allreduce(ranks_, d);
        break;
    }
    if (options_.source == network_source::modeled) {
      estimate_.add(t, r.modeled_communicate_s);
    } else {  // the previous step's time, averaged over the ranks
      if (has_pending_ && r.previous_times_agreed) estimate_.add(pending_terms_, r.previous_times.communicate_s);
      pending_terms_ = t;
      has_pending_ = true;
    }
  }
  [[nodiscard]] bool gain_moved() const noexcept {
    for (std::size_t c = 0; c < smoothed_.size(); ++c)
      if (reference_[c] > 0 && std::fabs(smoothed_[c] - reference_[c]) / reference_[c] >= options_.gain_change)
        return true;
    return false;
  }
  [[nodiscard]] bool network_moved(const network_params& n) const noexcept {
    auto rel = [](double a, double b) { return b > 0 ? std::fabs(a - b) / b : (a > 0 ? INFINITY : 0.0); };
    return rel(n.alpha, ref_net_.alpha) >= options_.network_change ||
           rel(n.beta, ref_net_.beta) >= options_.network_change;
  }
  void decide(const network_params& net) {
    for (std::size_t c = 0; c < smoothed_.size(); ++c) losses_[c] = smoothed_[c] > 0 ? 1.0 / smoothed_[c] : 1e12;
    decision_ = chooser_.choose(
        options_.candidates, losses_, [&](double f) { return modeled_time(f, net, ranks_); }, options_.weight_time,
        options_.weight_gain);
    chosen_ = decision_.fraction;
    reference_ = smoothed_;  // same size: no allocation
    ref_net_ = net;
    decided_ = true;
    ++decisions_;
  }

  layout layout_;
  options options_;
  moo_chooser chooser_;
  network_estimate estimate_;
  std::vector<bool> compressible_;
  double d_comp_ = 0, d_dense_ = 0;
  std::vector<double> smoothed_, reference_, losses_;
  bool has_gain_ = false;
  bool decided_ = false;
  double chosen_ = 1;
  double last_planned_ = 1;
  moo_decision decision_{};
  network_params ref_net_{};
  int ranks_ = 1;
  std::uint64_t step_ = 0;
  std::uint64_t steps_seen_ = 0;
  std::uint64_t intervals_ = 0;
  std::uint64_t interval_start_step_ = 0;
  std::uint64_t decisions_ = 0;
  cost_terms pending_terms_{};  // measured source: the last step's cost terms, until its time arrives
  bool has_pending_ = false;

  // What a checkpoint holds, in the order of its bytes (a format of its own: 64-bit words, no
  // policy_state header). The candidate count must match these options.
  using self = moo_policy;
  static std::uint64_t count_of(const std::vector<double>& smoothed) noexcept { return smoothed.size(); }
  static void check_count(const detail::state_reader& r, std::uint64_t n, const std::vector<double>&,
                          const moo_policy& current) {
    if (n != current.smoothed_.size()) r.fail("candidate count differs");
  }
  using persistent_fields = detail::field_list<
      detail::constant<std::uint64_t, magic>,
      detail::encoded<std::uint64_t, &self::count_of, &self::check_count, &self::smoothed_>,
      detail::packed_flags<std::uint64_t, detail::path<&self::decided_>, detail::path<&self::has_gain_>>,
      detail::field<&self::chosen_>, detail::field<&self::steps_seen_>, detail::field<&self::intervals_>,
      detail::field<&self::interval_start_step_>, detail::field<&self::ref_net_, &network_params::alpha>,
      detail::field<&self::ref_net_, &network_params::beta>, detail::field<&self::decisions_>,
      detail::interleaved<detail::path<&self::smoothed_>, detail::path<&self::reference_>>>;
};
static_assert(Policy<moo_policy>);

}  // namespace gravac
