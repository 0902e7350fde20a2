#pragma once
//! \file
//! \brief The sparse segment (indices + float values) shared by top-k and threshold:
//! sizes, writing, validation of untrusted payloads and scatter-add decoding.
//!
//! Payload: `count` indices of `index_width` bytes (strictly increasing, < numel), padded
//! to 8 bytes, then `count` float values, padded to 8 bytes.

#include <cstddef>
#include <cstdint>
#include <span>

#include "gravac/packet/format.hpp"

namespace gravac {

//! Bytes of a sparse segment carrying \p k values of a layer of \p numel elements.
constexpr std::size_t sparse_segment_bytes(std::size_t numel, std::size_t k) noexcept {
  return sizeof(segment_header) + pad8(k * index_width_for(numel)) + pad8(k * sizeof(float));
}

//! Writes a sparse segment for layer \p index from ascending \p indices and their \p values.
//! Indices are narrowed to 32 bits when the layer fits.
template <class Index>
void write_sparse_segment(byte_writer& w, std::uint32_t index, std::size_t numel, std::span<const Index> indices,
                          std::span<const float> values) {
  segment_header sh;
  sh.layer = index;
  sh.index_width = index_width_for(numel);
  sh.numel = numel;
  sh.count = indices.size();
  write_segment(w, sh, [&](byte_writer& bw) {
    const std::size_t k = indices.size();
    std::byte* dst = bw.reserve(k * sh.index_width);
    if (sh.index_width == 4) {
      for (std::size_t i = 0; i < k; ++i) {
        const auto v = static_cast<std::uint32_t>(indices[i]);
        std::memcpy(dst + 4 * i, &v, 4);
      }
    } else {
      for (std::size_t i = 0; i < k; ++i) {
        const auto v = static_cast<std::uint64_t>(indices[i]);
        std::memcpy(dst + 8 * i, &v, 8);
      }
    }
    bw.put_array(values);
  });
}

//! Index \p i of a sparse payload of the given width.
inline std::uint64_t sparse_index_at(std::span<const std::byte> payload, std::uint8_t width, std::size_t i) noexcept {
  return width == 4 ? load_at<std::uint32_t>(payload, i) : load_at<std::uint64_t>(payload, i);
}

//! Validates a sparse segment: width, count, payload size, and every index in range and
//! strictly increasing (which also rules out repeats).
inline validation validate_sparse_segment(const segment_header& sh, std::span<const std::byte> payload) {
  if (sh.encoding != 0) return validation::fail("sparse segment: unknown encoding");  // never guess a layout
  if (sh.index_width != index_width_for(sh.numel)) return validation::fail("sparse segment: wrong index width");
  if (sh.count > sh.numel) return validation::fail("sparse segment: count exceeds numel");
  const std::size_t idx_bytes = pad8(sh.count * sh.index_width);
  if (payload.size() != idx_bytes + pad8(sh.count * sizeof(float)))
    return validation::fail("sparse segment: payload size does not match count");
  std::uint64_t prev = 0;
  for (std::size_t i = 0; i < sh.count; ++i) {
    const std::uint64_t ix = sparse_index_at(payload, sh.index_width, i);
    if (ix >= sh.numel) return validation::fail("sparse segment: index out of range");
    if (i > 0 && ix <= prev) return validation::fail("sparse segment: indices not strictly increasing");
    prev = ix;
  }
  return {};
}

//! Adds scale * values at their indices into \p out (the layer's slice); the segment
//! must have been validated.
inline void add_sparse_segment(const segment_header& sh, std::span<const std::byte> payload, std::span<float> out,
                               float scale) {
  const std::size_t idx_bytes = pad8(sh.count * sh.index_width);
  const auto values = payload.subspan(idx_bytes);
  // Scattered adds into a layer larger than the cache miss on almost every index:
  // prefetching some way ahead overlaps the misses.
  constexpr std::size_t ahead = 64;
  auto add_all = [&]<class Index>() {
    for (std::size_t i = 0; i < sh.count; ++i) {
      if (i + ahead < sh.count) __builtin_prefetch(out.data() + load_at<Index>(payload, i + ahead), 1);
      out[load_at<Index>(payload, i)] += scale * load_at<float>(values, i);
    }
  };
  if (sh.index_width == 4)
    add_all.template operator()<std::uint32_t>();
  else
    add_all.template operator()<std::uint64_t>();
}

}  // namespace gravac
