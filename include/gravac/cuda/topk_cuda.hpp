#pragma once
//! \file topk_cuda.hpp
//! \brief topk_cuda: exact top-k with error feedback on the device (fused radix select,
//! see detail/select_kernels.hpp). Same packets as gravac::topk, bit for bit: the same
//! selection (ties to the lower index), the same values, the same residual. And
//! threshold_cuda, the same machinery behind gravac::threshold's estimate (see
//! detail/threshold_kernels.hpp): the same packets as gravac::threshold, bit for bit.
//! Part of target gravac::cuda.

#include "gravac/cuda/detail/nvcc_flags.hpp"
// (first, and apart from the includes below: a missing compiler option is one readable error)

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "gravac/compress/detail/gain_sampling.hpp"
#include "gravac/compress/index_selection.hpp"
#include "gravac/concepts/concepts.hpp"
#include "gravac/core/detail/random.hpp"
#include "gravac/cuda/detail/ar_topk_device_passes.hpp"
#include "gravac/cuda/detail/ar_topk_kernels.hpp"
#include "gravac/cuda/detail/cub_primitives.hpp"
#include "gravac/cuda/detail/device_compress.hpp"
#include "gravac/cuda/detail/device_packets.hpp"
#include "gravac/cuda/detail/estimate_jobs.hpp"
#include "gravac/cuda/detail/launch.hpp"
#include "gravac/cuda/detail/launch_config.hpp"
#include "gravac/cuda/detail/ordered_sums.hpp"
#include "gravac/cuda/detail/segment_cursor.hpp"
#include "gravac/cuda/detail/select_jobs.hpp"
#include "gravac/cuda/detail/select_kernels.hpp"
#include "gravac/cuda/detail/space_hooks.hpp"  // the trainer's hooks on this space
#include "gravac/cuda/detail/square_sums.hpp"
#include "gravac/cuda/detail/stream_copies.hpp"
#include "gravac/cuda/detail/stream_members.hpp"
#include "gravac/cuda/detail/threshold_kernels.hpp"
#include "gravac/cuda/detail/whole_select_kernels.hpp"
#include "gravac/cuda/device_buffer.hpp"
#include "gravac/packet/packet_bound.hpp"
#include "gravac/packet/raw_segment.hpp"
#include "gravac/packet/sparse_packet.hpp"

namespace gravac {

//! Options of topk_cuda.
struct topk_cuda_options {
  stream_ref stream{};  //!< the stream every kernel of the compressor runs on
  //! Capacity of the candidate buffer as a fraction of the largest layer (at least 65536
  //! keys, at most the layer). Larger avoids extra passes when k is large.
  double candidate_capacity = 1.0 / 16;
  //! One selection over the whole buffer (the concatenation of the layers compressed this
  //! step, k = kept_count(their total, step_params::global_fraction)) instead of one per
  //! layer, as topk_options::whole_buffer. Needs 8 bytes of workspace per parameter.
  bool whole_buffer = false;
};

//! Options of threshold_cuda: those of topk_cuda and of gravac::threshold (same meaning).
struct threshold_cuda_options {
  stream_ref stream{};                   //!< the stream every kernel of the compressor runs on
  double candidate_capacity = 1.0 / 16;  //!< see topk_cuda_options
  std::size_t expected_hits = 1024;      //!< see threshold_options
  std::size_t run_length = 16;           //!< see threshold_options
  double full_histogram_above = 0.25;    //!< see threshold_options
};

//! Top-k (\p Threshold false: topk_cuda) or threshold (true: threshold_cuda) sparsification
//! with error feedback over device memory. Models Compressor.
//!
//! threshold_cuda estimates each layer's low threshold exactly as gravac::threshold (the
//! same seeded sample, the same histogram, the same order statistic of the sample),
//! collects every |u| at or above it in the fused pass, and raises it to the k-th largest
//! (ties included) when more than k were collected; the count (k_hat) is resolved on the
//! device.
//!
//! topk_cuda with whole_buffer selects once over the concatenation of the compressed layers
//! (see detail/whole_select_kernels.hpp): the packets of gravac::topk with whole_buffer.
//!
//! compress() runs a fixed sequence of kernels on the stream, each over every layer through
//! a job table (detail/select_jobs.hpp: the same number of launches at 4 layers or 300; no
//! host round trip between them; a layer's share skips itself when an earlier pass resolved
//! its threshold), then copies the statistics back: it returns when the packet and the
//! residual are ready. threshold_cuda's estimate runs first, in the same way
//! (detail/estimate_jobs.hpp).
//! The workspace is allocated at construction (no allocation per step).
template <bool Threshold>
class basic_select_cuda : public detail::stream_members<basic_select_cuda<Threshold>> {
 public:
  //! Opt-in tag for the Compressor concept.
  using compressor_tag = void;
  //! Works on device memory.
  using memory_space = cuda_space;
  //! Options (see topk_cuda_options).
  using options = std::conditional_t<Threshold, threshold_cuda_options, topk_cuda_options>;
  //! Values at shared indices can be summed elementwise.
  static constexpr bool summable_by_index = true;
  //! Packet kind written (the same as gravac::topk).
  static constexpr packet_kind kind = packet_kind::sparse;

  //! A compressor for \p lay; allocates the whole workspace.
  basic_select_cuda(const layout& lay, const options& opt = {})
      : layout_(lay), options_(opt), packets_(lay, opt.stream) {
    require(opt.candidate_capacity > 0 && opt.candidate_capacity <= 1,
            "topk_cuda: candidate_capacity must be in (0, 1]");
    if constexpr (Threshold) {
      require(opt.expected_hits >= 1, "threshold_cuda: expected_hits must be at least 1");
      require(opt.run_length >= 1, "threshold_cuda: run_length must be at least 1");
      require(opt.full_histogram_above > 0.0 && opt.full_histogram_above <= 1.0,
              "threshold_cuda: full_histogram_above must be in (0, 1]");
    }
    std::size_t largest = 0;
    for (const auto& l : lay.layers()) {
      require(l.numel <= 0xffffffffull, "topk_cuda: layer '" + l.name + "' has 2^32 or more elements");
      largest = std::max(largest, l.numel);
    }
    if constexpr (!Threshold) whole_ = opt.whole_buffer;
    if (whole_) {  // the selection runs over up to every element: the workspace is sized for that
      require(lay.numel() <= 0xffffffffull, "topk_cuda: whole_buffer needs fewer than 2^32 elements in all");
      largest = lay.numel();
    }
    const stream_ref s = opt.stream;
    launch_ = detail::launch_config::current_device();
    const std::size_t L = std::max<std::size_t>(lay.size(), 1);
    states_ = device_buffer<detail::select_state>(L, s);
    prev_threshold_ = device_buffer<std::uint32_t>(L, s);
    // + 2: scratch for raw layers' gain pass and for the whole-buffer selection's pass
    sums_ = device_buffer<detail::layer_sums>(L + 2, s);
    gain_out_ = device_buffer<double>(detail::max_gain_candidates, s);
    failure_ = device_buffer<std::uint32_t>(1, s);
    slots_ = device_buffer<detail::segment_slot>(L, s);
    cursor_ = device_buffer<detail::packet_cursor>(1, s);
    if (whole_) {  // the per-launch passes of the whole-buffer selection and its raw layers
      sum_slots_ = detail::block_slots_buffer(static_cast<unsigned long long>(launch_.max_stride_grid()), s);
      hist_ = device_buffer<std::uint32_t>(detail::max_bins, s);
      hist_sq_ = device_buffer<unsigned long long>(detail::max_bins, s);
      cap_ = static_cast<std::uint32_t>(std::min<std::size_t>(
          largest, std::max<std::size_t>(
                       65536, static_cast<std::size_t>(opt.candidate_capacity * static_cast<double>(largest)))));
      cand_ = device_buffer<std::uint32_t>(std::max<std::size_t>(cap_, 1), s);
      constexpr std::size_t chunk = static_cast<std::size_t>(detail::select_threads) * detail::tie_items;
      chunk_counts_ = device_buffer<std::uint32_t>(std::max<std::size_t>((largest + chunk - 1) / chunk, 1), s);
      // Two-phase: the compaction's temporary storage, queried for the whole buffer.
      std::size_t temp = 0;
      GRAVAC_TRY_CUDA(detail::select_indices_if(nullptr, temp, static_cast<std::int64_t>(largest),
                                                detail::selected_by_threshold{nullptr, nullptr},
                                                detail::whole_index_writer{nullptr, nullptr}, nullptr, s.get()));
      select_temp_ = device_buffer<std::byte>(std::max<std::size_t>(temp, 1), s);
      concat_ = device_buffer<float>(std::max<std::size_t>(lay.numel(), 1), s);
      list_ = device_buffer<std::uint32_t>(std::max<std::size_t>(lay.numel(), 1), s);
      whole_state_ = device_buffer<detail::select_state>(1, s);
      whole_threshold_ = device_buffer<std::uint32_t>(1, s);
      no_threshold_ = device_buffer<std::uint32_t>(1, s);
      first_ = device_buffer<std::uint32_t>(L, s);
      // Each layer's part of the gain curve, added in the host's order once the step is
      // done; a layer whose curve is sampled keeps its bins until the selection's threshold.
      gain_rows_ = device_buffer<double>(L * detail::max_gain_candidates, s);
      host_gain_rows_.resize(L * detail::max_gain_candidates);
      sampled_ = detail::gain_sample_slots_of(lay);
      const std::size_t bins = std::max<std::size_t>(sampled_.count, 1) * detail::max_bins;
      deferred_hist_ = device_buffer<std::uint32_t>(bins, s);
      deferred_hist_sq_ = device_buffer<unsigned long long>(bins, s);
      deferred_sample_ = device_buffer<std::uint32_t>(bins, s);
      deferred_sample_sq_ = device_buffer<unsigned long long>(bins, s);
      deferred_.reserve(sampled_.count);
    }
    jobs_ = detail::select_jobs(lay, launch_, opt.candidate_capacity, s);
    if constexpr (Threshold) est_jobs_ = detail::estimate_jobs(lay, launch_, s);
    host_states_.resize(L);
    u_in_e_.assign(L, 0);
    host_sums_.resize(L + 2);
    host_gain_.resize(detail::max_gain_candidates);
    host_failure_.resize(1);
    host_cursor_.resize(1);
  }

  //! Upper bound of the packet size (every value kept, with indices), as gravac::topk.
  [[nodiscard]] std::size_t max_packet_bytes() const noexcept {
    return packet_bytes_bound(layout_,
                              [](std::size_t, const layer& l) { return sparse_segment_bytes(l.numel, l.numel); });
  }

  //! Keeps the top kept_fraction of each layer; e = u - sent. \p g, \p e and \p out are
  //! device memory. Returns the packet size once packet, residual and statistics are ready.
  //! A layer with fewer finite values than k sends all of its finite values and sets
  //! compress_stats::non_finite (as gravac::topk). Should a kernel ever fail, every layer's
  //! residual is restored to u = g + e_old before the error is thrown: nothing is lost.
  std::size_t compress(grad_view<cuda_space> g, grad_view<cuda_space> e, const step_params& p, std::span<std::byte> out,
                       compress_stats& st) {
    std::size_t whole_k = 0;  // whole buffer: k over the compressed layers together
    return detail::compress_on_device(
        {name(), layout_, options_.stream}, g, e, p, out, st, [&] { return step_bound(p, whole_k); },
        [&](std::byte* packet) { queue_step(g, e, p, packet, whole_k); }, [&] { repair_step(g, e, out.data()); },
        [&](std::size_t bound) { return finish_step(p, st, bound, out.data(), e); });
  }

  //! Validates an untrusted packet in device memory (header walk and every index checked
  //! on the device; only the verdict is copied back).
  [[nodiscard]] validation validate(std::span<const std::byte> packet) const { return packets_.validate(packet, kind); }
  //! Adds scale * the packet's values at their indices to \p out (device memory). The
  //! packet must have been validated. Asynchronous on the compressor's stream.
  void decompress_add(std::span<const std::byte> packet, grad_view<cuda_space> out, float scale) const {
    require(out.size() == layout_.numel(), "topk_cuda::decompress_add: buffer size does not match the layout");
    packets_.scatter_add(packet, kind, out.data(), scale);
  }

  //! AR-Topk's index selection (compress/index_selection.hpp, the device form): one rank
  //! chooses the indices and broadcasts them.
  static constexpr bool shared_indices = false;
  //! Queues, on the compressor's stream, the kept indices of layer \p i of u (its slice
  //! \p u, device memory, read only) into \p out (device memory), ascending: exactly
  //! k = kept_count(numel, p.kept_fraction[i]), the k largest |u|, ties to the lower index,
  //! for topk_cuda and threshold_cuda alike, as the host compressors' select_indices
  //! (AR-Topk needs the same count on every rank, so threshold's approximate count does not
  //! apply). The radix select of the compress path runs with k and no previous threshold:
  //! it keeps every key above the k-th largest key T and, of the keys equal to T, those at
  //! the lowest indices (tie_pass finds the last one to keep in index order). That is the
  //! host's set: select_topk_indices orders by |u| descending, then by index ascending, and
  //! the key (the float bits with the sign cleared) orders finite |u| exactly as |u| does,
  //! -0 and +0 included. Non-finite values are never chosen while k finite ones exist (the
  //! host orders infinity first and NaN not at all: such a step is abandoned as non-finite
  //! anyway); with fewer, the list is completed with the lowest non-finite indices, so that
  //! it always has k entries. finish_selection() runs the selections and checks the counts:
  //! the layers of one buffer listed in layer order share one set of launches (the job
  //! tables of compress), so a step's selection does not grow with its layers.
  void select_indices(grad_view<cuda_space> u, std::size_t i, const step_params& p, std::uint32_t* out) {
    require(i < layout_.size() && u.size() == layout_[i].numel && p.kept_fraction.size() == layout_.size(),
            std::string(name()) + "::select_indices: the slice does not match the layer");
    const std::size_t k = kept_count(u.size(), p.kept_fraction[i]);
    if (k == 0) return;
    const float* base = u.data() - layout_[i].offset;
    if (!lists_.empty() && (base != lists_base_ || i <= lists_.back().row)) {
      // Another buffer, or out of layer order: the lists so far run first (their table's
      // upload is reused, hence the wait).
      try {
        queue_lists();
        options_.stream.synchronize();
      } catch (...) {
        abandon_lists();
        throw;
      }
    }
    lists_base_ = base;
    lists_.push_back({static_cast<std::uint32_t>(i), static_cast<std::uint32_t>(k), out});
    pending_selections_.push_back({i, k});
  }
  //! Runs the selections select_indices() listed and waits for them; throws gravac::error
  //! (backend_failure) naming the layer when one did not yield exactly its k indices, or the
  //! error of a launch (nothing stays queued then; u is only read).
  void finish_selection() {
    try {
      queue_lists();
    } catch (...) {
      abandon_lists();
      throw;
    }
    const std::vector<std::pair<std::size_t, std::size_t>> pending = std::move(pending_selections_);
    pending_selections_.clear();
    detail::copy_to_host_async(options_.stream.get(), host_states_, states_);
    options_.stream.synchronize();
    for (const auto& [i, k] : pending) {
      const auto& h = host_states_[i];
      const bool ok = h.too_few_finite ? h.selected == h.count : h.done == 1 && h.count == k && h.selected == k;
      if (!ok)
        throw error(status::backend_failure,
                    std::string(name()) + ": the index selection of layer '" + layout_[i].name +
                        "' did not yield exactly " + std::to_string(k) + " indices",
                    -1, backend::cuda);
    }
  }

 private:
  // After a failure while queuing the lists: nothing stays queued or pending, and the
  // tables' workspace is zeroed again (a launch may have been cut short); the caller rethrows.
  void abandon_lists() noexcept {
    const cudaStream_t s = options_.stream.get();
    try {
      jobs_.reset(s);
    } catch (...) {  // the error being rethrown says what failed; the stream is waited for below
    }
    GRAVAC_TRY_CUDA_NO_THROW(cudaStreamSynchronize(s));
    lists_.clear();
    pending_selections_.clear();
  }

  // Queues the index lists select_indices() collected (select_jobs::queue_lists).
  void queue_lists() {
    if (lists_.empty()) return;
    jobs_.queue_lists(options_.stream.get(), lists_base_, lists_, states_.data());
    lists_.clear();  // kept for its room; after a failure, abandon_lists clears it
  }

  // The largest packet this step can produce: k values per layer (a top-k layer sends at
  // most k), every value for threshold (ties may exceed k). Whole buffer: k over the
  // compressed layers together (into \p whole_k), at most min(numel, k) in each.
  [[nodiscard]] std::size_t step_bound(const step_params& p, std::size_t& whole_k) const {
    std::size_t bound = sizeof(packet_header);
    whole_k = 0;
    if (whole_) {
      std::size_t total = 0;
      for (std::size_t i = 0; i < layout_.size(); ++i)
        if (p.kept_fraction[i] < dense_fraction) total += layout_[i].numel;
      whole_k = kept_count(total, p.global_fraction);
    }
    for (std::size_t i = 0; i < layout_.size(); ++i) {
      const auto& l = layout_[i];
      if (l.numel == 0) continue;
      bound += p.kept_fraction[i] >= dense_fraction
                   ? raw_segment_bytes(l.numel)
                   : sparse_segment_bytes(l.numel, Threshold ? l.numel
                                                   : whole_  ? std::min(l.numel, whole_k)
                                                             : kept_count(l.numel, p.kept_fraction[i]));
    }
    return bound;
  }

  // The step's kernels and the copies of its statistics, in order on the stream.
  void queue_step(grad_view<cuda_space> g, grad_view<cuda_space> e, const step_params& p, std::byte* packet,
                  std::size_t whole_k) {
    namespace cd = detail;
    const cudaStream_t s = options_.stream.get();
    std::fill(u_in_e_.begin(), u_in_e_.end(), 0);
    states_cleared_ = false;
    cd::clear_async(s, states_, slots_, cursor_, sums_, gain_out_, failure_);
    if (whole_ && !p.gain_candidates.empty()) cd::clear_async(s, gain_rows_);
    states_cleared_ = true;
    if (whole_) {
      cd::gain_request gains;
      gains.count = static_cast<int>(p.gain_candidates.size());
      queue_whole(g, e, p, packet, gains, whole_k);
    } else {
      queue_layers(g, e, p, packet);
    }
    detail::launch(&cd::finish_device_packet, cd::one_block, cd::one_thread, s, packet, cursor_.data(),
                   static_cast<std::uint8_t>(kind), layout_.hash());
    // One copy of the statistics back, then the packet and the residual are final.
    cd::copy_to_host_async(s, host_states_, states_);
    cd::copy_to_host_async(s, host_sums_, sums_);
    cd::copy_to_host_async(s, host_gain_, gain_out_);
    if (whole_ && !p.gain_candidates.empty()) cd::copy_to_host_async(s, host_gain_rows_, gain_rows_);
    cd::copy_to_host_async(s, host_failure_, failure_);
    cd::copy_to_host_async(s, host_cursor_, cursor_);
  }

  // Every layer's own selection, in the launches of select_jobs whatever the number of
  // layers (threshold_cuda first estimates each layer's low threshold, a layer at a time).
  void queue_layers(grad_view<cuda_space> g, grad_view<cuda_space> e, const step_params& p, std::byte* packet) {
    namespace cd = detail;
    const cudaStream_t s = options_.stream.get();
    if constexpr (Threshold) {  // the low threshold t of each selecting layer into prev_threshold_[i]
      est_jobs_.queue(s, g.data(), e.data(), p, prev_threshold_.data(), [&](std::size_t i) {
        return estimate_for(layout_[i].numel, p.kept_fraction[i], detail::mix_seed(p.seed, p.step, layout_[i].id));
      });
    }
    cd::select_jobs::progress done;
    const cd::select_rows rows{states_.data(), prev_threshold_.data(), sums_.data(),   slots_.data(),
                               cursor_.data(), gain_out_.data(),       failure_.data()};
    const bool gains = !p.gain_candidates.empty();
    const auto mark = [&] {  // the layers whose u is in e (or restorable from the packet)
      for (std::size_t i = 0; i < layout_.size(); ++i) {
        const bool raw = p.kept_fraction[i] >= dense_fraction;
        u_in_e_[i] = static_cast<char>((done.fused && (!raw || gains)) || (done.raw && raw));
      }
    };
    try {
      jobs_.queue(s, g.data(), e.data(), packet, p, Threshold, rows, done);
    } catch (...) {
      mark();
      throw;
    }
    mark();
  }

  // After the stream finished: the packet size, or (a failed compaction, a packet over its
  // bound) the residual restored to u = g + e_old and an error; the statistics into st.
  std::size_t finish_step(const step_params& p, compress_stats& st, std::size_t bound, const std::byte* packet,
                          grad_view<cuda_space> e) {
    const std::size_t bytes = sizeof(packet_header) + static_cast<std::size_t>(host_cursor_[0].used);
    if (host_failure_[0] || bytes > bound) {
      restore(packet, e);
      detail::throw_device_failure(name(), host_failure_[0] ? "the compaction did not select exactly the values counted"
                                                            : "the packet outgrew its bound");
    }
    for (std::size_t i = 0; i < layout_.size(); ++i) {
      if (layout_[i].numel == 0) continue;
      const auto& sm = host_sums_[i];
      st.layers[i] = {static_cast<std::size_t>(host_states_[i].count), sm.grad_sq, sm.input_sq, sm.kept_sq};
      st.non_finite |= host_states_[i].non_finite != 0;
    }
    if (whole_) {
      whole_gain_curve(p, st);
    } else {
      for (std::size_t c = 0; c < p.gain_candidates.size(); ++c) st.candidate_kept_sq[c] = host_gain_[c];
    }
    return bytes;
  }

  // Whole buffer: the layers' parts of the gain curve added as gravac::topk adds them, the
  // layers sent raw in layer order, then the sum of the compressed ones in layer order.
  void whole_gain_curve(const step_params& p, compress_stats& st) const {
    for (std::size_t c = 0; c < p.gain_candidates.size(); ++c) {
      double raw = 0, compressed = 0;
      for (std::size_t i = 0; i < layout_.size(); ++i) {
        if (layout_[i].numel == 0) continue;
        const double part = host_gain_rows_[i * detail::max_gain_candidates + c];
        if (p.kept_fraction[i] >= dense_fraction)
          raw += part;
        else
          compressed += part;
      }
      st.candidate_kept_sq[c] = raw + compressed;
    }
  }

  // A layer sent dense: its gain curve (as the host skeleton, the curve covers dense layers
  // too), its segment placed, u written raw and e = 0.
  void queue_raw(std::size_t i, grad_view<cuda_space> g, grad_view<cuda_space> e, std::byte* packet,
                 const detail::gain_request& gains) {
    namespace cd = detail;
    const cudaStream_t s = options_.stream.get();
    const auto& l = layout_[i];
    float* gl = g.data() + l.offset;
    float* el = e.data() + l.offset;
    auto* sti = states_.data() + i;
    auto* slot = slots_.data() + i;
    if (gains.count > 0) {
      detail::launch(&cd::select_fused_pass, launch_.grid_stride(l.numel, cd::square_tile), cd::select_threads, s, gl,
                     el, l.numel, 0, sti, prev_threshold_.data() + i, hist_.data(), hist_sq_.data(), cand_.data(), 0,
                     sums_.data() + layout_.size(), gains, gain_rows_.data() + i * cd::max_gain_candidates, false,
                     nullptr, sum_slots_.view());
      u_in_e_[i] = 1;
    }
    detail::launch(&cd::place_sparse_segment, cd::one_block, cd::one_thread, s, packet, cursor_.data(), slot,
                   &sti->count, static_cast<std::uint32_t>(i), l.numel, true);
    detail::launch(&cd::raw_pass, launch_.grid_stride(l.numel, cd::square_tile), cd::select_threads, s, gl, el, packet,
                   slot, l.numel, sums_.data() + i, sti, gains.count > 0, sum_slots_.view());
    u_in_e_[i] = 1;  // sent raw, e = 0: restore() gives u back from the packet
  }

  // The whole-buffer selection (see detail/whole_select_kernels.hpp): each compressed
  // layer's fused pass (k = 0: statistics, gain curve, u into e) copies u into concat_; one
  // radix select of k over concat_; the ordered compaction lists the selected positions;
  // then every layer in layout order: raw, or its part of the list gathered into its segment.
  void queue_whole(grad_view<cuda_space> g, grad_view<cuda_space> e, const step_params& p, std::byte* packet,
                   detail::gain_request gains, std::size_t k) {
    namespace cd = detail;
    const cudaStream_t s = options_.stream.get();
    const std::size_t layers = layout_.size();
    auto compressed = [&](std::size_t i) { return layout_[i].numel > 0 && p.kept_fraction[i] < dense_fraction; };
    GRAVAC_TRY_CUDA(cudaMemsetAsync(whole_state_.data(), 0, sizeof(cd::select_state), s));
    deferred_.clear();
    std::size_t total = 0;
    for (std::size_t i = 0; i < layers; ++i) {
      if (!compressed(i)) continue;
      const auto& l = layout_[i];
      for (int c = 0; c < gains.count; ++c)
        gains.k[c] = kept_count(l.numel, p.gain_candidates[static_cast<std::size_t>(c)]);
      cd::gain_request lg = gains;
      std::uint32_t* hist = hist_.data();
      unsigned long long* hist_sq = hist_sq_.data();
      if (gains.count > 0 &&
          sampled_.slot[i] != detail::no_gain_sample) {  // sampled: the curve waits for the threshold
        const std::size_t at = sampled_.slot[i] * cd::max_bins;
        lg.stride = detail::gain_sample_stride(l.numel);
        lg.phase = static_cast<std::uint32_t>(p.step % lg.stride);
        lg.sample_hist = deferred_sample_.data() + at;
        lg.sample_sq = deferred_sample_sq_.data() + at;
        lg.defer = true;
        hist = deferred_hist_.data() + at;
        hist_sq = deferred_hist_sq_.data() + at;
        deferred_.push_back({i, lg});
      }
      detail::launch(&cd::select_fused_pass, launch_.grid_stride(l.numel, cd::square_tile), cd::select_threads, s,
                     g.data() + l.offset, e.data() + l.offset, l.numel, 0, states_.data() + i, no_threshold_.data(),
                     hist, hist_sq, cand_.data(), 0, sums_.data() + i, lg,
                     gain_rows_.data() + i * cd::max_gain_candidates, false, concat_.data() + total, sum_slots_.view());
      u_in_e_[i] = 1;
      total += l.numel;
    }
    auto* whole = whole_state_.data();
    if (total > 0) {
      // The selection over concat_, exactly as over one layer (u is concat_ as it stands).
      const auto kk = static_cast<std::uint32_t>(k);
      const auto cap = static_cast<std::uint32_t>(std::min<std::size_t>(cap_, total));
      cd::gain_request none;
      detail::launch(&cd::select_fused_pass, launch_.grid_stride(total, cd::square_tile), cd::select_threads, s,
                     nullptr, concat_.data(), total, kk, whole, whole_threshold_.data(), hist_.data(), hist_sq_.data(),
                     cand_.data(), cap, sums_.data() + layers + 1, none, gain_out_.data(), false, nullptr,
                     sum_slots_.view());
      for (const auto& [i, lg] : deferred_) {  // the threshold's bin is known: the sampled layers' curves
        const std::size_t at = sampled_.slot[i] * cd::max_bins;
        detail::launch(&cd::deferred_gain_curve, cd::one_block, cd::select_threads, s, deferred_hist_.data() + at,
                       deferred_hist_sq_.data() + at, lg, static_cast<const cd::select_state*>(whole),
                       gain_rows_.data() + i * cd::max_gain_candidates);
      }
      deferred_.clear();
      if (k > 0) {
        const int grid1 = launch_.grid_stride(total, cd::select_threads);
        detail::launch(&cd::collect_pass, grid1, cd::select_threads, s, concat_.data(), total, whole, cand_.data(),
                       cap);
        for (int shift : {cd::refine_digit_bits, 0}) {
          detail::launch(&cd::refine_pass, grid1, cd::select_threads, s, concat_.data(), total, whole, cand_.data(),
                         cap, hist_.data(), shift);
        }
        detail::launch(&cd::tie_pass, launch_.tie_search(grid1), cd::select_threads, s, concat_.data(), total, whole,
                       chunk_counts_.data());
        std::size_t temp = select_temp_.size();
        GRAVAC_TRY_CUDA(detail::select_indices_if(select_temp_.data(), temp, static_cast<std::int64_t>(total),
                                                  cd::selected_by_threshold{concat_.data(), whole},
                                                  cd::whole_index_writer{list_.data(), whole}, &whole->selected, s));
        detail::launch(&cd::remember_whole_threshold, cd::one_block, cd::one_thread, s, whole, whole_threshold_.data());
      }
    }
    std::size_t start = 0;
    for (std::size_t i = 0; i < layers; ++i) {
      const auto& l = layout_[i];
      if (l.numel == 0) continue;
      if (!compressed(i)) {
        for (int c = 0; c < gains.count; ++c)
          gains.k[c] = kept_count(l.numel, p.gain_candidates[static_cast<std::size_t>(c)]);
        queue_raw(i, g, e, packet, gains);
        continue;
      }
      auto* sti = states_.data() + i;
      auto* slot = slots_.data() + i;
      detail::launch(&cd::split_whole_selection, cd::one_block, cd::one_thread, s, list_.data(), whole, start, l.numel,
                     sti, first_.data() + i);
      detail::launch(&cd::place_sparse_segment, cd::one_block, cd::one_thread, s, packet, cursor_.data(), slot,
                     &sti->count, static_cast<std::uint32_t>(i), l.numel, false);
      detail::launch(&cd::gather_whole_pass, launch_.grid_stride(std::min(l.numel, k), cd::square_tile),
                     cd::select_threads, s, packet, slot, e.data() + l.offset, list_.data(), first_.data() + i,
                     static_cast<std::uint32_t>(start), sti, whole, sums_.data() + i, failure_.data(),
                     sum_slots_.view());
      start += l.numel;
    }
  }

  static constexpr const char* name() noexcept { return Threshold ? "threshold_cuda" : "topk_cuda"; }

  // The estimate's parameters of a layer, computed as threshold::estimate does (they do
  // not depend on the data; the histogram and the boundary are the device's part).
  [[nodiscard]] detail::estimate_request estimate_for(std::size_t n, double fraction, std::uint64_t seed) const {
    detail::estimate_request rq;
    rq.n = n;
    rq.k = kept_count(n, fraction);
    if (rq.k == 0) return rq;
    if constexpr (Threshold) {
      const double k = static_cast<double>(rq.k);
      const double f = k / static_cast<double>(n);
      const std::size_t run = std::min(options_.run_length, n);
      const double wanted = static_cast<double>(options_.expected_hits) / f;
      const std::size_t runs = std::max<std::size_t>(1, static_cast<std::size_t>(std::ceil(wanted / run)));
      const std::size_t stratum = n / runs;
      if (wanted >= options_.full_histogram_above * static_cast<double>(n) || stratum < run) return rq;
      rq.sampled = 1;
      rq.runs = runs;
      rq.run = run;
      rq.stratum = stratum;
      rq.room = stratum - run + 1;
      rq.seed = seed;
      const double scale = static_cast<double>(n) / static_cast<double>(runs * run);
      const double hits = k / scale;
      rq.target_ceil = static_cast<unsigned long long>(std::ceil(hits + 4.0 * std::sqrt(hits) + 4.0));
    }
    return rq;
  }

  // After a queuing failure (the stream idle): every layer's residual back to u = g + e_old.
  // The layers that sent values get them back from the packet (restore); those whose first
  // pass never ran get g added. A failure before the step's state was cleared leaves every
  // layer untouched (restore would read the last step's flags).
  void repair_step(grad_view<cuda_space> g, grad_view<cuda_space> e, const std::byte* packet) {
    if (states_cleared_) restore(packet, e);
    const cudaStream_t s = options_.stream.get();
    if (whole_)  // a pass or a deferred curve may not have run: its bins start the next step at zero
      detail::clear_async(s, hist_, hist_sq_, deferred_hist_, deferred_hist_sq_, deferred_sample_, deferred_sample_sq_);
    else
      jobs_.reset(s);
    if constexpr (Threshold) est_jobs_.reset(s);
    for (std::size_t i = 0; i < layout_.size(); ++i) {
      const auto& l = layout_[i];
      if (l.numel == 0 || u_in_e_[i]) continue;
      detail::launch(&detail::fold_gradient, launch_.grid_stride(l.numel, detail::select_threads),
                     detail::select_threads, s, g.data() + l.offset, e.data() + l.offset, l.numel);
    }
    options_.stream.synchronize();
  }

  // e = u again at every index a layer sent (the packet still holds the values), then
  // waits: after a failure the residual holds g + e_old, as if nothing had been sent.
  void restore(const std::byte* packet, grad_view<cuda_space> e) {
    const auto layers = static_cast<std::uint32_t>(layout_.size());
    if (layers == 0) return;
    const dim3 grid = launch_.repair(layers);
    detail::launch(&detail::restore_pass, grid, detail::select_threads, options_.stream.get(), packet, slots_.data(),
                   states_.data(), packets_.desc().offset, layers, e.data());
    options_.stream.synchronize();
  }

  layout layout_;
  friend class detail::stream_members<basic_select_cuda>;  // stream() reads options_.stream
  options options_;
  mutable detail::device_packets packets_;
  detail::launch_config launch_;  // the grids of this device
  std::uint32_t cap_ = 0;         // whole: the candidate buffer's capacity
  device_buffer<detail::select_state> states_;
  device_buffer<std::uint32_t> prev_threshold_;
  device_buffer<detail::layer_sums> sums_;
  device_buffer<std::uint32_t> hist_;          // whole: the histogram of the per-launch passes
  device_buffer<unsigned long long> hist_sq_;  // whole: its energies, fixed point (bin_energy.hpp)
  detail::block_slots_buffer sum_slots_;       // whole: per-block partial statistics (ordered_sums.hpp)
  device_buffer<double> gain_out_;
  device_buffer<std::uint32_t> failure_;
  device_buffer<detail::segment_slot> slots_;
  device_buffer<detail::packet_cursor> cursor_;
  device_buffer<std::uint32_t> cand_;          // whole: the candidate buffer
  device_buffer<std::uint32_t> chunk_counts_;  // whole: the tie search's counts
  device_buffer<std::byte> select_temp_;       // whole: the compaction's temporary storage
  detail::estimate_jobs est_jobs_;             // threshold: every layer's estimate
  detail::select_jobs jobs_;  // the job tables of every pass (whole_buffer: AR-Topk's index lists only)
  std::vector<std::pair<std::size_t, std::size_t>> pending_selections_;  // AR-Topk: (layer, k) to check
  std::vector<detail::select_jobs::list_request> lists_;                 // AR-Topk: the lists not yet queued
  const float* lists_base_ = nullptr;                                    // the buffer they select from
  std::vector<char> u_in_e_;     // per layer: this step's queued kernels leave u in e (or restorable from the packet)
  bool states_cleared_ = false;  // this step's per-layer state was cleared (restore may read it)
  bool whole_ = false;           // topk: one selection over the whole buffer
  device_buffer<float> concat_;  // whole: u of the compressed layers, concatenated
  device_buffer<std::uint32_t> list_;                // whole: the selected positions in concat_, ascending
  device_buffer<detail::select_state> whole_state_;  // whole: the selection's state
  device_buffer<std::uint32_t> whole_threshold_;     // whole: the previous step's threshold (0: none)
  device_buffer<std::uint32_t> no_threshold_;        // whole: 0, so the layers' own passes collect nothing
  device_buffer<std::uint32_t> first_;               // whole: each layer's first entry in list_
  device_buffer<double> gain_rows_;                  // whole: each layer's part of the gain curve
  pinned_buffer<double> host_gain_rows_;
  detail::gain_sample_slots sampled_;           // whole: a sampled layer's bins among the deferred ones
  device_buffer<std::uint32_t> deferred_hist_;  // whole: the sampled layers' bins, kept until the threshold
  device_buffer<unsigned long long> deferred_hist_sq_;
  device_buffer<std::uint32_t> deferred_sample_;
  device_buffer<unsigned long long> deferred_sample_sq_;
  std::vector<std::pair<std::size_t, detail::gain_request>> deferred_;  // whole: this step's deferred curves
  pinned_buffer<detail::select_state> host_states_;
  pinned_buffer<detail::layer_sums> host_sums_;
  pinned_buffer<double> host_gain_;
  pinned_buffer<std::uint32_t> host_failure_;
  pinned_buffer<detail::packet_cursor> host_cursor_;
};

//! Exact top-k with error feedback on the device: the packets of gravac::topk.
using topk_cuda = basic_select_cuda<false>;
//! Threshold (approximate top-k) with error feedback on the device: the packets of gravac::threshold.
using threshold_cuda = basic_select_cuda<true>;
static_assert(Compressor<topk_cuda>);
static_assert(Compressor<threshold_cuda>);
static_assert(DeviceIndexSelector<topk_cuda>);  // allreduce_compatible takes them
static_assert(DeviceIndexSelector<threshold_cuda>);

}  // namespace gravac
