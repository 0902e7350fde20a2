#pragma once
//! \file packet_kernels.hpp
//! \brief Packets in device memory: writing headers and padding, validating an untrusted
//! packet (header walk and index checks on the device, one small copy of the verdict to
//! the host) and the scatter-add decompression. Same wire format as gravac/packet/format.hpp.

#include "gravac/cuda/detail/nvcc_flags.hpp"
// (first, and apart from the includes below: a missing compiler option is one readable error)

#include <cstddef>
#include <cstdint>

#include "gravac/cuda/detail/launch_config.hpp"
#include "gravac/packet/format.hpp"
#include "gravac/packet/raw_segment.hpp"

namespace gravac::detail {

//! One segment to write: where its header goes, the header, and the two payload regions
//! whose last 8-byte word must be zeroed (padding) before the data kernels fill them.
struct segment_desc {
  std::uint64_t at = 0;              //!< offset of the segment header in the packet
  segment_header header{};           //!< the header to write
  std::uint64_t region_end[2] = {};  //!< end offsets of the padded regions (0: none)
};

//! Writes the packet header (thread 0) and every segment header with its padding words.
static __global__ void write_packet_headers(std::byte* __restrict__ packet, const packet_header* __restrict__ head,
                                            const segment_desc* __restrict__ segs, std::uint32_t count) {
  const std::uint32_t t = blockIdx.x * blockDim.x + threadIdx.x;
  if (t == 0) memcpy(packet, head, sizeof(packet_header));
  if (t >= count) return;
  const segment_desc d = segs[t];
  memcpy(packet + d.at, &d.header, sizeof(segment_header));
  for (auto end : d.region_end)
    if (end) *reinterpret_cast<std::uint64_t*>(packet + end - 8) = 0;
}

//! Verdict codes of the device validation (0: valid). Texts in validation_reason().
enum verdict : std::uint32_t {
  v_ok = 0,
  v_truncated_header,
  v_magic,
  v_version,
  v_kind,
  v_layout,
  v_payload_size,
  v_segment_count,
  v_truncated_segment,
  v_layer_range,
  v_layer_order,
  v_numel,
  v_padding,
  v_payload_truncated,
  v_trailing,
  v_raw_indices,
  v_raw_count,
  v_raw_size,
  v_width,
  v_count,
  v_sparse_size,
  v_index_range,
  v_index_order,
  v_misaligned,
  v_unknown_encoding,
};

//! Human-readable reason of a verdict.
inline const char* validation_reason(std::uint32_t v) {
  switch (v) {
    case v_truncated_header:
      return "truncated header";
    case v_magic:
      return "wrong magic";
    case v_version:
      return "unsupported version";
    case v_kind:
      return "wrong kind";
    case v_layout:
      return "packet was built for another layout";
    case v_payload_size:
      return "payload size does not match the packet size";
    case v_segment_count:
      return "more segments than layers";
    case v_truncated_segment:
      return "truncated segment header";
    case v_layer_range:
      return "segment layer index out of range";
    case v_layer_order:
      return "segment layers not strictly increasing";
    case v_numel:
      return "segment numel does not match the layout";
    case v_padding:
      return "segment payload not padded";
    case v_payload_truncated:
      return "segment payload truncated";
    case v_trailing:
      return "trailing bytes after the last segment";
    case v_raw_indices:
      return "raw segment with indices";
    case v_raw_count:
      return "raw segment count differs from numel";
    case v_raw_size:
      return "raw segment payload size wrong";
    case v_width:
      return "sparse segment: wrong index width";
    case v_count:
      return "sparse segment: count exceeds numel";
    case v_sparse_size:
      return "sparse segment: payload size does not match count";
    case v_index_range:
      return "sparse segment: index out of range";
    case v_index_order:
      return "sparse segment: indices not strictly increasing";
    case v_misaligned:
      return "packet not aligned to 8 bytes";
    case v_unknown_encoding:
      return "unknown segment encoding";
    default:
      return "invalid packet";
  }
}

//! A segment found by the header walk.
struct segment_entry {
  std::uint64_t payload = 0;  //!< offset of the payload in the packet
  std::uint64_t count = 0;    //!< entries
  std::uint32_t layer = 0;    //!< layer index
  std::uint8_t width = 0;     //!< index width
  std::uint8_t raw = 0;       //!< a raw (dense) segment
};

//! The result of a header walk (device memory).
struct walk_result {
  std::uint32_t verdict;   //!< a verdict code
  std::uint32_t segments;  //!< segments found (valid when verdict is 0)
};

//! True in every thread of the block when the verdict is still v_ok. A payload check reads
//! the walk's verdict while its other threads may already be failing it by atomicCAS: thread
//! 0 reads it atomically and shares it (a plain read by every thread would race with them).
__device__ __forceinline__ bool block_sees_verdict_ok(std::uint32_t* verdict) {
  __shared__ std::uint32_t seen;
  if (threadIdx.x == 0) seen = atomicOr(verdict, 0u);
  __syncthreads();
  return seen == v_ok;
}

//! What the walk needs to know about the layout (device memory arrays).
struct layout_desc {
  const std::uint64_t* numel = nullptr;   //!< numel per layer
  const std::uint64_t* offset = nullptr;  //!< offset per layer in the flat buffer
  std::uint32_t layers = 0;               //!< number of layers
  std::uint64_t hash = 0;                 //!< layout::hash()
};

//! Reads the header of an untrusted packet of \p size bytes into \p h and makes every
//! packet-header check of validate_packet (\p kind expected): v_ok, or the first failing
//! verdict. Shared by every device walker, so they all check headers alike.
__device__ inline std::uint32_t read_packet_header(const std::byte* __restrict__ packet, std::uint64_t size,
                                                   const layout_desc& lay, std::uint8_t kind, packet_header& h) {
  if (size < sizeof(packet_header)) return v_truncated_header;
  memcpy(&h, packet, sizeof h);
  if (h.magic != packet_magic) return v_magic;
  if (h.version != packet_version) return v_version;
  if (h.kind != kind) return v_kind;
  if (h.layout_hash != lay.hash) return v_layout;
  if (h.payload_bytes != size - sizeof(packet_header)) return v_payload_size;
  if (h.segment_count > lay.layers) return v_segment_count;
  return v_ok;
}

//! Reads the segment header at \p pos (then advanced past it) into \p sh and checks it as
//! validate_packet does: layer in range and after \p last (then set to it), numel of the
//! layout, payload padded and inside the packet. v_ok, or the first failing verdict.
__device__ inline std::uint32_t read_segment_header(const std::byte* __restrict__ packet, std::uint64_t size,
                                                    const layout_desc& lay, std::uint64_t& pos, long long& last,
                                                    segment_header& sh) {
  if (size - pos < sizeof(segment_header)) return v_truncated_segment;
  memcpy(&sh, packet + pos, sizeof sh);
  pos += sizeof sh;
  if (sh.layer >= lay.layers) return v_layer_range;
  if (static_cast<long long>(sh.layer) <= last) return v_layer_order;
  last = sh.layer;
  if (sh.numel != lay.numel[sh.layer]) return v_numel;
  if (sh.payload_bytes % 8 != 0) return v_padding;
  if (sh.payload_bytes > size - pos) return v_payload_truncated;
  return v_ok;
}

//! The checks of a raw (dense) segment's header, as validate_raw_segment: v_ok, or the
//! first failing verdict.
__device__ inline std::uint32_t check_raw_segment(const segment_header& sh) {
  if (sh.index_width != 0) return v_raw_indices;
  if (sh.count != sh.numel) return v_raw_count;
  if (sh.payload_bytes != pad8(sh.numel * sizeof(float))) return v_raw_size;
  return v_ok;
}

//! Walks an untrusted packet (one thread): every header check of validate_packet, the raw
//! segments' checks, and `check(sh, payload)` (a verdict) on every other segment, whose
//! payload_bytes are already known to lie inside the packet; fills the segment table.
//! Reads no byte outside [packet, packet + size).
template <class SegmentCheck>
__device__ void walk_packet(const std::byte* __restrict__ packet, std::uint64_t size, layout_desc lay,
                            std::uint8_t kind, segment_entry* __restrict__ table, walk_result* __restrict__ out,
                            SegmentCheck check) {
  auto fail = [&](std::uint32_t v) { *out = {v, 0}; };
  packet_header h;
  if (const std::uint32_t v = read_packet_header(packet, size, lay, kind, h); v != v_ok) return fail(v);
  std::uint64_t pos = sizeof(packet_header);
  long long last = -1;
  for (std::uint32_t s = 0; s < h.segment_count; ++s) {
    segment_header sh;
    if (const std::uint32_t v = read_segment_header(packet, size, lay, pos, last, sh); v != v_ok) return fail(v);
    segment_entry en;
    en.payload = pos;
    en.count = sh.count;
    en.layer = sh.layer;
    en.width = sh.index_width;
    if (sh.encoding == raw_encoding) {
      if (const std::uint32_t v = check_raw_segment(sh); v != v_ok) return fail(v);
      en.raw = 1;
    } else {
      const std::uint32_t v = check(sh, packet + pos);
      if (v != v_ok) return fail(v);
    }
    table[s] = en;
    pos += sh.payload_bytes;
  }
  if (pos != size) return fail(v_trailing);
  *out = {v_ok, h.segment_count};
}

//! The payload checks of a sparse (indices + float values) segment.
struct sparse_segment_check {
  __device__ std::uint32_t operator()(const segment_header& sh, const std::byte*) const {
    if (sh.encoding != 0) return v_unknown_encoding;
    if (sh.index_width != index_width_for(sh.numel)) return v_width;
    if (sh.count > sh.numel) return v_count;
    if (sh.payload_bytes != pad8(sh.count * sh.index_width) + pad8(sh.count * sizeof(float))) return v_sparse_size;
    return v_ok;
  }
};

//! Walks an untrusted sparse packet (see walk_packet).
static __global__ void walk_sparse_packet(const std::byte* __restrict__ packet, std::uint64_t size, layout_desc lay,
                                          std::uint8_t kind, segment_entry* __restrict__ table,
                                          walk_result* __restrict__ out) {
  if (blockIdx.x != 0 || threadIdx.x != 0) return;
  walk_packet(packet, size, lay, kind, table, out, sparse_segment_check{});
}

//! Loads index \p i of a sparse payload.
__device__ __forceinline__ std::uint64_t load_index(const std::byte* payload, std::uint8_t width, std::uint64_t i) {
  return width == 4 ? static_cast<std::uint64_t>(reinterpret_cast<const std::uint32_t*>(payload)[i])
                    : reinterpret_cast<const std::uint64_t*>(payload)[i];
}

//! Checks every index of every sparse segment (in range, strictly increasing); slot y of
//! the grid takes segments y, y + gridDim.y, ...
static __global__ void check_sparse_indices(const std::byte* __restrict__ packet, layout_desc lay,
                                            const segment_entry* __restrict__ table, walk_result* __restrict__ out) {
  if (!block_sees_verdict_ok(&out->verdict)) return;
  const std::uint32_t segs = out->segments;
  for (std::uint32_t s = blockIdx.y; s < segs; s += gridDim.y) {
    const segment_entry en = table[s];
    if (en.raw) continue;
    const std::byte* p = packet + en.payload;
    const std::uint64_t numel = lay.numel[en.layer];
    for (std::uint64_t i = blockIdx.x * static_cast<std::uint64_t>(blockDim.x) + threadIdx.x; i < en.count;
         i += static_cast<std::uint64_t>(gridDim.x) * blockDim.x) {
      const std::uint64_t ix = load_index(p, en.width, i);
      if (ix >= numel)
        atomicCAS(&out->verdict, 0u, static_cast<std::uint32_t>(v_index_range));
      else if (i > 0 && ix <= load_index(p, en.width, i - 1))
        atomicCAS(&out->verdict, 0u, static_cast<std::uint32_t>(v_index_order));
    }
  }
}

//! out[layer offset + index] += scale * value for every segment of a validated packet
//! (raw segments add densely). Slot y of the grid takes segments y, y + gridDim.y, ...
//! The product and the sum are rounded apart (__fmul_rn, __fadd_rn), as the host decoder
//! rounds them: nvcc would otherwise fuse them into one multiply-add, 1 ulp apart.
static __global__ void scatter_add_sparse(const std::byte* __restrict__ packet, layout_desc lay,
                                          const segment_entry* __restrict__ table, const walk_result* __restrict__ walk,
                                          float* __restrict__ out, float scale) {
  if (walk->verdict != v_ok) return;
  const std::uint32_t segs = walk->segments;
  for (std::uint32_t s = blockIdx.y; s < segs; s += gridDim.y) {
    const segment_entry en = table[s];
    const std::byte* p = packet + en.payload;
    float* o = out + lay.offset[en.layer];
    const std::uint64_t step = static_cast<std::uint64_t>(gridDim.x) * blockDim.x;
    const std::uint64_t first = blockIdx.x * static_cast<std::uint64_t>(blockDim.x) + threadIdx.x;
    if (en.raw) {
      const float* v = reinterpret_cast<const float*>(p);
      for (std::uint64_t i = first; i < en.count; i += step) o[i] = __fadd_rn(o[i], __fmul_rn(scale, v[i]));
    } else {
      const float* v = reinterpret_cast<const float*>(p + pad8(en.count * en.width));
      for (std::uint64_t i = first; i < en.count; i += step) {
        float& d = o[load_index(p, en.width, i)];
        d = __fadd_rn(d, __fmul_rn(scale, v[i]));
      }
    }
  }
}

}  // namespace gravac::detail
