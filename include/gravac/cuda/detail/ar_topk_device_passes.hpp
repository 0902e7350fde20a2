#pragma once
//! \file ar_topk_device_passes.hpp
//! \brief detail::ar_topk_device_passes<cuda_space>: allreduce_compatible's passes over device
//! memory, the twin of detail::ar_topk_host_passes with the same members, so that the
//! collective's one aggregate body runs on either (detail::space_ops picks the passes).
//!
//! Every pass is a sequence of kernels on the compressor's stream. u = g + e and its
//! statistics come from the radix select's fused pass with k = 0 (the pass the device
//! compressors run for their whole-buffer and dense layers: the same sums and gain curve);
//! the indices come from the compressor's device hook; the validation, the gather, the
//! scatter and the undo are the kernels of ar_topk_kernels.hpp. The host waits on the
//! stream wherever the host or the communicator (which orders its calls on a stream of its
//! own) reads what the kernels wrote: the statistics, the validation verdict, the buffers
//! handed to a broadcast or an Allreduce.

#include "gravac/cuda/detail/nvcc_flags.hpp"
// (first, and apart from the includes below: a missing compiler option is one readable error)

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <span>
#include <string>
#include <vector>

#include "gravac/collective/control/step_control.hpp"
#include "gravac/collective/detail/space_ops.hpp"
#include "gravac/concepts/concepts.hpp"
#include "gravac/core/error.hpp"
#include "gravac/core/layout.hpp"
#include "gravac/core/memory.hpp"
#include "gravac/cuda/detail/ar_topk_kernels.hpp"
#include "gravac/cuda/detail/fused_jobs_pass.hpp"
#include "gravac/cuda/detail/launch.hpp"
#include "gravac/cuda/detail/launch_config.hpp"
#include "gravac/cuda/detail/ordered_sums.hpp"
#include "gravac/cuda/detail/select_kernels.hpp"
#include "gravac/cuda/detail/stream_copies.hpp"
#include "gravac/cuda/device_buffer.hpp"

namespace gravac::detail {

//! AR-Topk's passes over device memory (see the file comment).
template <>
class ar_topk_device_passes<cuda_space> {
 public:
  //! Allocates the per-layer state for \p lay on \p c's stream (once: no allocation per
  //! step but the index and value buffers' growth).
  template <class C>
  void prepare(const C& c, const layout& lay) {
    stream_ = c.stream();
    launch_ = launch_config::current_device();
    for (const auto& l : lay.layers())
      require(l.numel <= 0xffffffffull,
              "allreduce_compatible: layer '" + l.name + "' has 2^32 or more elements (device indices are 32-bit)");
    const std::size_t L = std::max<std::size_t>(lay.size(), 1);
    const stream_ref s = stream_;
    states_ = device_buffer<select_state>(L, s);
    sums_ = device_buffer<layer_sums>(L, s);
    accumulate_jobs_ = fused_jobs(lay, launch_, true, s);
    gain_out_ = device_buffer<double>(max_gain_candidates, s);
    first_bad_ = device_buffer<std::uint32_t>(1, s);
    idx_ = device_buffer<std::uint32_t>(1, s);
    values_ = device_buffer<float>(1, s);
    own_ = device_buffer<float>(1, s);
    // The part tables: a part per layer at most, a statistics slot per block of the gather.
    parts_ = device_buffer<ar_part>(L, s);
    parts_host_ = pinned_buffer<ar_part>(L);
    parts_done_ = device_buffer<std::uint32_t>(L, s);
    unsigned long long blocks = 0;
    for (const auto& l : lay.layers())
      blocks += static_cast<unsigned long long>(launch_.grid_stride(l.numel, select_threads));
    part_slots_ = block_slots_buffer(std::max<unsigned long long>(blocks, 1), s);
    host_states_.resize(L);
    host_sums_.resize(L);
    host_gain_.resize(max_gain_candidates);
    host_bad_.resize(1);
    // The control plane's staging, sized once here: growing it would free pinned memory
    // in the middle of a step (reduce_buffer), and cudaFreeHost synchronizes the device.
    const std::size_t slots = control_slots(lay.size());
    if (host_control_.size() < slots) host_control_ = pinned_buffer<float>(slots);
  }
  //! The control slots prepare() stages without growing, for \p layers layers: every
  //! step_control the library hands the collective. The trainer's for that layout (the
  //! non-finite flag 2, the statistics 1 + max_gain_candidates + 2 per layer, the previous
  //! step's times 4, a policy's values to agree on, at most one per layer; the device
  //! trainer carries none yet), flexible's (its codec time and a batch of up to
  //! 4 * sync_interval timings: 33 with the default interval of 8) and VAR's norms, one per
  //! rank, for up to 1024 ranks. A larger control plane (more ranks, a longer interval, a
  //! caller's own slots) is staged by reserve_control() before the step (the trainer calls
  //! allreduce_compatible::reserve_control at construction). One nobody reserved grows the
  //! staging in the step, keeping the old memory until the passes are destroyed
  //! (detail::grow_pinned_keeping): no cudaFreeHost, but a cudaMallocHost, which
  //! synchronizes the device (the tests count it).
  static constexpr std::size_t control_slots(std::size_t layers) noexcept {
    return 2 + (1 + static_cast<std::size_t>(max_gain_candidates) + 2 * layers) + 4 + layers + (1 + 4 * 8) + 1024;
  }
  //! Stages a control plane of up to \p values values, so that reduce_buffer() and
  //! read_control() allocate no pinned memory in a step. Call between steps: it may free
  //! and allocate pinned memory, which synchronizes the device. Never shrinks.
  void reserve_control(std::size_t values) {
    if (host_control_.size() < values) host_control_ = pinned_buffer<float>(values);
  }
  //! Device indices are 32-bit (prepare() refused larger layers).
  void configure(bool wide) const { require(!wide, "allreduce_compatible: device indices are 32-bit"); }

  //! u = g + e in place of e, per layer: grad_sq, input_sq, the gain curve, non_finite into
  //! \p st (reset by the caller). Returns this rank's ||g||^2 (the layers' sums, in layer
  //! order, as the host adds them). Without \p norm_needed (no rule reads this rank's norm
  //! now) it does not wait: the statistics reach \p st with gather()'s wait, so the host
  //! queues the selection while the passes run, and it returns 0.
  double accumulate(const layout& lay, grad_view<cuda_space> g, grad_view<cuda_space> e, const step_params& p,
                    compress_stats& st, bool norm_needed = true) {
    require(g.size() == lay.numel() && e.size() == lay.numel(),
            "allreduce_compatible: buffer size does not match the layout");
    require(p.gain_candidates.size() <= static_cast<std::size_t>(max_gain_candidates),
            "allreduce_compatible: at most " + std::to_string(max_gain_candidates) + " gain candidates on the device");
    const cudaStream_t s = stream_.get();
    std::size_t in_u = 0;  // layers [0, in_u) have u in e (their pass was queued)
    try {
      clear_async(s, states_, sums_, gain_out_);
      // One launch over every layer (fused_jobs_pass, k = 0): u into e, the sums and the gain
      // curve, with the bits of one fused pass per layer.
      accumulate_jobs_.queue(s, g.data(), e.data(), states_.data(), sums_.data(), p.gain_candidates, gain_out_.data());
      in_u = lay.size();
    } catch (...) {
      // The layers whose pass never ran get g added: e = u everywhere, as the step's contract says.
      repair_and_rethrow([&] {
        accumulate_jobs_.reset(s);  // in case the step was cut short inside the pass
        for (std::size_t i = in_u; i < lay.size(); ++i) {
          const auto& l = lay[i];
          if (l.numel == 0) continue;
          detail::launch(&fold_gradient, launch_.grid_stride(l.numel, select_threads), select_threads, s,
                         g.data() + l.offset, e.data() + l.offset, l.numel);
        }
      });
    }
    copy_to_host_async(s, host_states_, states_);
    copy_to_host_async(s, host_sums_, sums_);
    copy_to_host_async(s, host_gain_, gain_out_);
    pending_gains_ = p.gain_candidates.size();
    statistics_pending_ = true;
    if (!norm_needed) return 0.0;
    stream_.synchronize();
    return read_accumulated(lay, st);
  }

  //! Room for \p n indices (the contents are rewritten every step).
  void reserve_indices(std::size_t n) { idx_.resize(std::max<std::size_t>({idx_.size(), n, 1})); }

  //! Queues the hook's selection of layer \p l (index \p i) of u (held in \p e) into
  //! entries \p at on; returns the count it was asked for (finish_selection() checks it).
  template <class Hook, class C>
  std::size_t select_layer(C& c, grad_view<cuda_space> e, const layer& l, std::size_t i, const step_params& p,
                           std::size_t at) {
    static_assert(!Hook::shared_indices, "allreduce_compatible: a device hook must broadcast its indices");
    try {
      Hook::select(c, grad_view<cuda_space>(e.data() + l.offset, l.numel), i, p, idx_.data() + at);
    } catch (...) {
      repair_and_rethrow([] {});  // the selection only reads u: e holds it already
    }
    return kept_count(l.numel, p.kept_fraction[i]);
  }
  //! Runs and waits for the selections; the hook throws when one did not yield its count
  //! or a launch failed (the selection only reads u: e holds it already).
  template <class Hook, class C>
  void finish_selection(C& c) {
    try {
      Hook::finish(c);
    } catch (...) {
      repair_and_rethrow([] {});
    }
  }

  //! The first \p n indices as the bytes the broadcast carries (device memory). Waits for
  //! the stream first: the communicator orders its calls on a stream of its own.
  std::span<std::byte> index_bytes(std::size_t n) {
    stream_.synchronize();
    return std::as_writable_bytes(std::span<std::uint32_t>(idx_.data(), n));
  }

  //! The first layer whose index list is out of range or not strictly increasing (checked
  //! on the device; only the verdict is copied back); lay.size() when every list is valid.
  [[nodiscard]] std::size_t first_invalid_layer(const layout& lay, const std::vector<std::size_t>& offsets) {
    const cudaStream_t s = stream_.get();
    constexpr std::uint32_t none = 0xffffffffu;
    host_bad_[0] = none;
    GRAVAC_TRY_CUDA(
        cudaMemcpyAsync(first_bad_.data(), host_bad_.data(), sizeof(std::uint32_t), cudaMemcpyHostToDevice, s));
    try {
      const unsigned grid = upload_parts(lay, offsets, {}, packet_threads, no_limit);
      if (grid) detail::launch(&ar_validate_parts, grid, packet_threads, s, part_table(), first_bad_.data());
    } catch (...) {
      repair_and_rethrow([] {});  // read only: e holds u already
    }
    copy_to_host_async(s, host_bad_, first_bad_);
    stream_.synchronize();
    return host_bad_[0] == none ? lay.size() : static_cast<std::size_t>(host_bad_[0]);
  }

  //! The \p total values sent: u at the indices (dense layers whole), in layer order; e = 0
  //! where sent; each layer's kept count and kept_sq into \p st.
  void gather(const layout& lay, const std::vector<std::size_t>& offsets, const std::vector<bool>& dense,
              grad_view<cuda_space> e, std::size_t total, compress_stats& st) {
    const cudaStream_t s = stream_.get();
    values_.resize(std::max<std::size_t>(total, 1));
    try {
      const unsigned grid = upload_parts(lay, offsets, dense, square_tile, no_limit);  // the sums' tiles
      if (grid)
        detail::launch(&ar_gather_parts, grid, select_threads, s, part_table(), e.data(), values_.data(), sums_.data());
    } catch (...) {
      repair_and_rethrow([] {});  // one launch: it did not start, e = u everywhere
    }
    copy_to_host_async(s, host_sums_, sums_);
    stream_.synchronize();
    if (statistics_pending_) (void)read_accumulated(lay, st);
    for (std::size_t i = 0; i < lay.size(); ++i) {
      st.layers[i].kept = dense[i] ? lay[i].numel : offsets[i + 1] - offsets[i];
      st.layers[i].kept_sq = host_sums_[i].kept_sq;
    }
  }

  //! The Allreduce buffer (device memory): the \p total values, then \p ctl's local values
  //! (copied from the host); this rank's values are kept for undo().
  std::span<float> reduce_buffer(std::size_t total, step_control& ctl) {
    const cudaStream_t s = stream_.get();
    own_.resize(std::max<std::size_t>(total, 1));
    if (total)
      GRAVAC_TRY_CUDA(cudaMemcpyAsync(own_.data(), values_.data(), total * sizeof(float), cudaMemcpyDeviceToDevice, s));
    own_count_ = total;
    const std::size_t m = total + ctl.size();
    if (values_.capacity() < m) {  // growing loses the contents: the values come back from own_
      values_.resize(m);
      if (total)
        GRAVAC_TRY_CUDA(
            cudaMemcpyAsync(values_.data(), own_.data(), total * sizeof(float), cudaMemcpyDeviceToDevice, s));
    } else {
      values_.resize(std::max<std::size_t>(m, 1));
    }
    if (ctl.size()) {
      grow_pinned_keeping(host_control_, ctl.size(), retired_control_);  // only beyond what was reserved
      ctl.write_local(std::span<float>(host_control_.data(), ctl.size()));
      GRAVAC_TRY_CUDA(cudaMemcpyAsync(values_.data() + total, host_control_.data(), ctl.size() * sizeof(float),
                                      cudaMemcpyHostToDevice, s));
    }
    stream_.synchronize();
    return {values_.data(), m};
  }
  //! \p ctl's sums from the tail of the reduced device buffer.
  void read_control(std::size_t total, step_control& ctl) {
    if (ctl.size()) {
      GRAVAC_TRY_CUDA(cudaMemcpyAsync(host_control_.data(), values_.data() + total, ctl.size() * sizeof(float),
                                      cudaMemcpyDeviceToHost, stream_.get()));
      stream_.synchronize();
    }
    ctl.set_summed(std::span<const float>(host_control_.data(), ctl.size()));
  }

  //! g = the summed values times \p inv at the indices (dense layers whole), zero
  //! elsewhere; returns when g is written.
  void scatter_average(const layout& lay, const std::vector<std::size_t>& offsets, const std::vector<bool>& dense,
                       grad_view<cuda_space> g, float inv) {
    const cudaStream_t s = stream_.get();
    try {
      if (g.size()) GRAVAC_TRY_CUDA(cudaMemsetAsync(g.data(), 0, g.size() * sizeof(float), s));
      const unsigned grid = upload_parts(lay, offsets, dense, select_threads, no_limit);
      if (grid) detail::launch(&ar_scatter_parts, grid, select_threads, s, part_table(), values_.data(), inv, g.data());
    } catch (const error& err) {
      GRAVAC_TRY_CUDA_NO_THROW(cudaStreamSynchronize(s));
      throw error(err.code(),
                  std::string("allreduce_compatible: the values were summed but the averaged gradient was not written; "
                              "the residual holds e less the values sent, which return_sent() gives back; the "
                              "failure: ") +
                      err.what(),
                  err.rank(), err.engine(), err.engine_code());
    }
    stream_.synchronize();
  }

  //! e = the values this rank sent in the last step, where it sent them (e is zero there),
  //! so e holds all of u again; returns when e is written.
  void undo(const layout& lay, const std::vector<std::size_t>& offsets, const std::vector<bool>& dense,
            grad_view<cuda_space> e) {
    if (own_count_ == 0) return;
    const cudaStream_t s = stream_.get();
    const unsigned grid = upload_parts(lay, offsets, dense, select_threads, own_count_);
    if (grid) detail::launch(&ar_undo_parts, grid, select_threads, s, part_table(), own_.data(), e.data());
    stream_.synchronize();
  }

 private:
  // accumulate()'s statistics into \p st from the pinned copies (the stream has been waited
  // for since they were queued); returns this rank's ||g||^2.
  double read_accumulated(const layout& lay, compress_stats& st) {
    statistics_pending_ = false;
    double local_sq = 0;
    for (std::size_t i = 0; i < lay.size(); ++i) {
      st.layers[i].grad_sq = host_sums_[i].grad_sq;
      st.layers[i].input_sq = host_sums_[i].input_sq;
      st.non_finite |= host_states_[i].non_finite != 0;
      local_sq += host_sums_[i].grad_sq;
    }
    for (std::size_t c = 0; c < pending_gains_; ++c) st.candidate_kept_sq[c] = host_gain_[c];
    return local_sq;
  }

  // Called while a failure of a pass's queuing is handled: waits for the stream (no queued
  // kernel outlives the buffers the caller frees), runs \p repair (which puts every layer's
  // residual back to u = g + e_old) and waits again, then rethrows: a gravac::error as one
  // that says what the residual holds.
  template <class Repair>
  [[noreturn]] void repair_and_rethrow(Repair&& repair) {
    GRAVAC_TRY_CUDA_NO_THROW(cudaStreamSynchronize(stream_.get()));
    std::string residual = "the step was abandoned and the residual holds u = g + e: nothing was sent or lost";
    try {
      repair();
      stream_.synchronize();
    } catch (const std::exception& r) {
      GRAVAC_TRY_CUDA_NO_THROW(cudaStreamSynchronize(stream_.get()));
      residual = std::string("the step was abandoned and its residual could not be restored (") + r.what() + ")";
    }
    try {
      throw;
    } catch (const error& err) {
      throw error(err.code(), "allreduce_compatible: " + residual + "; the failure: " + err.what(), err.rank(),
                  err.engine(), err.engine_code());
    }
  }

  // \p fn(layer, its indices (null: dense, every element), count) for every layer that
  // sends something, in layer order: the order of the values in the Allreduce buffer.
  template <class Fn>
  void for_each_part(const layout& lay, const std::vector<std::size_t>& offsets, const std::vector<bool>& dense,
                     Fn&& fn) const {
    for (std::size_t i = 0; i < lay.size(); ++i) {
      const std::size_t count = dense[i] ? lay[i].numel : offsets[i + 1] - offsets[i];
      if (count == 0) continue;
      fn(i, dense[i] ? nullptr : idx_.data() + offsets[i], count);
    }
  }

  static constexpr std::size_t no_limit = ~std::size_t{0};

  // Writes the table of this step's parts (for_each_part's; with \p dense empty, the index
  // lists only) whose values end within \p limit, and queues its upload; returns the grid
  // of a pass of \p threads a block over them (0: no part). The staging is rewritten: every
  // pass waits for its stream before it returns.
  unsigned upload_parts(const layout& lay, const std::vector<std::size_t>& offsets, const std::vector<bool>& dense,
                        int threads, std::size_t limit) {
    std::uint32_t n = 0;
    unsigned long long blocks = 0;
    std::size_t v = 0;
    const std::vector<bool> lists_only(dense.empty() ? lay.size() : 0, false);
    for_each_part(lay, offsets, dense.empty() ? lists_only : dense,
                  [&](std::size_t i, const std::uint32_t* idx, std::size_t count) {
                    if (v + count > limit) return;
                    ar_part& pt = parts_host_[n++];
                    pt = ar_part{};
                    pt.first[0] = blocks;
                    pt.idx = idx;
                    pt.offset = lay[i].offset;
                    pt.v_at = v;
                    pt.count = count;
                    pt.numel = lay[i].numel;
                    pt.layer = static_cast<std::uint32_t>(i);
                    v += count;
                    blocks += static_cast<unsigned long long>(launch_.grid_stride(count, threads));
                  });
    parts_count_ = n;
    if (n == 0) return 0;
    GRAVAC_TRY_CUDA(
        cudaMemcpyAsync(parts_.data(), parts_host_.data(), n * sizeof(ar_part), cudaMemcpyHostToDevice, stream_.get()));
    return static_cast<unsigned>(blocks);
  }
  // The table upload_parts() last wrote.
  [[nodiscard]] ar_parts part_table() noexcept {
    return {parts_.data(), parts_count_, parts_done_.data(), part_slots_.view()};
  }

  stream_ref stream_{};
  launch_config launch_;
  device_buffer<ar_part> parts_;             // the part table of the running pass
  pinned_buffer<ar_part> parts_host_;        // its staging
  device_buffer<std::uint32_t> parts_done_;  // per layer: the gather's statistics counters
  block_slots_buffer part_slots_;            // a statistics slot per block of the gather
  std::uint32_t parts_count_ = 0;
  device_buffer<select_state> states_;
  device_buffer<layer_sums> sums_;
  fused_jobs accumulate_jobs_;  // accumulate's one launch over every layer, and its workspace
  device_buffer<double> gain_out_;
  device_buffer<std::uint32_t> first_bad_;
  device_buffer<std::uint32_t> idx_;
  device_buffer<float> values_;
  device_buffer<float> own_;
  std::size_t own_count_ = 0;
  bool statistics_pending_ = false;  // accumulate() queued copies that gather() reads
  std::size_t pending_gains_ = 0;    // their gain candidates
  pinned_buffer<select_state> host_states_;
  pinned_buffer<layer_sums> host_sums_;
  pinned_buffer<double> host_gain_;
  pinned_buffer<std::uint32_t> host_bad_;
  pinned_buffer<float> host_control_;                  // the control plane's staging (control_slots, reserve_control)
  std::vector<pinned_buffer<float>> retired_control_;  // outgrown staging, freed with the passes
};

}  // namespace gravac::detail
