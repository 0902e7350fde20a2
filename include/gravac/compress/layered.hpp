#pragma once
//! \file
//! \brief The per-layer skeleton every host compressor shares, and the public extension
//! point for writing one: the packet header, raw segments for layers sent dense, the gain
//! curve, validation and decoding. A compressor supplies only what it does to one
//! compressed layer (docs/custom_sparse_compressor.md walks through one).

#include <cstddef>
#include <span>
#include <vector>

#include "gravac/packet/packet_bound.hpp"
#include "gravac/stats/gain_curve.hpp"
#include "gravac/stats/magnitude_histogram.hpp"
#include "gravac/packet/raw_segment.hpp"
#include "gravac/layout.hpp"
#include "gravac/packet/format.hpp"
#include "gravac/step.hpp"

namespace gravac {

//! Reusable scratch of the layered skeleton (sized once, reused every step).
struct layered_scratch {
  magnitude_histogram histogram;  //!< |u| of one layer, for the gain curve
};

//! Who computes the gain curve of the compressed layers.
enum class gain_source : std::uint8_t {
  skeleton,    //!< the skeleton, from a histogram of u = g + e before the layer function runs
  layer_function,  //!< the layer function (it already has a histogram of u); raw layers stay with the skeleton
};

//! Compresses layer by layer. Layers whose kept fraction is >= 1 are written raw; for the
//! others `fn(writer, layer_index, g, e, fraction, layer_stats&)` writes one segment and
//! updates e. When gain candidates are requested, the gain curve of u = g + e is
//! accumulated from a magnitude histogram (one read of g and e, no sort), unless
//! \p source says the layer function reports it for the layers it compresses. Empty
//! layers produce no segment. Returns the packet size.
template <gain_source source = gain_source::skeleton, class LayerFn>
std::size_t compress_layers(const layout& lay, packet_kind kind, std::span<const float> g, std::span<float> e,
                            const step_params& p, std::span<std::byte> out, compress_stats& st,
                            layered_scratch& scratch, LayerFn&& fn) {
  require(g.size() == lay.numel() && e.size() == lay.numel(), "compress: buffer size does not match the layout");
  require(p.kept_fraction.size() == lay.size(), "compress: one kept fraction per layer is required");
  st.reset(lay.size(), p.gain_candidates.size());
  byte_writer w(out);
  std::byte* head = begin_packet(w);
  std::uint32_t segments = 0;
  for (std::size_t i = 0; i < lay.size(); ++i) {
    const layer& l = lay[i];
    if (l.numel == 0) continue;
    auto gl = g.subspan(l.offset, l.numel);
    auto el = e.subspan(l.offset, l.numel);
    const bool dense = p.kept_fraction[i] >= dense_fraction;
    if (!p.gain_candidates.empty() && (dense || source == gain_source::skeleton)) {
      add_sum_to_histogram(gl, el, scratch.histogram);
      add_gain_curve(scratch.histogram, l.numel, p.gain_candidates, st.candidate_kept_sq);
      scratch.histogram.clear();
    }
    const auto index = static_cast<std::uint32_t>(i);
    if (dense)
      write_raw_segment(w, index, gl, el, st.layers[i]);
    else
      fn(w, index, gl, el, p.kept_fraction[i], st.layers[i]);
    ++segments;
  }
  finish_packet(w, head, kind, segments, lay.hash());
  return w.size();
}

//! Validates a packet of \p kind whose non-raw segments are checked by `fn(sh, payload)`.
template <class SegmentFn>
validation validate_layers(std::span<const std::byte> bytes, const layout& lay, packet_kind kind, SegmentFn&& fn) {
  return validate_packet(bytes, lay, kind, [&](const segment_header& sh, std::span<const std::byte> payload) {
    if (sh.encoding == raw_encoding) return validate_raw_segment(sh, payload);
    return fn(sh, payload);
  });
}

//! Adds scale * decompress(packet) to \p out; non-raw segments are decoded by
//! `fn(sh, payload, layer_slice, scale)`. The packet must have been validated.
template <class SegmentFn>
void decompress_layers(std::span<const std::byte> bytes, const layout& lay, std::span<float> out, float scale,
                       SegmentFn&& fn) {
  for_each_segment(bytes, [&](const segment_header& sh, std::span<const std::byte> payload) {
    const layer& l = lay[sh.layer];
    auto slice = out.subspan(l.offset, l.numel);
    if (sh.encoding == raw_encoding)
      add_raw_segment(payload, slice, scale);
    else
      fn(sh, payload, slice, scale);
  });
}

//! Packet bytes when every layer is sent raw: the header plus one raw segment per layer.
inline std::size_t raw_packet_bytes(const layout& lay) noexcept {
  return packet_bytes_bound(lay, [](std::size_t, const layer&) { return std::size_t{0}; });
}

}  // namespace gravac
