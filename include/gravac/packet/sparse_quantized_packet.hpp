#pragma once
//! \file
//! \brief The sparse quantized segment of SparseLoCo (packet_kind::sparse_quantized):
//! per chunk of a layer, the offsets of its kept values and a 2-bit code for each, with one
//! float scale per chunk. Sizes, the four levels, validation of untrusted payloads and the
//! decoder live here, apart from the compressor, so that the wire format has one owner.
//!
//! Payload of a segment with encoding sparse_quantized_encoding (index_width 2), each part
//! padded to 8 bytes with zero bytes:
//! - a prefix of four uint32: `chunk` (elements per chunk), `chunks` (= ceil(numel /
//!   chunk)), `k_full` (values kept in each chunk but the last; equal to `k_last` when the
//!   layer is one chunk) and `k_last` (values kept in the last chunk, which may be shorter);
//! - `chunks` float scales s_c, finite and non-negative (+0 when the chunk keeps nothing);
//! - `count` uint16 offsets inside their chunk, chunk after chunk, strictly increasing
//!   within a chunk and below the chunk's length;
//! - `count` 2-bit codes, four to a byte from bit 0 (code i in bits 2(i mod 4) of byte
//!   i / 4), the bits after the last code zero.
//!
//! `count` (segment_header::count) is k_full * (chunks - 1) + k_last. The kept counts are
//! the same for every full chunk, so they are not repeated per chunk: a packet costs the
//! prefix, 4 bytes per chunk and 2.25 bytes per kept value (before padding).
//!
//! A code's bit 1 is the sign (1: negative) and bit 0 the magnitude (1: s, 0: s / 3), so
//! the four levels are {-s, -s/3, +s/3, +s}: symmetric, evenly spaced, no zero level.

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>

#include "gravac/packet/format.hpp"

namespace gravac {

//! segment_header::encoding of a SparseLoCo segment (raw segments use raw_encoding).
inline constexpr std::uint8_t sparse_quantized_encoding = 1;
//! segment_header::index_width of a SparseLoCo segment: offsets inside a chunk are uint16.
inline constexpr std::uint8_t sparse_quantized_index_width = 2;
//! Largest chunk: offsets inside a chunk must fit in 16 bits.
inline constexpr std::size_t sparse_quantized_max_chunk = 65536;
//! Bytes of the payload's prefix (four uint32).
inline constexpr std::size_t sparse_quantized_prefix_bytes = 16;

//! The prefix of a SparseLoCo segment's payload.
struct sparse_quantized_prefix {
  std::uint32_t chunk = 0;   //!< elements per chunk
  std::uint32_t chunks = 0;  //!< chunks in the layer, ceil(numel / chunk)
  std::uint32_t k_full = 0;  //!< values kept in each chunk but the last
  std::uint32_t k_last = 0;  //!< values kept in the last chunk
};
static_assert(sizeof(sparse_quantized_prefix) == sparse_quantized_prefix_bytes);

//! Number of chunks of \p chunk elements covering \p numel.
constexpr std::size_t sparse_quantized_chunks(std::size_t numel, std::size_t chunk) noexcept {
  return (numel + chunk - 1) / chunk;
}

//! Payload bytes of a segment of \p chunks chunks carrying \p count values.
constexpr std::size_t sparse_quantized_payload_bytes(std::size_t chunks, std::size_t count) noexcept {
  return sparse_quantized_prefix_bytes + pad8(chunks * sizeof(float)) + pad8(count * 2) + pad8((count + 3) / 4);
}

//! The value code \p code stands for in a chunk of scale \p s. The compressor and the
//! decoder both call this one function, so the residual the sender keeps and the values
//! the receivers add are the same bits.
inline float sparse_quantized_level(std::uint8_t code, float s) noexcept {
  const float magnitude = (code & 1u) ? s : s / 3.0f;
  return (code & 2u) ? -magnitude : magnitude;
}

//! The code of \p u in a chunk of scale \p s (|u| <= s): the nearest level, with the
//! midpoint 2s/3 between s/3 and s going to s/3; sign(+-0) is +.
inline std::uint8_t sparse_quantized_code(float u, float s) noexcept {
  const float third = s / 3.0f;
  const auto magnitude = static_cast<std::uint8_t>(std::fabs(u) > third + third ? 1 : 0);
  return static_cast<std::uint8_t>((u < 0.0f ? 2u : 0u) | magnitude);
}

namespace detail {
//! True when every byte of \p b is zero (the padding a writer leaves).
inline bool all_zero_bytes(std::span<const std::byte> b) noexcept {
  for (const std::byte x : b)
    if (x != std::byte{0}) return false;
  return true;
}
}  // namespace detail

//! Validates a SparseLoCo segment's header and payload for a receiver whose chunk is \p
//! chunk: every field, size, scale, offset and padding bit, before anything is decoded.
inline validation validate_sparse_quantized_segment(const segment_header& sh, std::span<const std::byte> payload,
                                                    std::size_t chunk) {
  if (sh.encoding != sparse_quantized_encoding) return validation::fail("sparseloco segment: unknown encoding");
  if (sh.index_width != sparse_quantized_index_width) return validation::fail("sparseloco segment: wrong index width");
  if (sh.reserved != 0) return validation::fail("sparseloco segment: reserved field set");
  if (sh.numel == 0) return validation::fail("sparseloco segment for an empty layer");
  if (payload.size() < sparse_quantized_prefix_bytes) return validation::fail("sparseloco segment: truncated prefix");
  sparse_quantized_prefix pre;
  std::memcpy(&pre, payload.data(), sizeof pre);
  if (pre.chunk != chunk) return validation::fail("sparseloco segment: chunk length differs from the receiver's");
  const std::size_t chunks = sparse_quantized_chunks(sh.numel, chunk);
  if (pre.chunks != chunks) return validation::fail("sparseloco segment: wrong chunk count");
  const std::size_t last_len = sh.numel - (chunks - 1) * chunk;
  if (pre.k_full > chunk || pre.k_last > last_len) return validation::fail("sparseloco segment: count exceeds chunk");
  if (chunks == 1 && pre.k_full != pre.k_last) return validation::fail("sparseloco segment: one chunk, two counts");
  // k_full <= chunk, so the product is at most numel: no overflow.
  const std::size_t count = std::size_t{pre.k_full} * (chunks - 1) + pre.k_last;
  if (sh.count != count) return validation::fail("sparseloco segment: count does not match the chunk counts");
  if (payload.size() != sparse_quantized_payload_bytes(chunks, count))
    return validation::fail("sparseloco segment: payload size does not match count");

  const std::size_t scales_at = sparse_quantized_prefix_bytes;
  const std::size_t index_at = scales_at + pad8(chunks * sizeof(float));
  const std::size_t codes_at = index_at + pad8(count * 2);
  const auto kept_in = [&](std::size_t c) -> std::size_t { return c + 1 < chunks ? pre.k_full : pre.k_last; };
  for (std::size_t c = 0; c < chunks; ++c) {
    const float s = load_at<float>(payload.subspan(scales_at), c);
    if (!std::isfinite(s) || std::signbit(s)) return validation::fail("sparseloco segment: bad scale");
    if (kept_in(c) == 0 && s != 0.0f) return validation::fail("sparseloco segment: scale of an empty chunk");
  }
  if (!detail::all_zero_bytes(payload.subspan(scales_at + chunks * sizeof(float), index_at - scales_at - chunks * 4)))
    return validation::fail("sparseloco segment: scale padding set");
  const auto offsets = payload.subspan(index_at);
  std::size_t at = 0;
  for (std::size_t c = 0; c < chunks; ++c) {
    const std::size_t len = c + 1 < chunks ? chunk : last_len;
    for (std::size_t j = 0; j < kept_in(c); ++j, ++at) {
      const std::uint16_t off = load_at<std::uint16_t>(offsets, at);
      if (off >= len) return validation::fail("sparseloco segment: index out of range");
      if (j > 0 && off <= load_at<std::uint16_t>(offsets, at - 1))
        return validation::fail("sparseloco segment: indices not strictly increasing");
    }
  }
  if (!detail::all_zero_bytes(payload.subspan(index_at + count * 2, codes_at - index_at - count * 2)))
    return validation::fail("sparseloco segment: index padding set");
  const std::size_t code_bytes = (count + 3) / 4;
  if (count % 4 != 0) {
    const auto last = static_cast<unsigned>(payload[codes_at + code_bytes - 1]);
    if ((last >> (2 * (count % 4))) != 0) return validation::fail("sparseloco segment: code padding bits set");
  }
  if (!detail::all_zero_bytes(payload.subspan(codes_at + code_bytes)))
    return validation::fail("sparseloco segment: code padding set");
  return {};
}

//! Adds scale * the decoded values of a validated SparseLoCo segment to \p out (the
//! layer's slice).
inline void add_sparse_quantized_segment(const segment_header& sh, std::span<const std::byte> payload,
                                         std::span<float> out, float scale) {
  sparse_quantized_prefix pre;
  std::memcpy(&pre, payload.data(), sizeof pre);
  const std::size_t chunks = pre.chunks;
  const auto scales = payload.subspan(sparse_quantized_prefix_bytes);
  const auto offsets = scales.subspan(pad8(chunks * sizeof(float)));
  const auto codes = offsets.subspan(pad8(static_cast<std::size_t>(sh.count) * 2));
  std::size_t at = 0;
  for (std::size_t c = 0; c < chunks; ++c) {
    const float s = load_at<float>(scales, c);
    const float levels[4] = {sparse_quantized_level(0, s), sparse_quantized_level(1, s), sparse_quantized_level(2, s),
                             sparse_quantized_level(3, s)};
    float* base = out.data() + c * pre.chunk;
    const std::size_t k = c + 1 < chunks ? pre.k_full : pre.k_last;
    for (std::size_t j = 0; j < k; ++j, ++at) {
      const auto code = static_cast<unsigned>(codes[at / 4]) >> (2 * (at % 4)) & 3u;
      base[load_at<std::uint16_t>(offsets, at)] += scale * levels[code];
    }
  }
}

}  // namespace gravac
