#pragma once
//! \file device_packets.hpp
//! \brief device_packets: the per-compressor machinery for packets in device memory (the
//! header plan, header writing, validation and scatter-add of sparse packets), with its
//! workspace allocated once for a layout.

#include "gravac/cuda/detail/nvcc_flags.hpp"
// (first, and apart from the includes below: a missing compiler option is one readable error)

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "gravac/core/layout.hpp"
#include "gravac/cuda/detail/launch.hpp"
#include "gravac/cuda/detail/launch_config.hpp"
#include "gravac/cuda/detail/packet_kernels.hpp"
#include "gravac/cuda/device_buffer.hpp"
#include "gravac/packet/raw_segment.hpp"
#include "gravac/packet/sparse_packet.hpp"

namespace gravac::detail {

//! Packets in device memory for one layout (see packet_kernels.hpp).
class device_packets {
 public:
  //! Workspace for \p lay, ordered on stream \p s.
  device_packets(const layout& lay, stream_ref s) : stream_(s), hash_(lay.hash()), layers_(lay.size()) {
    const std::size_t L = std::max<std::size_t>(lay.size(), 1);
    pinned_buffer<std::uint64_t> host(2 * L);
    for (std::size_t i = 0; i < lay.size(); ++i) {
      layer_numel_.push_back(lay[i].numel);
      host[i] = lay[i].numel;
      host[L + i] = lay[i].offset;
    }
    layer_info_ = device_buffer<std::uint64_t>(2 * L, s);
    GRAVAC_TRY_CUDA(cudaMemcpyAsync(layer_info_.data(), host.data(), 2 * L * sizeof(std::uint64_t),
                                    cudaMemcpyHostToDevice, s.get()));
    plan_host_.resize(L);
    head_host_.resize(1);
    plan_dev_ = device_buffer<segment_desc>(L, s);
    head_dev_ = device_buffer<packet_header>(1, s);
    table_ = device_buffer<segment_entry>(L, s);
    walk_ = device_buffer<walk_result>(1, s);
    walk_host_.resize(1);
    s.synchronize();  // the pinned staging above is freed when this returns
    L_ = L;
  }

  //! Starts the header plan of a new packet; returns the plan (valid until the next call).
  std::span<const segment_desc> begin_plan() noexcept {
    planned_ = 0;
    return {plan_host_.data(), L_};
  }
  //! Plans the segment of layer \p index at offset \p at: raw, or sparse with \p k values.
  //! Returns the offset after the segment.
  std::size_t add_segment(std::size_t index, std::size_t at, bool raw, std::size_t k) {
    const std::size_t numel = layer_numel_.at(index);
    segment_desc d;
    d.at = at;
    d.header.layer = static_cast<std::uint32_t>(index);
    d.header.numel = numel;
    const std::size_t payload = at + sizeof(segment_header);
    if (raw) {
      d.header.encoding = raw_encoding;
      d.header.count = numel;
      d.header.payload_bytes = pad8(numel * sizeof(float));
      d.region_end[0] = payload + d.header.payload_bytes;
    } else {
      d.header.index_width = index_width_for(numel);
      d.header.count = k;
      const std::size_t ib = pad8(k * d.header.index_width), vb = pad8(k * sizeof(float));
      d.header.payload_bytes = ib + vb;
      d.region_end[0] = ib ? payload + ib : 0;
      d.region_end[1] = vb ? payload + ib + vb : 0;
    }
    plan_host_[planned_++] = d;
    return payload + d.header.payload_bytes;
  }
  //! Writes the planned headers (and zero padding) into \p packet of \p total bytes.
  void write_headers(std::byte* packet, packet_kind kind, std::size_t total) {
    packet_header h;
    h.magic = packet_magic;
    h.version = packet_version;
    h.kind = static_cast<std::uint8_t>(kind);
    h.segment_count = static_cast<std::uint32_t>(planned_);
    h.layout_hash = hash_;
    h.payload_bytes = total - sizeof(packet_header);
    head_host_[0] = h;
    const cudaStream_t s = stream_.get();
    // The staging is reused next step; compress() synchronizes before it returns.
    GRAVAC_TRY_CUDA(cudaMemcpyAsync(head_dev_.data(), head_host_.data(), sizeof h, cudaMemcpyHostToDevice, s));
    if (planned_)
      GRAVAC_TRY_CUDA(cudaMemcpyAsync(plan_dev_.data(), plan_host_.data(), planned_ * sizeof(segment_desc),
                                      cudaMemcpyHostToDevice, s));
    const unsigned blocks = table_blocks(planned_, packet_threads);
    write_headers_kernel(packet, blocks, s);
  }

  //! Validates an untrusted sparse (or raw-segment) packet of \p kind in device memory.
  [[nodiscard]] validation validate(std::span<const std::byte> packet, packet_kind kind) {
    if (packet.size() < sizeof(packet_header)) return validation::fail(validation_reason(v_truncated_header));
    if (reinterpret_cast<std::uintptr_t>(packet.data()) % 8 != 0)
      return validation::fail(validation_reason(v_misaligned));
    launch_walk(packet, kind);
    launch_index_check(packet);
    const cudaStream_t s = stream_.get();
    GRAVAC_TRY_CUDA(cudaMemcpyAsync(walk_host_.data(), walk_.data(), sizeof(walk_result), cudaMemcpyDeviceToHost, s));
    stream_.synchronize();
    const std::uint32_t v = walk_host_[0].verdict;
    if (v == v_ok) return {};
    if (v == v_layout) return {status::layout_mismatch, validation_reason(v)};
    return validation::fail(validation_reason(v));
  }

  //! out += scale * decompress(packet) for a validated packet (asynchronous).
  void scatter_add(std::span<const std::byte> packet, packet_kind kind, float* out, float scale) {
    if (packet.size() < sizeof(packet_header) || reinterpret_cast<std::uintptr_t>(packet.data()) % 8 != 0)
      throw error(status::malformed_packet, "decompress_add: packet was not validated");
    launch_walk(packet, kind);  // rebuilds the segment table on the device (no host round trip)
    detail::launch(&scatter_add_sparse, launch_config::per_layer(layers_), packet_threads, stream_.get(), packet.data(),
                   desc(), table_.data(), walk_.data(), out, scale);
  }

  //! The layout as the kernels see it.
  [[nodiscard]] layout_desc desc() const noexcept {
    return {layer_info_.data(), layer_info_.data() + L_, static_cast<std::uint32_t>(layers_), hash_};
  }

 private:
  void write_headers_kernel(std::byte* packet, unsigned blocks, cudaStream_t s) {
    detail::launch(&write_packet_headers, blocks, packet_threads, s, packet, head_dev_.data(), plan_dev_.data(),
                   static_cast<std::uint32_t>(planned_));
  }
  void launch_walk(std::span<const std::byte> packet, packet_kind kind) {
    detail::launch(&walk_sparse_packet, one_block, one_thread, stream_.get(), packet.data(), packet.size(), desc(),
                   static_cast<std::uint8_t>(kind), table_.data(), walk_.data());
  }
  void launch_index_check(std::span<const std::byte> packet) {
    detail::launch(&check_sparse_indices, launch_config::per_layer(layers_), packet_threads, stream_.get(),
                   packet.data(), desc(), table_.data(), walk_.data());
  }

 private:
  stream_ref stream_;
  std::uint64_t hash_ = 0;
  std::size_t layers_ = 0;
  std::size_t L_ = 1;
  std::size_t planned_ = 0;
  std::vector<std::size_t> layer_numel_;
  device_buffer<std::uint64_t> layer_info_;
  pinned_buffer<segment_desc> plan_host_;
  pinned_buffer<packet_header> head_host_;
  device_buffer<segment_desc> plan_dev_;
  device_buffer<packet_header> head_dev_;
  device_buffer<segment_entry> table_;
  device_buffer<walk_result> walk_;
  pinned_buffer<walk_result> walk_host_;
};

}  // namespace gravac::detail
