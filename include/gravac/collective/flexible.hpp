#pragma once
//! \file flexible.hpp
//! \brief The flexible collective: each step runs the cheapest of dense Allreduce, AR-Topk,
//! Allgather and the compressed allreduce for that step's kept fraction under the current
//! network estimate, with each path's measured compression time added (charge_codec)
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
#include "gravac/collective/compressed_allreduce.hpp"
#include "gravac/collective/dense_allreduce.hpp"
#include "gravac/collective/step_buffers.hpp"
#include "gravac/concepts/concepts.hpp"
#include "gravac/network/cost_model.hpp"
#include "gravac/network/network_estimate.hpp"
#include "gravac/network/network_profile.hpp"
#include "gravac/network/network_source.hpp"
#include "gravac/packet/raw_segment.hpp"

namespace gravac {

//! Options of the flexible collective.
struct flexible_options {
  network_source source = network_source::measured;  //!< where alpha and beta come from
  network_params network{};                          //!< the fixed network, and the prior of the fitted estimate
  std::shared_ptr<const network_profile> profile{};  //!< required by network_source::profile
  allreduce_algorithm allreduce = allreduce_algorithm::ring;  //!< how AR-Topk's value Allreduce is priced
  //! Measured source: timings per batch, averaged over the ranks inside a later step's collective.
  std::size_t sync_interval = 8;
  std::size_t window = 64;                    //!< samples in the fitted estimate
  allreduce_compatible_options ar_topk{};     //!< options of the AR-Topk path
  compressed_allreduce_options compressed{};  //!< options of the compressed-allreduce path
  bool dense_sends_everything = true;         //!< a dense step sends u = g + e whole (it costs the same)
  //! Add to each path's modeled communication its measured compression and decompression
  //! time (the ranks' average, smoothed): on a fast network the codec, not the wire, decides
  //! whether compression pays. A path not run yet counts as free, so it is tried once.
  bool charge_codec = true;
  double codec_smoothing = 0.2;  //!< weight of the newest codec time in its EWMA, in (0, 1]
};

//! Picks dense Allreduce, AR-Topk, Allgather or the compressed allreduce per step by the
//! cost model. Models Collective.
//!
//! AR-Topk is a candidate for compressors with an index hook (IndexSelector: the host form,
//! or the device form of topk_cuda and threshold_cuda, whose AR-Topk runs on the device),
//! the compressed allreduce for ShardableCompressor ones on a communicator with alltoallv.
//! Compressors with an index hook price the Allgather at 8 bytes per kept value (top-k);
//! shardable ones without it (the quantizers, sign, cast16) price it and the compressed
//! allreduce by their packet size.
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
  //! The four paths in the order of path_costs() and last_path_costs(): candidates, then
  //! the compressed allreduce (last, so that a tie keeps the three's choice).
  static constexpr std::array<collective_kind, 4> paths{
      collective_kind::dense_allreduce, collective_kind::allreduce_compatible, collective_kind::allgather,
      collective_kind::compressed_allreduce};

  //! Whether the Allgather and the compressed allreduce are priced by \p C's packet size
  //! rather than by 8 bytes per kept value: compressors that can run on shards and have no
  //! index hook, whose packets are sized by the layout and their options alone.
  template <class C>
  static constexpr bool priced_by_packet = ShardableCompressor<C> && !IndexSelector<C>;

  //! A collective for \p lay; rejects a profile source without a profile and a zero interval.
  flexible(const layout& lay, const options& opt = {})
      : layout_(lay),
        options_(opt),
        dense_(lay),
        allgather_(lay),
        ar_(lay, opt.ar_topk),
        compressed_(lay, opt.compressed),
        estimate_(network_estimate_options{.window = std::max<std::size_t>(opt.window, 2), .prior = opt.network}) {
    require(opt.source != network_source::profile || opt.profile != nullptr,
            "flexible: network_source::profile needs options.profile");
    require(opt.sync_interval >= 1, "flexible: sync_interval must be >= 1");
    require(opt.window >= 2, "flexible: window must be >= 2");
    require(opt.codec_smoothing > 0 && opt.codec_smoothing <= 1, "flexible: codec_smoothing must be in (0, 1]");
    pending_terms_.reserve(4 * opt.sync_interval);
    pending_seconds_.reserve(4 * opt.sync_interval);
  }

  //! Sizes the workspaces of the paths \p c can take once.
  template <Compressor C>
  void prepare(const C& c) {
    dense_.prepare(c);
    allgather_.prepare(c);
    if constexpr (IndexSelector<C>) ar_.prepare(c);
    if constexpr (ShardableCompressor<C>) {
      compressed_.prepare(c);
      measure_segments(c);
    }
    dense_params_.kept_fraction.assign(layout_.size(), dense_fraction);
  }

  //! Stages, before any step, a control plane of \p values values handed down by the
  //! caller plus flexible's own (its codec time and a batch of up to 4 * sync_interval
  //! timings) for \p ranks ranks, in the paths that stage one (AR-Topk on a device:
  //! allreduce_compatible::reserve_control). Call after prepare(c), between steps (the
  //! trainer calls it at construction).
  template <Compressor C>
  void reserve_control(const C& c, std::size_t values, int ranks) {
    if constexpr (IndexSelector<C>) ar_.reserve_control(c, values + 1 + 4 * options_.sync_interval, ranks);
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
    const cost_model::path_pricing how = pricing<C>(comm, p);
    costs_ = path_costs(n, d, f, net_, how);
    for (std::size_t k = 0; k < costs_.size(); ++k) totals_[k] = costs_[k] + (options_.charge_codec ? codec_[k] : 0.0);
    collective_kind kind = p.collective;
    if (kind == collective_kind::automatic) {
      const auto cheapest = std::min_element(totals_.begin(), totals_.end()) - totals_.begin();
      kind = f >= 1 ? collective_kind::dense_allreduce : paths[static_cast<std::size_t>(cheapest)];
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
        terms = cost_model::path_terms(2, n, d, f, how);
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
        if constexpr (ShardableCompressor<C> && AlltoallCommunicator<M>) {
          if (how.compressed_possible) {
            compressed_.aggregate(c, comm, b, p, st, r);
            terms = cost_model::path_terms(3, n, d, f, how);
            break;
          }
        }
        // A step that ran no path would leave the gradient unaveraged.
        throw error(status::invalid_argument,
                    ShardableCompressor<C>
                        ? "flexible: compressed_allreduce was forced but the communicator has no alltoallv (it "
                          "needs an AlltoallCommunicator: mpi_communicator, thread_communicator or a decorator)"
                        : "flexible: compressed_allreduce was forced but the compressor cannot run on shards "
                          "(ShardableCompressor: host memory, one packet per compress, copyable options)",
                    comm.rank());
    }
    ran_ = kind == collective_kind::automatic ? collective_kind::dense_allreduce : kind;
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
    // By the path that ran, not the kind it reported: a compressed allreduce of an
    // all-dense step reports a dense Allreduce but keeps what it sent itself.
    switch (ran_) {
      case collective_kind::allreduce_compatible:
        if constexpr (IndexSelector<C>) ar_.return_sent(c, buf);
        break;
      case collective_kind::allgather:
        allgather_.return_sent(c, buf);
        break;
      case collective_kind::compressed_allreduce:
        if constexpr (ShardableCompressor<C>) compressed_.return_sent(c, buf);
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
  //! Modeled seconds of the four paths (dense, AR-Topk, Allgather, compressed allreduce)
  //! for N ranks, d parameters, kept fraction f under \p net, priced as \p how says; a path
  //! it does not allow is +infinity. Same as cost_model::path_costs.
  static std::array<double, 4> path_costs(int n, double d, double f, const network_params& net,
                                          const cost_model::path_pricing& how) {
    return cost_model::path_costs(n, d, f, net, how);
  }
  //! How a step \p p with compressor \p C on communicator \p comm is priced
  //! (path_pricing): what flexible passes to path_costs, after prepare().
  template <Compressor C, class M>
  [[nodiscard]] cost_model::path_pricing pricing(const M& comm, const step_params& p) const {
    cost_model::path_pricing how;
    how.ar_possible = IndexSelector<C>;
    how.allreduce = IndexSelector<C> ? options_.allreduce : allreduce_algorithm::ring;
    how.compressed_possible = ShardableCompressor<C> && has_alltoallv(comm);
    how.allgather_by_packet = priced_by_packet<C>;
    how.packet_bytes = packet_bytes_of(p);
    return how;
  }
  //! P, the bytes of one rank's whole packet at the kept fractions of \p p: the packet
  //! header, then per layer its raw segment (fraction 1) or its coded one, as measured by
  //! prepare(). 0 before prepare() of a shardable compressor.
  [[nodiscard]] double packet_bytes_of(const step_params& p) const {
    if (coded_bytes_.empty()) return 0.0;
    double b = header_bytes_;
    for (std::size_t i = 0; i < layout_.size(); ++i) {
      if (layout_[i].numel == 0) continue;
      const bool raw = p.kept_fraction.size() == layout_.size() && p.kept_fraction[i] >= dense_fraction;
      b += raw ? static_cast<double>(raw_segment_bytes(layout_[i].numel)) : coded_bytes_[i];
    }
    return b;
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
  //! The modeled communication costs the last step compared (dense, AR-Topk, Allgather);
  //! last_path_costs() adds the compressed allreduce.
  [[nodiscard]] std::array<double, 3> last_costs() const noexcept { return {costs_[0], costs_[1], costs_[2]}; }
  //! The modeled communication costs of the four paths the last step compared, in the
  //! order of paths (+infinity for a path it could not take).
  [[nodiscard]] const std::array<double, 4>& last_path_costs() const noexcept { return costs_; }
  //! The smoothed codec seconds of each path (dense, AR-Topk, Allgather; 0 until it ran),
  //! the ranks' average, added to last_costs() when charge_codec is set.
  [[nodiscard]] std::array<double, 3> codec_seconds() const noexcept { return {codec_[0], codec_[1], codec_[2]}; }
  //! codec_seconds() of the four paths, in the order of paths.
  [[nodiscard]] const std::array<double, 4>& path_codec_seconds() const noexcept { return codec_; }
  //! The network the last step was priced with.
  [[nodiscard]] const network_params& last_network() const noexcept { return net_; }
  //! The fitted estimate (measured and modeled sources).
  [[nodiscard]] const network_estimate& estimate() const noexcept { return estimate_; }
  //! The AR-Topk path (index rank of the last AR-Topk step, ...).
  [[nodiscard]] const allreduce_compatible& ar_topk() const noexcept { return ar_; }
  //! The compressed-allreduce path (its server residual, ...).
  [[nodiscard]] const compressed_allreduce& compressed() const noexcept { return compressed_; }

  //! Saves the compressed-allreduce path's server residual (nothing before it first ran):
  //! the one state of a path that outlives its step, carried by the trainer's checkpoint.
  void save(std::vector<std::byte>& out) const { compressed_.save(out); }
  //! Restores what save() wrote (see compressed_allreduce::load).
  void load(std::span<const std::byte> in) { compressed_.load(in); }

 private:
  static std::size_t index_of(collective_kind k) noexcept {
    switch (k) {
      case collective_kind::allreduce_compatible:
        return 1;
      case collective_kind::allgather:
        return 2;
      case collective_kind::compressed_allreduce:
        return 3;
      default:
        return 0;
    }
  }
  // Measures once what each layer's coded segment weighs, and the packet header: a
  // compressor of c's kind and options over that layer alone codes zeros at a kept
  // fraction below 1. max_packet_bytes() would be no price: it bounds each layer by its raw
  // segment, 4 bytes a value, where 8-bit QSGD sends one. For the quantizers, sign and
  // cast16 a coded segment's size is set by the layer's size and the options, not by the
  // values, so this is their packet's exact size, the same on every rank.
  template <class C>
  void measure_segments(const C& c) {
    typename C::options opt{};
    if constexpr (requires { c.get_options(); }) opt = c.get_options();
    coded_bytes_.assign(layout_.size(), 0);
    header_bytes_ = 0;
    bool header_known = false;
    std::vector<float> g, e;
    std::vector<std::byte> out;
    compress_stats st;
    step_params q;
    for (std::size_t i = 0; i < layout_.size(); ++i) {
      const layer& l = layout_[i];
      if (l.numel == 0) continue;  // no segment at all
      layout one;
      one.add(l.name, l.shape, l.kind);
      C probe(one, opt);
      out.resize(probe.max_packet_bytes());
      const auto code = [&](double fraction) {
        g.assign(l.numel, 0.0f);
        e.assign(l.numel, 0.0f);
        q.kept_fraction.assign(1, fraction);
        return probe.compress(grad_view<host_space>(g.data(), l.numel), grad_view<host_space>(e.data(), l.numel), q,
                              std::span<std::byte>(out), st);
      };
      if (!header_known) {
        header_bytes_ = static_cast<double>(code(dense_fraction)) - static_cast<double>(raw_segment_bytes(l.numel));
        header_known = true;
      }
      coded_bytes_[i] = static_cast<double>(code(0.5)) - header_bytes_;
    }
  }
  // Whether \p comm can run an alltoallv: by its type, and at run time for engines that may
  // lack one (communicator_ref). The same on every rank: they share the engine type.
  template <class M>
  static bool has_alltoallv(const M& comm) {
    if constexpr (!AlltoallCommunicator<M>)
      return false;
    else if constexpr (requires { comm.has_alltoallv(); })
      return comm.has_alltoallv();
    else
      return true;
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
  compressed_allreduce compressed_;
  network_estimate estimate_;
  step_params dense_params_;
  std::vector<cost_terms> pending_terms_;
  std::vector<double> pending_seconds_;
  step_control own_control_;  // used when the caller passes no step_control
  std::array<double, 4> costs_{};
  std::array<double, 4> totals_{};  // costs_ plus the codec times
  std::array<double, 4> codec_{};   // smoothed codec seconds per path (ranks' average)
  std::array<bool, 4> codec_known_{};
  std::vector<double> coded_bytes_;  // per layer: its coded segment (shardable compressors; prepare)
  double header_bytes_ = 0;          // the packet header
  double last_codec_s_ = 0;          // this rank's codec seconds of the last step
  bool has_last_codec_ = false;
  network_params net_{};
  collective_kind last_ = collective_kind::dense_allreduce;  // what the last step reported
  collective_kind ran_ = collective_kind::dense_allreduce;   // the path the last step ran
};
static_assert(Collective<flexible>);

}  // namespace gravac
