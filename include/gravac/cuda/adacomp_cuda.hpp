#pragma once
//! \file adacomp_cuda.hpp
//! \brief adacomp_cuda: AdaComp (docs/algorithms.md, "Compressors") on the device, with its residue in device
//! memory. The same packets as gravac::adacomp on the same input, bit for bit (the same
//! elements sent, the same scale, the same residue), decoded on the device. Part of target
//! gravac::cuda.

#include "gravac/cuda/detail/nvcc_flags.hpp"
// (first, and apart from the includes below: a missing compiler option is one readable error)

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "gravac/compress/adacomp.hpp"
#include "gravac/concepts/composition.hpp"
#include "gravac/concepts/concepts.hpp"
#include "gravac/cuda/detail/adacomp_jobs.hpp"
#include "gravac/cuda/detail/adacomp_kernels.hpp"
#include "gravac/cuda/detail/cub_primitives.hpp"
#include "gravac/cuda/detail/device_compress.hpp"
#include "gravac/cuda/detail/fused_jobs_pass.hpp"
#include "gravac/cuda/detail/launch.hpp"
#include "gravac/cuda/detail/launch_config.hpp"
#include "gravac/cuda/detail/ordered_sums.hpp"
#include "gravac/cuda/detail/segment_cursor.hpp"
#include "gravac/cuda/detail/select_kernels.hpp"
#include "gravac/cuda/detail/space_hooks.hpp"  // the trainer's hooks on this space
#include "gravac/cuda/detail/stream_copies.hpp"
#include "gravac/cuda/detail/stream_members.hpp"
#include "gravac/cuda/device_buffer.hpp"
#include "gravac/packet/packet_bound.hpp"
#include "gravac/packet/raw_segment.hpp"

namespace gravac {

//! Options of adacomp_cuda: the stream, and the bin lengths of gravac::adacomp.
struct adacomp_cuda_options {
  stream_ref stream{};     //!< the stream every kernel of the compressor runs on
  adacomp_options bins{};  //!< L_T per layer kind (see adacomp_options)
};

//! AdaComp with its residue over device memory. Models Compressor.
//!
//! Per layer, the six steps of gravac::adacomp (see detail/adacomp_kernels.hpp for the
//! kernels): the scale is the host's order-free detail::exponent_sum of the bin maxima,
//! so it is the host's bit for bit; infinities and NaNs are never sent, do not count in a
//! bin's maximum, stay in the residue and set compress_stats::non_finite. Layers at kept
//! fraction 1 or more go raw. compress() queues every layer's kernels on the stream with
//! no host round trip between them (segments are placed on the device once their counts
//! are known), then copies the statistics back.
//!
//! Workspace: allocated at construction, for the bin lengths of the options; a policy that
//! sets a shorter bin length than any seen before grows the bin maxima once (then never
//! again for that length). Layers of 2^32 or more elements are rejected.
class adacomp_cuda : public detail::stream_members<adacomp_cuda> {
 public:
  //! Opt-in tag for the Compressor concept.
  using compressor_tag = void;
  //! What it acts on (composition.hpp): the bin length, as gravac::adacomp.
  static constexpr decision acts_on = decision::bin_length;
  //! Works on device memory.
  using memory_space = cuda_space;
  //! Options (see adacomp_cuda_options).
  using options = adacomp_cuda_options;
  //! Per-step settings: the bin length per layer, as gravac::adacomp (set_step_settings).
  using step_settings = adacomp_settings;
  //! Each rank sends its own indices and scale: values at shared indices are not summable.
  static constexpr bool summable_by_index = false;
  //! Packet kind written (the same as gravac::adacomp).
  static constexpr packet_kind kind = packet_kind::adacomp;

  //! A compressor for \p lay; rejects a zero bin length and layers of 2^32 or more elements.
  adacomp_cuda(const layout& lay, const options& opt = {}) : layout_(lay), options_(opt) {
    require(opt.bins.conv_bin > 0 && opt.bins.dense_bin > 0 && opt.bins.bias_bin > 0,
            "adacomp_cuda: bin lengths must be positive");
    for (std::size_t i = 0; i < lay.size(); ++i) {
      const auto& l = lay[i];
      require(l.numel <= 0xffffffffull, "adacomp_cuda: layer '" + l.name + "' has 2^32 or more elements");
    }
    const stream_ref s = opt.stream;
    launch_ = detail::launch_config::current_device();
    const std::size_t L = std::max<std::size_t>(lay.size(), 1);
    states_ = device_buffer<detail::select_state>(L, s);
    sums_ = device_buffer<detail::layer_sums>(L, s);
    slots_ = device_buffer<detail::segment_slot>(L, s);
    cursor_ = device_buffer<detail::packet_cursor>(1, s);
    scales_ = device_buffer<float>(L, s);
    jobs_ = detail::adacomp_jobs(lay, launch_, s);
    // The fused pass over every layer in one launch (rows by layer): u, the norms, the gain
    // curve; its norms go apart, since the layers sent raw take theirs from the raw pass.
    gain_jobs_ = detail::fused_jobs(lay, launch_, true, s);
    gain_sums_ = device_buffer<detail::layer_sums>(L, s);
    gain_out_ = device_buffer<double>(detail::max_gain_candidates, s);
    // The layout as the validation and decoding kernels see it.
    pinned_buffer<std::uint64_t> info(2 * L);
    for (std::size_t i = 0; i < lay.size(); ++i) {
      info[i] = lay[i].numel;
      info[L + i] = lay[i].offset;
    }
    layer_info_ = device_buffer<std::uint64_t>(2 * L, s);
    GRAVAC_TRY_CUDA(cudaMemcpyAsync(layer_info_.data(), info.data(), 2 * L * sizeof(std::uint64_t),
                                    cudaMemcpyHostToDevice, s.get()));
    table_ = device_buffer<detail::segment_entry>(L, s);
    walk_ = device_buffer<detail::walk_result>(1, s);
    host_states_.resize(L);
    u_in_r_.assign(L, 0);
    host_sums_.resize(L);
    host_gain_sums_.resize(L);
    host_scales_.resize(L);
    host_gain_.resize(detail::max_gain_candidates);
    host_cursor_.resize(1);
    host_counters_.resize(2);
    host_walk_.resize(1);
    s.synchronize();  // the pinned staging above is freed when this returns
  }

  //! The bin lengths of the following compress() calls, as gravac::adacomp::set_step_settings.
  void set_step_settings(const step_settings& s) {
    settings_.bin_length.assign(s.bin_length.begin(), s.bin_length.end());
  }
  //! The settings in use (set_step_settings).
  [[nodiscard]] const step_settings& settings() const noexcept { return settings_; }

  //! L_T of layer \p index: the step settings' value when non-zero, else the option for
  //! the layer's kind (as gravac::adacomp::bin_length).
  [[nodiscard]] std::uint32_t bin_length(std::size_t index) const noexcept {
    const auto& b = settings_.bin_length;
    if (index < b.size() && b[index] > 0) return b[index];
    return default_bin(index);
  }

  //! Upper bound of the packet size (every element sent), as gravac::adacomp.
  [[nodiscard]] std::size_t max_packet_bytes() const noexcept {
    return packet_bytes_bound(layout_,
                              [](std::size_t, const layer& l) { return adacomp_segment_bytes(l.numel, l.numel); });
  }

  //! AdaComp on every layer whose kept fraction is below 1; layers at 1 or more go raw.
  //! \p g, \p e and \p out are device memory. Everything is checked before any memory is
  //! touched. Returns the packet size once the packet, the residue and the statistics are ready.
  std::size_t compress(grad_view<cuda_space> g, grad_view<cuda_space> e, const step_params& p, std::span<std::byte> out,
                       compress_stats& st) {
    return detail::compress_on_device(
        {"adacomp_cuda", layout_, options_.stream}, g, e, p, out, st, [&] { return step_bound(p); },
        [&](std::byte* packet) { queue_step(g, e, p, packet); }, [&] { repair_step(g, e, out.data()); },
        [&](std::size_t bound) { return finish_step(p, st, bound, out.data(), e); });
  }

  //! Validates an untrusted packet in device memory: the header walk, every index and the
  //! sign padding checked on the device; only the verdict is copied back.
  [[nodiscard]] validation validate(std::span<const std::byte> packet) const {
    namespace cd = detail;
    if (packet.size() < sizeof(packet_header)) return validation::fail(cd::validation_reason(cd::v_truncated_header));
    if (reinterpret_cast<std::uintptr_t>(packet.data()) % 8 != 0)
      return validation::fail(cd::validation_reason(cd::v_misaligned));
    const cudaStream_t s = options_.stream.get();
    launch_walk(packet);
    detail::launch(&cd::check_adacomp_segments, detail::launch_config::per_layer(layout_.size()), cd::packet_threads, s,
                   packet.data(), desc(), table_.data(), walk_.data());
    GRAVAC_TRY_CUDA(
        cudaMemcpyAsync(host_walk_.data(), walk_.data(), sizeof(cd::walk_result), cudaMemcpyDeviceToHost, s));
    options_.stream.synchronize();
    const std::uint32_t v = host_walk_[0].verdict;
    if (v == cd::v_ok) return {};
    if (v == cd::v_layout) return {status::layout_mismatch, cd::validation_reason(v)};
    return validation::fail(cd::adacomp_reason(v));
  }

  //! Adds scale * decompress(packet) to \p out (device memory): ±(the segment's scale) at
  //! each sent index, raw segments densely. The packet must have been validated.
  //! Asynchronous on the compressor's stream.
  void decompress_add(std::span<const std::byte> packet, grad_view<cuda_space> out, float scale) const {
    require(out.size() == layout_.numel(), "adacomp_cuda::decompress_add: buffer size does not match the layout");
    if (packet.size() < sizeof(packet_header) || reinterpret_cast<std::uintptr_t>(packet.data()) % 8 != 0)
      throw error(status::malformed_packet, "adacomp_cuda::decompress_add: packet was not validated");
    launch_walk(packet);  // rebuilds the segment table on the device (no host round trip)
    detail::launch(&detail::scatter_add_adacomp, detail::launch_config::per_layer(layout_.size()),
                   detail::packet_threads, options_.stream.get(), packet.data(), desc(), table_.data(), walk_.data(),
                   out.data(), scale);
  }

 private:
  // The largest packet this step can produce (every element of a compressed layer sent).
  [[nodiscard]] std::size_t step_bound(const step_params& p) const {
    std::size_t bound = sizeof(packet_header);
    for (std::size_t i = 0; i < layout_.size(); ++i) {
      const auto& l = layout_[i];
      if (l.numel == 0) continue;
      if (p.kept_fraction[i] >= dense_fraction) {
        bound += raw_segment_bytes(l.numel);
      } else {
        bound += adacomp_segment_bytes(l.numel, l.numel);
      }
    }
    return bound;
  }

  // The step's kernels and the copies of its statistics, in order on the stream.
  void queue_step(grad_view<cuda_space> g, grad_view<cuda_space> e, const step_params& p, std::byte* packet) {
    namespace cd = detail;
    const cudaStream_t s = options_.stream.get();
    const std::size_t L = layout_.size();
    std::fill(u_in_r_.begin(), u_in_r_.end(), 0);
    states_cleared_ = false;
    cd::clear_async(s, states_, slots_, cursor_, sums_, gain_sums_, gain_out_);
    states_cleared_ = true;

    // The fused pass over every layer in one launch: u = g + e into e, which is AdaComp's
    // step 1 (R += g), the norms in the host's order (square_sums.hpp), and the gain curve
    // when one is asked for, as the host skeleton computes it before the layers' own work.
    gain_jobs_.queue(s, g.data(), e.data(), states_.data(), gain_sums_.data(), p.gain_candidates, gain_out_.data());
    for (std::size_t i = 0; i < L; ++i) u_in_r_[i] = layout_[i].numel != 0;
    // Steps 1 to 3 of every layer, in the launches of adacomp_jobs whatever the number of layers.
    jobs_.queue(s, g.data(), e.data(), packet, p, [&](std::size_t i) { return bin_length(i); },
                {states_.data(), sums_.data(), slots_.data(), cursor_.data(), scales_.data()});
    detail::launch(&cd::finish_device_packet, cd::one_block, cd::one_thread, s, packet, cursor_.data(),
                   static_cast<std::uint8_t>(kind), layout_.hash());
    // The last launch: the only pass that changes a compressed layer's residue after R = u.
    if (L > 0)
      detail::launch(&cd::adacomp_signs, cd::launch_config::per_layer(L), cd::adacomp_threads, s, packet, slots_.data(),
                     e.data(), desc().offset, scales_.data(), static_cast<std::uint32_t>(L), jobs_.check());
    // One copy of the statistics back, then the packet and the residue are final.
    cd::copy_to_host_async(s, host_states_, states_);
    cd::copy_to_host_async(s, host_sums_, sums_);
    cd::copy_to_host_async(s, host_gain_sums_, gain_sums_);
    cd::copy_to_host_async(s, host_scales_, scales_);
    cd::copy_to_host_async(s, host_gain_, gain_out_);
    cd::copy_to_host_async(s, host_cursor_, cursor_);
    cd::copy_to_host_async(s, host_counters_, jobs_.counters());
  }

  // After a queuing failure (the stream idle): every layer's residue back to u = g + e_old.
  // The sign pass, which alone changes a compressed layer's residue after its first pass,
  // is the step's last launch, so it never ran: the layers sent raw get u back from their
  // segments (restore_pass), those no pass had written u into get g added.
  void repair_step(grad_view<cuda_space> g, grad_view<cuda_space> e, const std::byte* packet) {
    namespace cd = detail;
    const cudaStream_t s = options_.stream.get();
    gain_jobs_.reset(s);  // in case the step was cut short inside the fused pass
    jobs_.reset(s);
    const auto layers = static_cast<std::uint32_t>(layout_.size());
    if (states_cleared_ && layers > 0)
      detail::launch(&cd::restore_pass, launch_.repair(layers), cd::select_threads, s, packet, slots_.data(),
                     states_.data(), desc().offset, layers, e.data());
    for (std::size_t i = 0; i < layout_.size(); ++i) {
      const auto& l = layout_[i];
      if (l.numel == 0 || u_in_r_[i]) continue;
      detail::launch(&cd::fold_gradient, launch_.grid_stride(l.numel, cd::select_threads), cd::select_threads, s,
                     g.data() + l.offset, e.data() + l.offset, l.numel);
    }
    options_.stream.synchronize();
  }

  // After the stream finished: the packet size, and the statistics into st.
  std::size_t finish_step(const step_params& p, compress_stats& st, std::size_t bound, const std::byte* packet,
                          grad_view<cuda_space> e) {
    const std::size_t L = layout_.size();
    const std::size_t bytes = sizeof(packet_header) + static_cast<std::size_t>(host_cursor_[0].used);
    if (bytes > bound)  // cannot happen: every segment is at most its bound
      detail::throw_device_failure("adacomp_cuda", "the packet outgrew its bound");
    if (host_counters_[1]) {  // the sign pass did not run: R = u, the raw layers' u is in the packet
      const auto layers = static_cast<std::uint32_t>(layout_.size());
      detail::launch(&detail::restore_pass, launch_.repair(layers), detail::select_threads, options_.stream.get(),
                     packet, slots_.data(), states_.data(), desc().offset, layers, e.data());
      options_.stream.synchronize();
      detail::throw_device_failure("adacomp_cuda", "the compaction did not list exactly the values counted");
    }
    for (std::size_t i = 0; i < L; ++i) {
      const auto& l = layout_[i];
      if (l.numel == 0) continue;
      const auto& sm = host_sums_[i];
      if (p.kept_fraction[i] >= dense_fraction) {
        // As the host's raw segments: every value kept; non-finite values are not reported.
        st.layers[i] = {l.numel, sm.grad_sq, sm.input_sq, sm.kept_sq};
        continue;
      }
      const auto count = static_cast<std::size_t>(host_states_[i].selected);
      const float scale = host_scales_[i];
      // The fused pass summed the norms (adacomp_bins then reads u from R).
      const auto& norms = host_gain_sums_[i];
      st.layers[i] = {count, norms.grad_sq, norms.input_sq, static_cast<double>(count) * scale * scale};
      st.non_finite |= host_states_[i].non_finite != 0;
    }
    for (std::size_t c = 0; c < p.gain_candidates.size(); ++c) st.candidate_kept_sq[c] = host_gain_[c];
    return bytes;
  }

  [[nodiscard]] std::uint32_t default_bin(std::size_t index) const noexcept {
    switch (layout_[index].kind) {
      case layer_kind::conv:
        return options_.bins.conv_bin;
      case layer_kind::bias_or_norm:
        return options_.bins.bias_bin;
      default:
        return options_.bins.dense_bin;
    }
  }
  static std::size_t bins_of(std::size_t numel, std::uint32_t bin) noexcept { return (numel + bin - 1) / bin; }

  [[nodiscard]] detail::layout_desc desc() const noexcept {
    const std::size_t L = std::max<std::size_t>(layout_.size(), 1);
    return {layer_info_.data(), layer_info_.data() + L, static_cast<std::uint32_t>(layout_.size()), layout_.hash()};
  }
  void launch_walk(std::span<const std::byte> packet) const {
    detail::launch(&detail::walk_adacomp_packet, detail::one_block, detail::one_thread, options_.stream.get(),
                   packet.data(), packet.size(), desc(), static_cast<std::uint8_t>(kind), table_.data(), walk_.data());
  }

  layout layout_;
  friend class detail::stream_members<adacomp_cuda>;  // stream() reads options_.stream
  options options_;
  step_settings settings_;        // set_step_settings
  detail::launch_config launch_;  // the grids of this device
  device_buffer<detail::select_state> states_;
  device_buffer<detail::layer_sums> sums_;
  device_buffer<detail::segment_slot> slots_;
  device_buffer<detail::packet_cursor> cursor_;
  device_buffer<float> scales_;
  detail::adacomp_jobs jobs_;                    // steps 1 to 3 of every layer: the job tables and their workspace
  detail::fused_jobs gain_jobs_;                 // the fused pass over every layer (u, norms, gain), and its workspace
  device_buffer<detail::layer_sums> gain_sums_;  // its norms (the compressed layers' own)
  device_buffer<double> gain_out_;
  device_buffer<std::uint64_t> layer_info_;
  mutable device_buffer<detail::segment_entry> table_;
  mutable device_buffer<detail::walk_result> walk_;
  pinned_buffer<detail::select_state> host_states_;
  std::vector<char> u_in_r_;     // per layer: this step's queued kernels leave u in the residue (or in the packet)
  bool states_cleared_ = false;  // this step's per-layer state was cleared (restore_pass may read it)
  pinned_buffer<detail::layer_sums> host_sums_;
  pinned_buffer<detail::layer_sums> host_gain_sums_;
  pinned_buffer<float> host_scales_;
  pinned_buffer<double> host_gain_;
  pinned_buffer<detail::packet_cursor> host_cursor_;
  pinned_buffer<std::uint32_t> host_counters_;  // the compaction's mismatch and the sign pass's failure
  mutable pinned_buffer<detail::walk_result> host_walk_;
};
static_assert(Compressor<adacomp_cuda>);

}  // namespace gravac
