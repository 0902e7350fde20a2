#pragma once
//! \file topk_cuda.hpp
//! \brief topk_cuda: exact top-k with error feedback on the device (fused radix select,
//! see detail/select_kernels.hpp). Same packets as gravac::topk, bit for bit: the same
//! selection (ties to the lower index), the same values, the same residual.
//! Part of target gravac::cuda.

#include <thrust/iterator/counting_iterator.h>
#include <thrust/iterator/tabulate_output_iterator.h>

#include <cub/device/device_select.cuh>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "gravac/compress/raw_segment.hpp"
#include "gravac/compress/sparse_packet.hpp"
#include "gravac/concepts.hpp"
#include "gravac/cuda/detail/device_packets.hpp"
#include "gravac/cuda/detail/select_kernels.hpp"
#include "gravac/cuda/device_buffer.hpp"

namespace gravac {

//! Options of topk_cuda.
struct topk_cuda_options {
  stream_ref stream{};  //!< the stream every kernel of the compressor runs on
  //! Capacity of the candidate buffer as a fraction of the largest layer (at least 65536
  //! keys, at most the layer). Larger avoids extra passes when k is large.
  double candidate_capacity = 1.0 / 16;
};

//! Exact top-k sparsification with error feedback over device memory. Models Compressor.
//!
//! compress() runs a fixed sequence of kernels per layer on the stream (no host round trip
//! between them; the kernels skip themselves when an earlier one resolved the threshold),
//! then copies the statistics back: it returns when the packet and the residual are ready.
//! The workspace is allocated at construction (no allocation per step).
class topk_cuda {
 public:
  //! Opt-in tag for the Compressor concept.
  using compressor_tag = void;
  //! Works on device memory.
  using memory_space = cuda_space;
  //! Options (see topk_cuda_options).
  using options = topk_cuda_options;
  //! Values at shared indices can be summed elementwise.
  static constexpr bool summable_by_index = true;
  //! Packet kind written (the same as gravac::topk).
  static constexpr packet_kind kind = packet_kind::sparse;

  //! A compressor for \p lay; allocates the whole workspace.
  topk_cuda(const layout& lay, const options& opt = {}) : layout_(lay), options_(opt), packets_(lay, opt.stream) {
    require(opt.candidate_capacity > 0 && opt.candidate_capacity <= 1,
            "topk_cuda: candidate_capacity must be in (0, 1]");
    std::size_t largest = 0;
    for (const auto& l : lay.layers()) {
      require(l.numel <= 0xffffffffull, "topk_cuda: layer '" + l.name + "' has 2^32 or more elements");
      largest = std::max(largest, l.numel);
    }
    const stream_ref s = opt.stream;
    int dev = 0;
    GRAVAC_TRY_CUDA(cudaGetDevice(&dev));
    GRAVAC_TRY_CUDA(cudaDeviceGetAttribute(&sms_, cudaDevAttrMultiProcessorCount, dev));
    const std::size_t L = std::max<std::size_t>(lay.size(), 1);
    states_ = device_buffer<cuda_detail::select_state>(L, s);
    prev_threshold_ = device_buffer<std::uint32_t>(L, s);
    sums_ = device_buffer<cuda_detail::layer_sums>(L + 1, s);  // + 1: scratch for raw layers' gain pass
    hist_ = device_buffer<std::uint32_t>(cuda_detail::max_bins, s);
    hist_sq_ = device_buffer<double>(cuda_detail::max_bins, s);
    gain_out_ = device_buffer<double>(cuda_detail::max_gain_candidates, s);
    failure_ = device_buffer<std::uint32_t>(1, s);
    cap_ = static_cast<std::uint32_t>(
        std::min<std::size_t>(largest, std::max<std::size_t>(65536, static_cast<std::size_t>(
                                                                        opt.candidate_capacity * static_cast<double>(largest)))));
    cand_ = device_buffer<std::uint32_t>(std::max<std::size_t>(cap_, 1), s);
    constexpr std::size_t chunk = static_cast<std::size_t>(cuda_detail::select_threads) * cuda_detail::tie_items;
    chunk_counts_ = device_buffer<std::uint32_t>(std::max<std::size_t>((largest + chunk - 1) / chunk, 1), s);
    // Two-phase: the compaction's temporary storage for the largest layer, sized once.
    std::size_t temp = 0;
    GRAVAC_TRY_CUDA(cub::DeviceSelect::If(nullptr, temp, thrust::counting_iterator<std::uint32_t>(0),
                                          thrust::make_tabulate_output_iterator(cuda_detail::bounded_index_writer{nullptr, 0}),
                                          static_cast<unsigned long long*>(nullptr), static_cast<std::int64_t>(largest),
                                          cuda_detail::selected_by_threshold{nullptr, nullptr}, s.get()));
    select_temp_ = device_buffer<std::byte>(std::max<std::size_t>(temp, 1), s);
    host_states_.resize(L);
    host_sums_.resize(L + 1);
    host_gain_.resize(cuda_detail::max_gain_candidates);
    host_failure_.resize(1);
  }

  //! Upper bound of the packet size (every value kept, with indices), as gravac::topk.
  [[nodiscard]] std::size_t max_packet_bytes() const noexcept {
    std::size_t n = sizeof(packet_header);
    for (const auto& l : layout_.layers())
      n += std::max(sparse_segment_bytes(l.numel, l.numel), raw_segment_bytes(l.numel));
    return n;
  }

  //! Keeps the top kept_fraction of each layer; e = u - sent. \p g, \p e and \p out are
  //! device memory. Returns the packet size once packet, residual and statistics are ready.
  std::size_t compress(grad_view<cuda_space> g, grad_view<cuda_space> e, const step_params& p,
                       std::span<std::byte> out, compress_stats& st) {
    namespace cd = cuda_detail;
    require(g.size() == layout_.numel() && e.size() == layout_.numel(),
            "topk_cuda::compress: buffer size does not match the layout");
    require(p.kept_fraction.size() == layout_.size(), "topk_cuda::compress: one kept fraction per layer is required");
    require(p.gain_candidates.size() <= static_cast<std::size_t>(cd::max_gain_candidates),
            "topk_cuda::compress: at most 32 gain candidates");
    const cudaStream_t s = options_.stream.get();
    st.reset(layout_.size(), p.gain_candidates.size());
    GRAVAC_TRY_CUDA(cudaMemsetAsync(states_.data(), 0, states_.size() * sizeof(cd::select_state), s));
    GRAVAC_TRY_CUDA(cudaMemsetAsync(sums_.data(), 0, sums_.size() * sizeof(cd::layer_sums), s));
    GRAVAC_TRY_CUDA(cudaMemsetAsync(gain_out_.data(), 0, gain_out_.size() * sizeof(double), s));
    GRAVAC_TRY_CUDA(cudaMemsetAsync(failure_.data(), 0, sizeof(std::uint32_t), s));

    // The packet's shape is known on the host: exact top-k keeps exactly k per layer.
    const auto plan = packets_.begin_plan();
    std::size_t pos = sizeof(packet_header);
    for (std::size_t i = 0; i < layout_.size(); ++i) {
      const auto& l = layout_[i];
      if (l.numel == 0) continue;
      const bool raw = p.kept_fraction[i] >= dense_fraction;
      const std::size_t k = raw ? l.numel : kept_count(l.numel, p.kept_fraction[i]);
      pos = packets_.add_segment(i, pos, raw, k);
    }
    require(pos <= out.size(), "topk_cuda::compress: packet buffer too small (needs " + std::to_string(pos) +
                                   " bytes, has " + std::to_string(out.size()) + ")");
    packets_.write_headers(out.data(), kind, pos);

    cd::gain_request gains;
    for (std::size_t i = 0, seg = 0; i < layout_.size(); ++i) {
      const auto& l = layout_[i];
      if (l.numel == 0) continue;
      const auto& d = plan[seg++];
      float* gl = g.data() + l.offset;
      float* el = e.data() + l.offset;
      std::byte* payload = out.data() + d.at + sizeof(segment_header);
      gains.count = static_cast<int>(p.gain_candidates.size());
      for (int c = 0; c < gains.count; ++c) gains.k[c] = kept_count(l.numel, p.gain_candidates[static_cast<std::size_t>(c)]);
      const int grid = blocks_for(l.numel, cd::select_threads * cd::fused_items);
      auto* sti = states_.data() + i;
      if (d.header.encoding == raw_encoding) {
        if (gains.count > 0) {  // the gain curve covers dense layers too (as the host skeleton)
          cd::fused_pass<<<grid, cd::select_threads, 0, s>>>(gl, el, l.numel, 0, sti, prev_threshold_.data() + i,
                                                             hist_.data(), hist_sq_.data(), cand_.data(), 0,
                                                             sums_.data() + layout_.size(), gains, gain_out_.data());
          GRAVAC_CHECK_CUDA_LAUNCH();
        }
        cd::raw_pass<<<blocks_for(l.numel, cd::select_threads), cd::select_threads, 0, s>>>(
            gl, el, reinterpret_cast<float*>(payload), l.numel, sums_.data() + i, sti, gains.count > 0);
        GRAVAC_CHECK_CUDA_LAUNCH();
        continue;
      }
      const auto k = static_cast<std::uint32_t>(d.header.count);
      const std::uint32_t cap = static_cast<std::uint32_t>(std::min<std::size_t>(cap_, l.numel));
      cd::fused_pass<<<grid, cd::select_threads, 0, s>>>(gl, el, l.numel, k, sti, prev_threshold_.data() + i,
                                                         hist_.data(), hist_sq_.data(), cand_.data(), cap,
                                                         sums_.data() + i, gains, gain_out_.data());
      GRAVAC_CHECK_CUDA_LAUNCH();
      if (k == 0) continue;
      const int grid1 = blocks_for(l.numel, cd::select_threads);
      cd::collect_pass<<<grid1, cd::select_threads, 0, s>>>(el, l.numel, sti, cand_.data(), cap);
      GRAVAC_CHECK_CUDA_LAUNCH();
      for (int shift : {cd::refine_digit_bits, 0}) {
        // Over the candidates when they are valid; the grid covers the whole input otherwise.
        cd::refine_pass<<<grid1, cd::select_threads, 0, s>>>(el, l.numel, sti, cand_.data(), cap, hist_.data(), shift);
        GRAVAC_CHECK_CUDA_LAUNCH();
      }
      cd::tie_pass<<<std::min(grid1, 4 * sms_), cd::select_threads, 0, s>>>(el, l.numel, sti, chunk_counts_.data());
      GRAVAC_CHECK_CUDA_LAUNCH();
      auto* idx = reinterpret_cast<std::uint32_t*>(payload);
      float* values = reinterpret_cast<float*>(payload + pad8(static_cast<std::size_t>(k) * sizeof(std::uint32_t)));
      std::size_t temp = select_temp_.size();
      GRAVAC_TRY_CUDA(cub::DeviceSelect::If(select_temp_.data(), temp, thrust::counting_iterator<std::uint32_t>(0),
                                            thrust::make_tabulate_output_iterator(cd::bounded_index_writer{idx, k}),
                                            &sti->selected, static_cast<std::int64_t>(l.numel),
                                            cd::selected_by_threshold{el, sti}, s));
      cd::gather_pass<<<blocks_for(k, cd::select_threads), cd::select_threads, 0, s>>>(
          idx, values, el, k, sti, prev_threshold_.data() + i, sums_.data() + i, failure_.data());
      GRAVAC_CHECK_CUDA_LAUNCH();
    }
    // One copy of the statistics back, then the packet and the residual are final.
    GRAVAC_TRY_CUDA(cudaMemcpyAsync(host_states_.data(), states_.data(), states_.size() * sizeof(cd::select_state),
                                    cudaMemcpyDeviceToHost, s));
    GRAVAC_TRY_CUDA(cudaMemcpyAsync(host_sums_.data(), sums_.data(), sums_.size() * sizeof(cd::layer_sums),
                                    cudaMemcpyDeviceToHost, s));
    GRAVAC_TRY_CUDA(cudaMemcpyAsync(host_gain_.data(), gain_out_.data(), host_gain_.size() * sizeof(double),
                                    cudaMemcpyDeviceToHost, s));
    GRAVAC_TRY_CUDA(cudaMemcpyAsync(host_failure_.data(), failure_.data(), sizeof(std::uint32_t),
                                    cudaMemcpyDeviceToHost, s));
    options_.stream.synchronize();
    for (std::size_t i = 0; i < layout_.size(); ++i)
      if (host_states_[i].too_few_finite)  // e holds u: nothing was sent, nothing lost
        throw error(status::non_finite, "topk_cuda: layer '" + layout_[i].name +
                                            "' has fewer finite values than the k to send");
    if (host_failure_[0])
      throw error(status::backend_failure, "topk_cuda: the compaction did not select exactly k values",
                  -1, backend::cuda);
    for (std::size_t i = 0, seg = 0; i < layout_.size(); ++i) {
      const auto& l = layout_[i];
      if (l.numel == 0) continue;
      const auto& d = plan[seg++];
      const auto& sm = host_sums_[i];
      st.layers[i] = {static_cast<std::size_t>(d.header.count), sm.grad_sq, sm.input_sq, sm.kept_sq};
      st.non_finite |= host_states_[i].non_finite != 0;
    }
    for (std::size_t c = 0; c < p.gain_candidates.size(); ++c) st.candidate_kept_sq[c] = host_gain_[c];
    return pos;
  }

  //! Validates an untrusted packet in device memory (header walk and every index checked
  //! on the device; only the verdict is copied back).
  [[nodiscard]] validation validate(std::span<const std::byte> packet) const {
    return packets_.validate(packet, kind);
  }
  //! Adds scale * the packet's values at their indices to \p out (device memory). The
  //! packet must have been validated. Asynchronous on the compressor's stream.
  void decompress_add(std::span<const std::byte> packet, grad_view<cuda_space> out, float scale) const {
    require(out.size() == layout_.numel(), "topk_cuda::decompress_add: buffer size does not match the layout");
    packets_.scatter_add(packet, kind, out.data(), scale);
  }

  //! Sets \p v to zero on the compressor's stream (used by the collectives before decoding).
  void zero(grad_view<cuda_space> v) const {
    if (v.size()) GRAVAC_TRY_CUDA(cudaMemsetAsync(v.data(), 0, v.size() * sizeof(float), options_.stream.get()));
  }
  //! Waits for the compressor's queued work (decoding) to finish.
  void synchronize() const { options_.stream.synchronize(); }
  //! The compressor's stream.
  [[nodiscard]] stream_ref stream() const noexcept { return options_.stream; }

 private:
  [[nodiscard]] int blocks_for(std::size_t n, int per_block) const noexcept {
    const std::size_t need = (n + static_cast<std::size_t>(per_block) - 1) / static_cast<std::size_t>(per_block);
    return static_cast<int>(std::clamp<std::size_t>(need, 1, static_cast<std::size_t>(sms_) * 8));
  }

  layout layout_;
  options options_;
  mutable cuda_detail::device_packets packets_;
  int sms_ = 1;
  std::uint32_t cap_ = 0;
  device_buffer<cuda_detail::select_state> states_;
  device_buffer<std::uint32_t> prev_threshold_;
  device_buffer<cuda_detail::layer_sums> sums_;
  device_buffer<std::uint32_t> hist_;
  device_buffer<double> hist_sq_;
  device_buffer<double> gain_out_;
  device_buffer<std::uint32_t> failure_;
  device_buffer<std::uint32_t> cand_;
  device_buffer<std::uint32_t> chunk_counts_;
  device_buffer<std::byte> select_temp_;
  pinned_buffer<cuda_detail::select_state> host_states_;
  pinned_buffer<cuda_detail::layer_sums> host_sums_;
  pinned_buffer<double> host_gain_;
  pinned_buffer<std::uint32_t> host_failure_;
};
static_assert(Compressor<topk_cuda>);

}  // namespace gravac
