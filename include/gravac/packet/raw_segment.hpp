#pragma once
//! \file
//! \brief Layers sent uncompressed inside any packet kind: a segment with encoding
//! `raw_encoding` carries the layer's numel floats. Shared by every compressor, so a
//! policy can send some layers dense (Accordion's 1-D tensors, GraVAC's dense fallback).

#include <cmath>
#include <cstddef>
#include <span>

#include "gravac/core/detail/square_sum.hpp"
#include "gravac/core/layout.hpp"
#include "gravac/core/step.hpp"
#include "gravac/packet/format.hpp"

namespace gravac {

//! Segment encoding that marks a layer sent as raw floats.
inline constexpr std::uint8_t raw_encoding = 0xff;

//! Bytes a raw segment of \p numel floats occupies.
constexpr std::size_t raw_segment_bytes(std::size_t numel) noexcept {
  return sizeof(segment_header) + pad8(numel * sizeof(float));
}

//! Writes layer \p index as a raw segment: u = g + e is sent whole and e becomes 0.
//! Fills the layer's statistics (square_sum.hpp's order).
inline void write_raw_segment(byte_writer& w, std::uint32_t index, std::span<const float> g, std::span<float> e,
                              layer_stats& st) {
  segment_header sh;
  sh.layer = index;
  sh.encoding = raw_encoding;
  sh.numel = g.size();
  sh.count = g.size();
  write_segment(w, sh, [&](byte_writer& bw) {
    std::byte* dst = bw.reserve(g.size() * sizeof(float));
    for (std::size_t i = 0; i < g.size(); ++i) {
      const float u = g[i] + e[i];
      std::memcpy(dst + i * sizeof(float), &u, sizeof(float));
      e[i] = 0.0f;
    }
    st.grad_sq = detail::square_sum(g);
    st.input_sq = detail::square_sum_bytes(dst, g.size());
    st.kept_sq = st.input_sq;
    st.kept = g.size();
  });
}

//! Checks a raw segment's payload: count == numel and exactly numel floats.
inline validation validate_raw_segment(const segment_header& sh, std::span<const std::byte> payload) {
  if (sh.index_width != 0) return validation::fail("raw segment with indices");
  if (sh.count != sh.numel) return validation::fail("raw segment count differs from numel");
  if (payload.size() != pad8(sh.numel * sizeof(float))) return validation::fail("raw segment payload size wrong");
  return {};
}

//! Adds scale * the raw values of a validated segment to \p out (the layer's slice).
inline void add_raw_segment(std::span<const std::byte> payload, std::span<float> out, float scale) {
  for (std::size_t i = 0; i < out.size(); ++i) out[i] += scale * load_at<float>(payload, i);
}

}  // namespace gravac
