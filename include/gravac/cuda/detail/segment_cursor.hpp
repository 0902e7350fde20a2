#pragma once
//! \file segment_cursor.hpp
//! \brief Packets whose segment sizes are known only on the device. A layer's segment is
//! placed (header written, padding zeroed, the cursor advanced) by a one-thread kernel as
//! soon as the layer's count is resolved on the device; the kernels that fill the payload
//! read its offset from device memory; a last kernel writes the packet header. No host
//! round trip between layers, and a count that differs from the planned one (fewer finite
//! values than k, a threshold's k_hat) never shifts a later layer onto stale offsets.

#include "gravac/cuda/detail/nvcc_flags.hpp"
// (first, and apart from the includes below: a missing compiler option is one readable error)

#include <cstddef>
#include <cstdint>

#include "gravac/packet/format.hpp"
#include "gravac/packet/raw_segment.hpp"

namespace gravac::detail {

//! Where the next segment goes (device memory; zeroed at the start of every compress).
struct packet_cursor {
  unsigned long long used;  //!< bytes of segments written after the packet header
  std::uint32_t segments;   //!< segments written
  std::uint32_t pad_;       //!< zero
};

//! What one layer's segment looks like, decided on the device before its payload is written.
struct segment_slot {
  unsigned long long payload_at;  //!< offset of the payload in the packet
  unsigned long long count;       //!< segment_header::count
  std::uint32_t placed;           //!< the header is written
  std::uint32_t raw;              //!< a raw (dense) segment: count floats, no indices
};

//! The layout of a segment payload as up to three regions, each padded to 8 bytes.
struct payload_shape {
  unsigned long long region[3] = {0, 0, 0};  //!< unpadded bytes of each region
};

//! Writes the segment header of layer \p layer at the cursor, zeroes the last 8-byte word
//! of each non-empty payload region (its padding; the data kernels then overwrite the data
//! bytes) and advances the cursor. One thread. \p count is the segment's count field.
__device__ inline void place_segment_at(std::byte* packet, packet_cursor* cur, segment_slot* slot, std::uint32_t layer,
                                        std::uint8_t index_width, std::uint8_t encoding, unsigned long long numel,
                                        unsigned long long count, const payload_shape& shape) {
  const unsigned long long at = sizeof(packet_header) + cur->used;
  segment_header h{};
  h.layer = layer;
  h.index_width = index_width;
  h.encoding = encoding;
  h.numel = numel;
  h.count = count;
  unsigned long long payload = 0;
  for (unsigned long long r : shape.region) payload += pad8(r);
  h.payload_bytes = payload;
  memcpy(packet + at, &h, sizeof h);
  unsigned long long end = at + sizeof(segment_header);
  for (unsigned long long r : shape.region) {
    end += pad8(r);
    if (r) *reinterpret_cast<std::uint64_t*>(packet + end - 8) = 0;
  }
  slot->payload_at = at + sizeof(segment_header);
  slot->count = count;
  slot->placed = 1;
  cur->used += sizeof(segment_header) + payload;
  cur->segments += 1;
}

//! Places a sparse (indices + float values) segment of \p count values, or (\p raw) a raw
//! segment of every value. One thread.
__device__ inline void place_layer_segment(std::byte* packet, packet_cursor* cur, segment_slot* slot,
                                           std::uint32_t layer, unsigned long long numel, unsigned long long count,
                                           bool raw) {
  payload_shape s;
  if (raw) {
    s.region[0] = numel * sizeof(float);
    place_segment_at(packet, cur, slot, layer, 0, raw_encoding, numel, numel, s);
    slot->raw = 1;
  } else {
    s.region[0] = count * sizeof(std::uint32_t);  // layers of 2^32 or more elements are rejected at construction
    s.region[1] = count * sizeof(float);
    place_segment_at(packet, cur, slot, layer, 4, 0, numel, count, s);
  }
}

//! Places a sparse segment of *count values, or a raw segment (place_layer_segment).
static __global__ void place_sparse_segment(std::byte* __restrict__ packet, packet_cursor* __restrict__ cur,
                                            segment_slot* __restrict__ slot, const std::uint32_t* __restrict__ count,
                                            std::uint32_t layer, unsigned long long numel, bool raw) {
  if (blockIdx.x != 0 || threadIdx.x != 0) return;
  place_layer_segment(packet, cur, slot, layer, numel, raw ? numel : *count, raw);
}

//! Writes the packet header once every segment is placed. One thread.
static __global__ void finish_device_packet(std::byte* __restrict__ packet, const packet_cursor* __restrict__ cur,
                                            std::uint8_t kind, std::uint64_t layout_hash) {
  if (blockIdx.x != 0 || threadIdx.x != 0) return;
  packet_header h{};
  h.magic = packet_magic;
  h.version = packet_version;
  h.kind = kind;
  h.segment_count = cur->segments;
  h.layout_hash = layout_hash;
  h.payload_bytes = cur->used;
  memcpy(packet, &h, sizeof h);
}

}  // namespace gravac::detail
