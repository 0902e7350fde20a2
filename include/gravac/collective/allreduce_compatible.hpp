#pragma once
//! \file allreduce_compatible.hpp
//! \brief AR-Topk (Tyagi & Swany 2023): top-k made summable by Allreduce. One rank
//! chooses the indices of every layer and broadcasts them; every rank takes its own
//! u = g + e at those indices, the values are Allreduce-summed and divided by N, and each
//! rank's residual becomes e = u - scatter(values it sent).
//!
//! The index rank is `step mod N` (STAR) or the rank with the largest smoothed local
//! gradient norm (VAR; norms gathered, ties to the lowest rank). Compressors whose
//! indices come from a shared seed (random-k) skip the broadcast.

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <vector>

#include "gravac/collective/control/step_control.hpp"
#include "gravac/collective/detail/ar_topk_host_passes.hpp"
#include "gravac/collective/detail/space_ops.hpp"
#include "gravac/collective/detail/space_workspace.hpp"
#include "gravac/collective/step_buffers.hpp"
#include "gravac/compress/index_selection.hpp"
#include "gravac/concepts/concepts.hpp"
#include "gravac/core/error.hpp"
#include "gravac/network/wire_bytes.hpp"

namespace gravac {

//! How AR-Topk chooses the rank whose indices everyone uses.
enum class index_rank_rule : std::uint8_t {
  star,  //!< rank `step mod N` (round robin)
  var,   //!< the rank with the largest EWMA of its local gradient norm (ties to the lowest rank)
};

//! Options of allreduce_compatible.
struct allreduce_compatible_options {
  index_rank_rule rule = index_rank_rule::star;  //!< STAR or VAR
  double norm_smoothing = 0.1;                   //!< VAR: weight of the newest norm in the EWMA, in (0, 1]
};

//! AR-Topk aggregation. Models Collective; accepts IndexSelector compressors only.
//!
//! One body for host and device memory (what differs is detail::space_ops' ar_topk_passes:
//! loops on the host, kernels on the compressor's stream for a device compressor, whose
//! indices are chosen on the device, broadcast and validated on the device). The control
//! values (VAR's norms among them) ride at the end of the value Allreduce in both spaces; in
//! device memory they are copied to and from the tail of the device buffer.
class allreduce_compatible {
 public:
  //! Opt-in tag for the Collective concept.
  using collective_tag = void;
  //! Options (see allreduce_compatible_options).
  using options = allreduce_compatible_options;
  //! Only compressors whose values can be summed at shared indices, with an index hook (the
  //! host form, or the device form of topk_cuda and threshold_cuda).
  template <class C>
  static constexpr bool accepts = IndexSelector<C>;
  //! Why it may refuse a compressor (the trainer's message): it needs an index-selection hook.
  static constexpr bool needs_index_selection = true;

  //! A collective for \p lay; rejects a smoothing weight outside (0, 1].
  allreduce_compatible(const layout& lay, const options& opt = {}) : layout_(lay), options_(opt) {
    require(opt.norm_smoothing > 0 && opt.norm_smoothing <= 1,
            "allreduce_compatible: norm_smoothing must be in (0, 1], got " + std::to_string(opt.norm_smoothing));
    wide_ = lay.max_layer_numel() > std::numeric_limits<std::uint32_t>::max();
  }

  //! Checks the combination and sizes the workspace of the compressor's memory space.
  template <Compressor C>
  void prepare(const C& c) {
    static_assert(IndexSelector<C>,
                  "allreduce_compatible needs a compressor whose values can be summed at shared indices "
                  "(summable_by_index and an index_selection hook: topk, threshold, randomk, topk_cuda, "
                  "threshold_cuda)");
    passes_.prepare<typename C::memory_space>().prepare(c, layout_);
  }

  //! Stages, before any step, a control plane of \p values values handed down by the
  //! caller (step_buffers::control) plus this collective's own for \p ranks ranks (VAR's
  //! norms, one per rank), for compressor \p c's memory space. On a device the plane goes
  //! through pinned staging, which a step cannot grow without synchronizing the device
  //! (cudaMallocHost); host memory needs nothing. Call after prepare(c), between steps (the
  //! trainer calls it at construction).
  template <Compressor C>
  void reserve_control(const C&, std::size_t values, int ranks) {
    const std::size_t own = options_.rule == index_rank_rule::var ? static_cast<std::size_t>(ranks) : 0;
    auto& w = passes_.get<typename C::memory_space>("allreduce_compatible");
    if constexpr (requires(decltype(w) x, std::size_t n) { x.reserve_control(n); }) w.reserve_control(values + own);
  }

  //! Runs one step: leaves the rank average of every rank's u at the shared indices in
  //! buf.grad (zero elsewhere) and sets each rank's residual to what it did not send.
  //! Indices received from the index rank are validated before use; a bad list throws
  //! gravac::error and leaves this rank's residual holding all of u (nothing was sent).
  template <Compressor C, Communicator M>
  void aggregate(C& c, M& comm, step_buffers<typename C::memory_space>& buf, const step_params& p, compress_stats& st,
                 step_report& r) {
    static_assert(IndexSelector<C>,
                  "allreduce_compatible needs a compressor whose values can be summed at shared indices "
                  "(summable_by_index and an index_selection hook: topk, threshold, randomk, topk_cuda, "
                  "threshold_cuda)");
    static_assert(CommunicatorFor<M, C>, "allreduce_compatible: the communicator must carry the compressor's memory");
    using hook = index_selection<C>;
    using space = typename C::memory_space;
    auto& w = passes_.get<space>("allreduce_compatible");
    w.configure(wide_);
    require(p.kept_fraction.size() == layout_.size(), "allreduce_compatible: one kept fraction per layer is required");
    const int n = comm.size(), me = comm.rank();
    const auto t0 = std::chrono::steady_clock::now();

    // 1. u = g + e in place of e (if anything fails later, e holds all of u: the error
    //    feedback invariant holds with nothing sent), with the statistics.
    st.reset(layout_.size(), p.gain_candidates.size());
    // Only VAR reads this rank's norm before the gather (the device passes then wait for it).
    const bool norm_needed = !hook::shared_indices && options_.rule == index_rank_rule::var;
    const double local_sq = w.accumulate(layout_, buf.grad, buf.residual, p, st, norm_needed);
    r.compress_s = detail::seconds_since(t0);

    // 2. The index rank. VAR's norms ride in the step's value Allreduce, so the rank chosen
    //    for this step is the loudest after the previous step (rank 0 at the first step).
    const auto t1 = std::chrono::steady_clock::now();
    double comm_s = 0;  // seconds inside collectives
    step_control& ctl = control_or_own(buf.control, own_control_);
    std::size_t norm_slot = 0;
    root_ = 0;
    if constexpr (!hook::shared_indices) {
      if (options_.rule == index_rank_rule::star) {
        root_ = static_cast<int>(p.step % static_cast<std::uint64_t>(n));
      } else {
        if (norm_sums_.size() == static_cast<std::size_t>(n))
          root_ = static_cast<int>(std::max_element(norm_sums_.begin(), norm_sums_.end()) - norm_sums_.begin());
        const double norm = std::sqrt(local_sq);
        ewma_ = has_ewma_ ? (1 - options_.norm_smoothing) * ewma_ + options_.norm_smoothing * norm : norm;
        has_ewma_ = true;
        norm_slot = ctl.reserve(static_cast<std::size_t>(n));  // one slot per rank: the sum gathers them
        ctl.local(norm_slot + static_cast<std::size_t>(me)) = static_cast<float>(ewma_);
      }
    }
    comm_s += detail::seconds_since(t1);

    // 3. Indices: chosen by the root and broadcast, or drawn by everyone.
    const auto t2 = std::chrono::steady_clock::now();
    std::size_t total = 0;  // values in the Allreduce (dense layers whole)
    for (std::size_t i = 0; i < layout_.size(); ++i)
      total +=
          p.kept_fraction[i] >= dense_fraction ? layout_[i].numel : kept_count(layout_[i].numel, p.kept_fraction[i]);
    std::size_t n_idx = 0;  // indices on the wire
    double bcast_s = 0;
    wire_bytes wire_total{};  // the broadcast's and the Allreduce's, as called
    if constexpr (hook::shared_indices) {
      total = 0;
      offsets_.assign(layout_.size() + 1, 0);
      for (std::size_t i = 0; i < layout_.size(); ++i) {
        const auto& l = layout_[i];
        if (p.kept_fraction[i] >= dense_fraction) {
          total += l.numel;
        } else {
          const std::size_t got = w.template select_layer<hook>(c, buf.residual, l, i, p, n_idx);
          n_idx += got;
          total += got;
        }
        offsets_[i + 1] = n_idx;
      }
      w.template finish_selection<hook>(c);
    } else {
      offsets_.assign(layout_.size() + 1, 0);
      for (std::size_t i = 0; i < layout_.size(); ++i) {
        const auto& l = layout_[i];
        const std::size_t k = p.kept_fraction[i] >= dense_fraction ? 0 : kept_count(l.numel, p.kept_fraction[i]);
        offsets_[i + 1] = offsets_[i] + k;
      }
      n_idx = offsets_.back();
      w.reserve_indices(n_idx);
      if (me == root_) {
        for (std::size_t i = 0; i < layout_.size(); ++i) {
          const auto& l = layout_[i];
          if (offsets_[i + 1] == offsets_[i]) continue;
          const std::size_t got = w.template select_layer<hook>(c, buf.residual, l, i, p, offsets_[i]);
          if (got != offsets_[i + 1] - offsets_[i])
            throw error(status::invalid_argument,
                        "allreduce_compatible: the index hook selected " + std::to_string(got) + " indices of layer '" +
                            l.name + "', expected " + std::to_string(offsets_[i + 1] - offsets_[i]),
                        me);
        }
        w.template finish_selection<hook>(c);  // the device's counts are checked here
      }
      if (n > 1 && n_idx > 0) {
        const auto tb = std::chrono::steady_clock::now();
        const std::span<std::byte> indices = w.index_bytes(n_idx);
        comm.broadcast(indices, root_);
        bcast_s = detail::seconds_since(tb);
        wire_total += wire_bytes::broadcast(n, static_cast<double>(indices.size()), me == root_);
        comm_s += bcast_s;
      }
      // Every rank validates the same broadcast bytes (the root included), so a bad list
      // fails all ranks together; a root that went on alone would wait in the Allreduce.
      validate_indices(w);
    }
    r.compress_s += detail::seconds_since(t2) - bcast_s;

    // 4. Gather u at the indices (dense layers whole); e = u - sent (zero where sent).
    const auto t3 = std::chrono::steady_clock::now();
    last_dense_.resize(layout_.size());
    for (std::size_t i = 0; i < layout_.size(); ++i) last_dense_[i] = p.kept_fraction[i] >= dense_fraction;
    w.gather(layout_, offsets_, last_dense_, buf.residual, total, st);
    r.compress_s += detail::seconds_since(t3);

    // 5. Sum (the control values ride at the end of the values), average, scatter.
    ctl.seal(st);
    const std::span<float> values = w.reduce_buffer(total, ctl);  // keeps this rank's values for return_sent
    const auto t4 = std::chrono::steady_clock::now();
    if (n > 1 && values.size() > 0) {
      comm.allreduce_sum(values);
      // The buffer as sent: the values and the control floats after them.
      wire_total += last_allreduce_wire_bytes(comm, static_cast<double>(values.size() * sizeof(float)));
    }
    comm_s += detail::seconds_since(t4);
    w.read_control(total, ctl);
    if constexpr (!hook::shared_indices) {
      if (options_.rule == index_rank_rule::var) {
        norm_sums_.resize(static_cast<std::size_t>(n));
        for (std::size_t i = 0; i < norm_sums_.size(); ++i) norm_sums_[i] = ctl.sum(norm_slot + i);
      }
    }
    const auto t5 = std::chrono::steady_clock::now();
    w.scatter_average(layout_, offsets_, last_dense_, buf.grad, 1.0f / static_cast<float>(n));
    r.decompress_s = detail::seconds_since(t5);
    r.communicate_s = comm_s;
    r.bytes_sent = total * sizeof(float) + (!hook::shared_indices && me == root_ ? n_idx * index_width() : 0);
    set_wire_bytes(r, wire_total);
    r.collective = collective_kind::allreduce_compatible;
    last_indices_ = hook::shared_indices ? 0 : n_idx;
    last_values_ = total;
  }

  //! Puts the values this rank sent in the last step back into its residual (they were
  //! taken out of it), so the residual holds all of u again; the trainer calls it when the
  //! step is abandoned after the collective (a non-finite gradient on some rank).
  template <Compressor C>
  void return_sent(C&, step_buffers<typename C::memory_space>& buf) {
    passes_.get<typename C::memory_space>("allreduce_compatible").undo(layout_, offsets_, last_dense_, buf.residual);
  }

  //! The rank whose indices the last step used (0 when indices come from a shared seed).
  [[nodiscard]] int last_root() const noexcept { return root_; }
  //! Indices broadcast in the last step (0 with shared indices).
  [[nodiscard]] std::size_t last_index_count() const noexcept { return last_indices_; }
  //! Values Allreduce-summed in the last step.
  [[nodiscard]] std::size_t last_value_count() const noexcept { return last_values_; }
  //! Bytes of one index on the wire (4, or 8 when a layer exceeds 2^32 elements).
  [[nodiscard]] std::size_t index_width() const noexcept { return wide_ ? 8 : 4; }
  //! This rank's smoothed gradient norm (VAR).
  [[nodiscard]] double smoothed_norm() const noexcept { return ewma_; }

 private:
  // Indices from the root are untrusted: in range and strictly increasing per layer.
  template <class W>
  void validate_indices(W& w) const {
    const std::size_t bad = w.first_invalid_layer(layout_, offsets_);
    if (bad < layout_.size())
      throw error(status::malformed_packet,
                  "allreduce_compatible: rank " + std::to_string(root_) +
                      " broadcast an invalid index list for layer '" + layout_[bad].name +
                      "' (out of range or not strictly increasing)",
                  root_);
  }

  // The passes of each memory space (detail::space_ops), with their buffers.
  template <class Space>
  using passes_of = typename detail::space_ops<Space>::ar_topk_passes;

  layout layout_;
  options options_;
  bool wide_ = false;
  int root_ = 0;
  double ewma_ = 0;
  bool has_ewma_ = false;
  std::size_t last_indices_ = 0;
  std::size_t last_values_ = 0;
  std::vector<std::size_t> offsets_;
  std::vector<double> norm_sums_;  // VAR: every rank's smoothed norm after the last step
  std::vector<bool> last_dense_;
  detail::space_workspace<passes_of> passes_;
  step_control own_control_;  // used when the caller passes no step_control
};
static_assert(Collective<allreduce_compatible>);

}  // namespace gravac
