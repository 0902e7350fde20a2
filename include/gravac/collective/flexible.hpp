#pragma once
//! \file flexible.hpp
//! \brief The flexible collective: each step runs the cheapest of dense Allreduce, AR-Topk
//! and Allgather top-k for that step's kept fraction under the current network estimate,
//! with each path's measured compression time added (charge_codec)
//! (docs/algorithms.md, "Flexible communication"). A policy can force one through
//! step_params::collective; the choice made is reported in step_report::collective.
//!
//! The choice is identical on every rank: the network comes from a fixed value, from a
//! profile (indexed by the step or by the shared virtual clock), or from a fit of
//! timings that are either modeled (deterministic) or measured: measured timings are
//! batched `sync_interval` at a time and the batch rides in the next step's own collective
//! (step_control.hpp), which averages it over the ranks before it enters the fit, so the
//! network estimate costs no collective of its own.

#include <algorithm>
#include <array>
#include <chrono>
#include <cstddef>
#include <memory>
#include <span>
#include <vector>

#include "gravac/collective/allgather.hpp"
#include "gravac/collective/allreduce_compatible.hpp"
#include "gravac/collective/dense_allreduce.hpp"
#include "gravac/collective/step_buffers.hpp"
#include "gravac/concepts.hpp"
#include "gravac/network/cost_model.hpp"
#include "gravac/network/network_estimate.hpp"
#include "gravac/network/network_profile.hpp"
#include "gravac/network/network_source.hpp"

namespace gravac {

//! Options of the flexible collective.
struct flexible_options {
  network_source source = network_source::measured;  //!< where alpha and beta come from
  network_params network{};                          //!< the fixed network, and the prior of the fitted estimate
  std::shared_ptr<const network_profile> profile{};  //!< required by network_source::profile
  allreduce_algorithm allreduce = allreduce_algorithm::ring;  //!< how AR-Topk's value Allreduce is priced
  //! Measured source: timings per batch, averaged over the ranks inside a later step's collective.
  std::size_t sync_interval = 8;
  std::size_t window = 64;                 //!< samples in the fitted estimate
  allreduce_compatible_options ar_topk{};  //!< options of the AR-Topk path
  bool dense_sends_everything = true;      //!< a dense step sends u = g + e whole (it costs the same)
  //! Add to each path's modeled communication its measured compression and decompression
  //! time (the ranks' average, smoothed): on a fast network the codec, not the wire, decides
  //! whether compression pays. A path not run yet counts as free, so it is tried once.
  bool charge_codec = true;
  double codec_smoothing = 0.2;  //!< weight of the newest codec time in its EWMA, in (0, 1]
};

//! Picks dense Allreduce, AR-Topk or Allgather per step by the cost model. Models Collective.
class flexible {
 public:
  //! Opt-in tag for the Collective concept.
  using collective_tag = void;
  //! Options (see flexible_options).
  using options = flexible_options;
  //! Any compressor: AR-Topk is only considered for those with an index hook.
  template <class C>
  static constexpr bool accepts = true;

  //! The three candidates in the order of costs(): dense, AR-Topk, Allgather.
  static constexpr std::array<collective_kind, 3> candidates{
      collective_kind::dense_allreduce, collective_kind::allreduce_compatible, collective_kind::allgather};

  //! A collective for \p lay; rejects a profile source without a profile and a zero interval.
  flexible(const layout& lay, const options& opt = {})
      : layout_(lay),
        options_(opt),
        dense_(lay),
        allgather_(lay),
        ar_(lay, opt.ar_topk),
        estimate_(network_estimate_options{.window = std::max<std::size_t>(opt.window, 2), .prior = opt.network}) {
    require(opt.source != network_source::profile || opt.profile != nullptr,
            "flexible: network_source::profile needs options.profile");
    require(opt.sync_interval >= 1, "flexible: sync_interval must be >= 1");
    require(opt.window >= 2, "flexible: window must be >= 2");
    require(opt.codec_smoothing > 0 && opt.codec_smoothing <= 1, "flexible: codec_smoothing must be in (0, 1]");
    pending_terms_.reserve(4 * opt.sync_interval);
    pending_seconds_.reserve(4 * opt.sync_interval);
  }

  //! Sizes the workspaces of the three paths once.
  template <Compressor C>
  void prepare(const C& c) {
    dense_.prepare(c);
    allgather_.prepare(c);
    if constexpr (IndexSelector<C>) ar_.prepare(c);
    dense_params_.kept_fraction.assign(layout_.size(), dense_fraction);
  }

  //! Runs one step with the cheapest collective (or the one params.collective forces).
  //! The report's bytes, wire bytes included, are those of the path that ran: the choice
  //! and the network fit make no call of their own (their values ride in the step's).
  template <Compressor C, Communicator M>
  void aggregate(C& c, M& comm, step_buffers<typename C::memory_space>& buf, const step_params& p, compress_stats& st,
                 step_report& r) {
    const int n = comm.size();
    const double d = static_cast<double>(layout_.numel());
    const double f = kept_fraction_of(p);
    net_ = network_now(comm, p.step);
    costs_ = costs(n, d, f, net_, IndexSelector<C> ? options_.allreduce : allreduce_algorithm::ring, IndexSelector<C>);
    for (std::size_t k = 0; k < costs_.size(); ++k) totals_[k] = costs_[k] + (options_.charge_codec ? codec_[k] : 0.0);
    collective_kind kind = p.collective;
    if (kind == collective_kind::automatic) {
      const auto cheapest = std::min_element(totals_.begin(), totals_.end()) - totals_.begin();
      kind = f >= 1 ? collective_kind::dense_allreduce : candidates[static_cast<std::size_t>(cheapest)];
    }
    const double modeled0 = modeled(comm);
    step_control& ctl = control_or_own(buf.control, own_control_);
    step_buffers<typename C::memory_space> b = buf;
    b.control = &ctl;
    // The previous step's codec time (this rank's) rides in this step's collective.
    std::size_t codec_slot = step_control::no_slot;
    if (options_.charge_codec && has_last_codec_) {
      codec_slot = ctl.reserve(1);
      ctl.local(codec_slot) = static_cast<float>(last_codec_s_);
    }
    // A full batch of measured timings rides in this step's collective.
    std::size_t batch_slot = step_control::no_slot;
    const std::size_t batch = pending_seconds_.size();
    if (options_.source == network_source::measured && batch >= options_.sync_interval) {
      batch_slot = ctl.reserve(batch);
      for (std::size_t i = 0; i < batch; ++i) ctl.local(batch_slot + i) = static_cast<float>(pending_seconds_[i]);
    }
    cost_terms terms{};
    switch (kind) {
      case collective_kind::allreduce_compatible:
        if constexpr (IndexSelector<C>) {
          ar_.aggregate(c, comm, b, p, st, r);
          terms = ar_terms(n, d, f);
        } else {
          throw error(status::invalid_argument,
                      "flexible: AR-Topk was forced but the compressor cannot sum values at shared indices",
                      comm.rank());
        }
        break;
      case collective_kind::allgather:
        allgather_.aggregate(c, comm, b, p, st, r);
        terms = cost_model::allgather_topk(n, d, f);
        break;
      case collective_kind::dense_allreduce:
      case collective_kind::automatic:
        if (options_.dense_sends_everything && !p.all_dense()) {
          copy_scalars(p);
          dense_.aggregate(c, comm, b, dense_params_, st, r);
        } else {
          dense_.aggregate(c, comm, b, p, st, r);
        }
        terms = cost_model::dense_allreduce(n, d);
        break;
      case collective_kind::compressed_allreduce:
        // Not one of its three paths: a step that ran none would leave the gradient unaveraged.
        throw error(status::invalid_argument,
                    "flexible: compressed_allreduce was forced but is not one of its paths (dense, AR-Topk, "
                    "Allgather); use the compressed_allreduce collective",
                    comm.rank());
    }
    if (codec_slot != step_control::no_slot && ctl.has_sums()) {
      const double mean = static_cast<double>(ctl.sum(codec_slot)) / n;
      double& e = codec_[index_of(last_)];
      e = codec_known_[index_of(last_)] ? e + options_.codec_smoothing * (mean - e) : mean;
      codec_known_[index_of(last_)] = true;
    }
    last_ = r.collective;
    last_codec_s_ = r.compress_s + r.decompress_s;
    has_last_codec_ = true;
    if (batch_slot != step_control::no_slot && ctl.has_sums()) {
      for (std::size_t i = 0; i < batch; ++i)
        estimate_.add(pending_terms_[i], static_cast<double>(ctl.sum(batch_slot + i)) / n);
      pending_terms_.clear();
      pending_seconds_.clear();
    }
    record(terms, options_.source == network_source::modeled ? modeled(comm) - modeled0 : r.communicate_s);
  }

  //! Gives what the last step sent back to the residual (see allgather::return_sent).
  template <Compressor C>
  void return_sent(C& c, step_buffers<typename C::memory_space>& buf) {
    switch (last_) {
      case collective_kind::allreduce_compatible:
        if constexpr (IndexSelector<C>) ar_.return_sent(c, buf);
        break;
      case collective_kind::allgather:
        allgather_.return_sent(c, buf);
        break;
      default:
        dense_.return_sent(c, buf);
        break;
    }
  }

  //! Modeled seconds of dense Allreduce, AR-Topk and Allgather top-k (in that order) for N
  //! ranks, d parameters, kept fraction f under \p net; AR-Topk is +infinity when the
  //! compressor has no index hook (\p ar_possible false). Same as cost_model::candidate_costs.
  static std::array<double, 3> costs(int n, double d, double f, const network_params& net,
                                     allreduce_algorithm a = allreduce_algorithm::ring, bool ar_possible = true) {
    return cost_model::candidate_costs(n, d, f, net, a, ar_possible);
  }

  //! The kept fraction of the whole buffer that \p p sends: sum of kept counts over d.
  [[nodiscard]] double kept_fraction_of(const step_params& p) const {
    require(p.kept_fraction.size() == layout_.size(), "flexible: one kept fraction per layer is required");
    std::size_t k = 0;
    for (std::size_t i = 0; i < layout_.size(); ++i)
      k += p.kept_fraction[i] >= dense_fraction ? layout_[i].numel : kept_count(layout_[i].numel, p.kept_fraction[i]);
    return layout_.numel() ? static_cast<double>(k) / static_cast<double>(layout_.numel()) : 1.0;
  }

  //! The collective used by the last step.
  [[nodiscard]] collective_kind last_choice() const noexcept { return last_; }
  //! The modeled communication costs the last step compared (dense, AR-Topk, Allgather).
  [[nodiscard]] const std::array<double, 3>& last_costs() const noexcept { return costs_; }
  //! The smoothed codec seconds of each path (dense, AR-Topk, Allgather; 0 until it ran),
  //! the ranks' average, added to last_costs() when charge_codec is set.
  [[nodiscard]] const std::array<double, 3>& codec_seconds() const noexcept { return codec_; }
  //! The network the last step was priced with.
  [[nodiscard]] const network_params& last_network() const noexcept { return net_; }
  //! The fitted estimate (measured and modeled sources).
  [[nodiscard]] const network_estimate& estimate() const noexcept { return estimate_; }
  //! The AR-Topk path (index rank of the last AR-Topk step, ...).
  [[nodiscard]] const allreduce_compatible& ar_topk() const noexcept { return ar_; }

 private:
  static std::size_t index_of(collective_kind k) noexcept {
    return k == collective_kind::allreduce_compatible ? 1 : k == collective_kind::allgather ? 2 : 0;
  }
  template <class M>
  static double modeled(M& comm) {
    if constexpr (requires { comm.modeled_seconds(); })
      return comm.modeled_seconds();
    else
      return 0.0;
  }
  template <class M>
  network_params network_now(M& comm, std::uint64_t step) const {
    switch (options_.source) {
      case network_source::fixed:
        return options_.network;
      case network_source::profile:
        return options_.profile->at(step, modeled(comm));
      default:
        return estimate_.params();
    }
  }
  // What an AR-Topk step sent, for the network fit. VAR's N norms ride as floats in the
  // value Allreduce (no call of their own): N * 4 more bytes in it, no more latency.
  cost_terms ar_terms(int n, double d, double f) const {
    if (options_.ar_topk.rule != index_rank_rule::var) return cost_model::ar_topk(n, d, f, options_.allreduce);
    return cost_model::index_broadcast(n, d, f) + cost_model::allreduce(n, 4.0 * d * f + 4.0 * n, options_.allreduce);
  }
  void copy_scalars(const step_params& p) {
    dense_params_.step = p.step;
    dense_params_.seed = p.seed;
    dense_params_.global_fraction = dense_fraction;
    dense_params_.collective = collective_kind::dense_allreduce;
    dense_params_.gain_candidates = p.gain_candidates;
    dense_params_.collect_norms = p.collect_norms;
    dense_params_.ranks = p.ranks;
  }
  // Feeds the estimate. Modeled times are identical on every rank and enter at once;
  // measured ones wait in a batch that a later step's collective averages over the ranks.
  void record(const cost_terms& terms, double seconds) {
    if (options_.source == network_source::modeled) {
      estimate_.add(terms, seconds);
    } else if (options_.source == network_source::measured && pending_seconds_.size() < 4 * options_.sync_interval) {
      pending_terms_.push_back(terms);  // capacity reserved: no allocation
      pending_seconds_.push_back(seconds);
    }
  }

  layout layout_;
  options options_;
  dense_allreduce dense_;
  allgather allgather_;
  allreduce_compatible ar_;
  network_estimate estimate_;
  step_params dense_params_;
  std::vector<cost_terms> pending_terms_;
  std::vector<double> pending_seconds_;
  step_control own_control_;  // used when the caller passes no step_control
  std::array<double, 3> costs_{};
  std::array<double, 3> totals_{};  // costs_ plus the codec times
  std::array<double, 3> codec_{};   // smoothed codec seconds per path (ranks' average)
  std::array<bool, 3> codec_known_{};
  double last_codec_s_ = 0;  // this rank's codec seconds of the last step
  bool has_last_codec_ = false;
  network_params net_{};
  collective_kind last_ = collective_kind::dense_allreduce;
};
static_assert(Collective<flexible>);

}  // namespace gravac
