#pragma once
//! \file
//! \brief The per-layer skeleton every host compressor shares, and the public extension
//! point for writing one: the packet header, raw segments for layers sent dense, the gain
//! curve, validation and decoding. A compressor supplies only what it does to one
//! compressed layer (docs/custom_sparse_compressor.md walks through one).

#include <cstddef>
#include <memory>
#include <span>
#include <vector>

#include "gravac/core/layout.hpp"
#include "gravac/core/step.hpp"
#include "gravac/packet/format.hpp"
#include "gravac/packet/packet_bound.hpp"
#include "gravac/packet/raw_segment.hpp"
#include "gravac/stats/gain_curve.hpp"
#include "gravac/stats/magnitude_histogram.hpp"

namespace gravac {

//! Reusable scratch of the layered skeleton (sized once, reused every step).
struct layered_scratch {
  //! |u| of one layer, for the gain curve; made on first use (48 KiB of bins), so that a
  //! compressor whose steps never ask for the gain curve (e.g. the compressed allreduce's N
  //! shard compressors per rank) does not carry it.
  magnitude_histogram& histogram() {
    if (!histogram_) histogram_ = std::make_unique<magnitude_histogram>();
    return *histogram_;
  }

 private:
  std::unique_ptr<magnitude_histogram> histogram_;
};

//! The gain curve's one computation, handed to a layer function that builds a histogram of
//! its layer's u anyway (for its own selection): it passes the histogram to add() instead
//! of the skeleton reading u a second time. Every gain curve of the host compressors,
//! whoever built the histogram, is computed here.
class gain_report {
 public:
  //! A report for \p candidates into \p kept_sq (one entry per candidate).
  gain_report(std::span<const double> candidates, std::span<double> kept_sq) noexcept
      : candidates_(candidates), kept_sq_(kept_sq) {}
  //! Whether the step asks for the gain curve.
  [[nodiscard]] bool wanted() const noexcept { return !candidates_.empty(); }
  //! Adds to the curve the energy exact top-k would keep at each candidate, for a layer of
  //! \p numel elements whose u is counted in \p h (every element; a sampled histogram
  //! must be completed with the elements it left out first).
  void add(const magnitude_histogram& h, std::size_t numel) const noexcept {
    if (wanted()) add_gain_curve(h, numel, candidates_, kept_sq_);
  }

 private:
  std::span<const double> candidates_;
  std::span<double> kept_sq_;
};

//! A layer function that reports its layer's gain curve itself: it takes a gain_report&
//! after its layer_stats&.
template <class LayerFn>
concept reports_gain = requires(LayerFn& fn, byte_writer& w, std::uint32_t i, std::span<const float> g,
                                std::span<float> e, double f, layer_stats& ls, gain_report& gr) {
  fn(w, i, g, e, f, ls, gr);
};

//! Compresses layer by layer. Layers whose kept fraction is >= 1 are written raw; for the
//! others `fn(writer, layer_index, g, e, fraction, layer_stats&)` writes one segment and
//! updates e. When gain candidates are requested, the gain curve of u = g + e is
//! accumulated from a magnitude histogram (one read of g and e, no sort) before fn runs,
//! unless fn takes a trailing gain_report& (reports_gain): it then reports its compressed
//! layers' curve from the histogram it builds for its own selection. Empty layers produce
//! no segment. Returns the packet size.
template <class LayerFn>
std::size_t compress_layers(const layout& lay, packet_kind kind, std::span<const float> g, std::span<float> e,
                            const step_params& p, std::span<std::byte> out, compress_stats& st,
                            layered_scratch& scratch, LayerFn&& fn) {
  require(g.size() == lay.numel() && e.size() == lay.numel(), "compress: buffer size does not match the layout");
  require(p.kept_fraction.size() == lay.size(), "compress: one kept fraction per layer is required");
  st.reset(lay.size(), p.gain_candidates.size());
  gain_report gain(p.gain_candidates, st.candidate_kept_sq);
  byte_writer w(out);
  std::byte* head = begin_packet(w);
  std::uint32_t segments = 0;
  for (std::size_t i = 0; i < lay.size(); ++i) {
    const layer& l = lay[i];
    if (l.numel == 0) continue;
    auto gl = g.subspan(l.offset, l.numel);
    auto el = e.subspan(l.offset, l.numel);
    const bool dense = p.kept_fraction[i] >= dense_fraction;
    if (gain.wanted() && (dense || !reports_gain<LayerFn>)) {
      magnitude_histogram& h = scratch.histogram();
      add_sum_to_histogram(gl, el, h);
      gain.add(h, l.numel);
      h.clear();
    }
    const auto index = static_cast<std::uint32_t>(i);
    if (dense)
      write_raw_segment(w, index, gl, el, st.layers[i]);
    else if constexpr (reports_gain<LayerFn>)
      fn(w, index, gl, el, p.kept_fraction[i], st.layers[i], gain);
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
