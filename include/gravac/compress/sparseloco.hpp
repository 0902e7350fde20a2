#pragma once
//! \file sparseloco.hpp
//! \brief SparseLoCo-style compression (docs/algorithms.md, "SparseLoCo"): error feedback
//! with a decaying residual, top-k per chunk of each layer, and the kept values quantized
//! to 2 bits with one scale per chunk. Made for DiLoCo-style pseudo-gradients, usable with
//! any gradient. Its runtime name is `sparseloco` (options sparseloco_decay, sparseloco_chunk).

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <span>
#include <vector>

#include "gravac/compress/detail/float_bits.hpp"
#include "gravac/compress/layered.hpp"
#include "gravac/concepts/concepts.hpp"
#include "gravac/core/error.hpp"
#include "gravac/packet/packet_bound.hpp"
#include "gravac/packet/raw_segment.hpp"
#include "gravac/packet/sparse_quantized_packet.hpp"
#include "gravac/stats/magnitude_histogram.hpp"

namespace gravac {

//! Options of sparseloco.
struct sparseloco_options {
  //! beta of the residual's decay, in (0, 1]: each step the residual becomes beta * e + g
  //! before selection. 1 is ordinary error feedback; below 1 old, never-sent values fade, which
  //! SparseLoCo uses in place of a separate outer momentum.
  float decay = 0.95f;
  //! Elements per chunk, in [1, 65536]: top-k and the 2-bit scale act on each chunk of a layer
  //! (the last chunk of a layer may be shorter). Offsets inside a chunk travel as uint16.
  std::uint32_t chunk = 4096;
};

//! Values kept of a chunk of \p len elements at kept fraction \p fraction:
//! ceil(fraction * len), in [1, len] for a positive fraction (0 for none). A product within
//! 1e-9 (relative) of an integer counts as that integer, so that 0.07 * 100 keeps 7 values
//! and not 8 through the rounding of 0.07. Every rank computes the same k from the shared
//! fraction.
constexpr std::size_t sparseloco_kept_count(std::size_t len, double fraction) noexcept {
  if (len == 0 || !(fraction > 0.0)) return 0;
  if (fraction >= 1.0) return len;
  const double x = fraction * static_cast<double>(len);
  const double nearest = std::floor(x + 0.5);
  const double k =
      (x - nearest <= 1e-9 * std::max(1.0, x) && nearest - x <= 1e-9 * std::max(1.0, x)) ? nearest : std::ceil(x);
  return std::clamp<std::size_t>(static_cast<std::size_t>(k), 1, len);
}

//! SparseLoCo-style compression with decaying error feedback. Models Compressor.
//!
//! Per layer: u = g + beta * e (into e), then, for each chunk of `chunk` elements, the k =
//! sparseloco_kept_count(chunk length, kept fraction) values of largest |u| (ties to the lower
//! offset) are kept, each sent as a 2-bit code of the levels {-s, -s/3, +s/3, +s}, s the largest
//! kept |u| of the chunk, rounded to the nearest level. e = u - decoded, with the very values
//! receivers decode: what was not delivered stays in the residual, bit for bit.
//!
//! - A layer at kept fraction 1 is sent raw (full precision), as with every compressor of the
//!   library: policies use 1 as "this layer dense", and allgather turns an all-dense step into
//!   a dense Allreduce that may bypass the compressor, which only raw semantics keep consistent.
//! - A layer whose u holds a NaN or an infinity sends nothing this step (a segment with no
//!   values): all of u stays in the residual and compress_stats::non_finite is set, so
//!   nothing non-finite goes on the wire. The trainer abandons or skips such a step anyway
//!   (non_finite_action); keeping the layer whole lets every full chunk keep the same count,
//!   which is what lets the wire format carry no per-chunk counts.
//! - The scales differ between ranks, so values cannot be summed by index: the packet is
//!   gathered (allgather) or decoded locally (dense_allreduce, flexible), not reduced. It is
//!   not offered to compressed_allreduce either (it has no get_options(), so it is not a
//!   ShardableCompressor): that collective's second stage would select and quantize the
//!   ranks' average again, on shards whose cuts move the chunk boundaries, which is no
//!   longer the method.
class sparseloco {
 public:
  //! Opt-in tag for the Compressor concept.
  using compressor_tag = void;
  //! Works on host memory.
  using memory_space = host_space;
  //! Options (see sparseloco_options).
  using options = sparseloco_options;
  //! Each rank has its own scales: values at shared indices cannot be summed.
  static constexpr bool summable_by_index = false;
  //! Packet kind written.
  static constexpr packet_kind kind = packet_kind::sparse_quantized;

  //! A compressor for \p lay; rejects a decay outside (0, 1] and a chunk outside [1, 65536].
  sparseloco(const layout& lay, const options& opt = {}) : layout_(lay), options_(opt) {
    require(opt.decay > 0.0f && opt.decay <= 1.0f, "sparseloco: decay must be in (0, 1]");
    require(opt.chunk >= 1 && opt.chunk <= sparse_quantized_max_chunk, "sparseloco: chunk must be in [1, ",
            sparse_quantized_max_chunk, "], got ", opt.chunk);
    for (const auto& l : lay.layers())
      require(sparse_quantized_chunks(l.numel, opt.chunk) <= 0xffffffffull,
              "sparseloco: a layer has 2^32 chunks or more; use a larger chunk");
    // Sized once: a step allocates nothing.
    keys_.reserve(std::min<std::size_t>(opt.chunk, largest_layer(lay)));
    selected_.reserve(std::min<std::size_t>(opt.chunk, largest_layer(lay)));
  }

  //! Upper bound of the packet size: every layer at its largest segment (every value kept)
  //! or raw, whichever is larger.
  [[nodiscard]] std::size_t max_packet_bytes() const noexcept {
    return packet_bytes_bound(layout_, [&](std::size_t, const layer& l) {
      return sizeof(segment_header) +
             sparse_quantized_payload_bytes(sparse_quantized_chunks(l.numel, options_.chunk), l.numel);
    });
  }

  //! e = g + decay * e, then sends the chunked top-k of each layer below kept fraction 1 as
  //! 2-bit codes (layers at 1 raw) and leaves e = u - decoded.
  std::size_t compress(host_view g, host_view e, const step_params& p, std::span<std::byte> out, compress_stats& st) {
    require(g.size() == layout_.numel() && e.size() == layout_.numel(),
            "compress: buffer size does not match the layout");
    require(p.kept_fraction.size() == layout_.size(), "compress: one kept fraction per layer is required");
    st.reset(layout_.size(), p.gain_candidates.size());
    const gain_report gain(p.gain_candidates, st.candidate_kept_sq);
    byte_writer w(out);
    std::byte* head = begin_packet(w);
    std::uint32_t segments = 0;
    for (std::size_t i = 0; i < layout_.size(); ++i) {
      const layer& l = layout_[i];
      if (l.numel == 0) continue;
      const auto gl = g.span().subspan(l.offset, l.numel);
      const auto el = e.span().subspan(l.offset, l.numel);
      layer_stats& ls = st.layers[i];
      const bool finite = fold(gl, el, ls);
      if (gain.wanted()) report_gain(el, gain);
      const auto index = static_cast<std::uint32_t>(i);
      if (!finite) {
        st.non_finite = true;
        write_layer(w, index, el, 0.0, ls);  // nothing kept: u stays in e
      } else if (p.kept_fraction[i] >= dense_fraction) {
        write_raw(w, index, el, ls);
      } else {
        write_layer(w, index, el, p.kept_fraction[i], ls);
      }
      ++segments;
    }
    finish_packet(w, head, kind, segments, layout_.hash());
    return w.size();
  }

  //! Validates an untrusted packet completely: headers, chunk counts, scales, offsets,
  //! padding bits, and finite values in raw segments (this compressor never sends others).
  [[nodiscard]] validation validate(std::span<const std::byte> packet) const {
    return validate_packet(packet, layout_, kind, [&](const segment_header& sh, std::span<const std::byte> pl) {
      if (sh.encoding == raw_encoding) {
        if (validation v = validate_raw_segment(sh, pl); !v) return v;
        for (std::size_t j = 0; j < sh.numel; ++j)
          if (!std::isfinite(load_at<float>(pl, j)))
            return validation::fail("sparseloco raw segment: non-finite value");
        if (!detail::all_zero_bytes(pl.subspan(sh.numel * sizeof(float))))
          return validation::fail("sparseloco raw segment: padding set");
        return validation{};
      }
      return validate_sparse_quantized_segment(sh, pl, options_.chunk);
    });
  }

  //! Adds scale * decompress(packet) to \p out; \p packet must have validated.
  void decompress_add(std::span<const std::byte> packet, host_view out, float scale) const {
    decompress_layers(packet, layout_, out.span(), scale,
                      [](const segment_header& sh, std::span<const std::byte> pl, std::span<float> o, float s) {
                        add_sparse_quantized_segment(sh, pl, o, s);
                      });
  }

 private:
  static std::size_t largest_layer(const layout& lay) noexcept {
    std::size_t m = 0;
    for (const auto& l : lay.layers()) m = std::max(m, l.numel);
    return m;
  }

  // e = g + decay * e (u, kept in e from here on); the layer's norms of g and u. Returns
  // whether u is finite. The residual update below starts from this stored u, so e = u -
  // decoded holds exactly however the build rounds beta * e + g (two roundings, or one where
  // a build contracts it into a fused multiply-add).
  bool fold(std::span<const float> g, std::span<float> e, layer_stats& ls) const noexcept {
    const float beta = options_.decay;
    double gsq = 0, usq = 0;
    bool finite = true;
    for (std::size_t j = 0; j < g.size(); ++j) {
      const float decayed = beta * e[j];
      const float u = g[j] + decayed;
      e[j] = u;
      gsq += static_cast<double>(g[j]) * g[j];
      usq += static_cast<double>(u) * u;
      finite = finite && std::isfinite(u);
    }
    ls = {0, gsq, usq, 0};
    return finite;
  }

  // The curve policies read: the energy exact top-k of the whole layer would keep at each
  // candidate fraction (chunked selection keeps about as much on gradients without
  // per-chunk structure; the curve is a guide for choosing the fraction, not a promise).
  void report_gain(std::span<const float> u, const gain_report& gain) {
    magnitude_histogram& h = scratch_.histogram();
    std::uint32_t lo = 0xffffffffu, hi = 0;
    for (const float x : u) {
      const std::uint32_t key = magnitude_key(x);
      lo = std::min(lo, key);
      hi = std::max(hi, key);
      h.add_unchecked(key);
    }
    h.note_range(lo, hi);
    gain.add(h, u.size());
    h.clear();
  }

  // The layer raw: u whole, e = 0.
  static void write_raw(byte_writer& w, std::uint32_t index, std::span<float> u, layer_stats& ls) {
    segment_header sh;
    sh.layer = index;
    sh.encoding = raw_encoding;
    sh.numel = u.size();
    sh.count = u.size();
    write_segment(w, sh, [&](byte_writer& bw) {
      bw.put_array(std::span<const float>(u));
      std::fill(u.begin(), u.end(), 0.0f);
    });
    ls.kept = u.size();
    ls.kept_sq = ls.input_sq;
  }

  // The layer's chunked top-k at \p fraction (0: nothing), 2-bit codes; e = u - decoded.
  void write_layer(byte_writer& w, std::uint32_t index, std::span<float> u, double fraction, layer_stats& ls) {
    const std::size_t n = u.size(), chunk = options_.chunk;
    const std::size_t chunks = sparse_quantized_chunks(n, chunk);
    const std::size_t last_len = n - (chunks - 1) * chunk;
    sparse_quantized_prefix pre;
    pre.chunk = static_cast<std::uint32_t>(chunk);
    pre.chunks = static_cast<std::uint32_t>(chunks);
    pre.k_last = static_cast<std::uint32_t>(sparseloco_kept_count(last_len, fraction));
    pre.k_full = chunks == 1 ? pre.k_last : static_cast<std::uint32_t>(sparseloco_kept_count(chunk, fraction));
    const std::size_t count = std::size_t{pre.k_full} * (chunks - 1) + pre.k_last;
    segment_header sh;
    sh.layer = index;
    sh.index_width = sparse_quantized_index_width;
    sh.encoding = sparse_quantized_encoding;
    sh.numel = n;
    sh.count = count;
    double kept_sq = 0;
    write_segment(w, sh, [&](byte_writer& bw) {
      bw.put(pre);
      std::byte* scales = bw.reserve(chunks * sizeof(float));
      std::byte* offsets = bw.reserve(count * 2);
      std::byte* codes = bw.reserve((count + 3) / 4);
      std::memset(codes, 0, (count + 3) / 4);  // codes are or-ed in
      std::size_t at = 0;
      for (std::size_t c = 0; c < chunks; ++c) {
        const std::size_t len = c + 1 < chunks ? chunk : last_len;
        const std::size_t k = c + 1 < chunks ? pre.k_full : pre.k_last;
        const auto uc = u.subspan(c * chunk, len);
        select(uc, k);
        float s = 0.0f;  // the largest kept |u|: the chunk's scale (+0 when nothing is kept)
        for (std::size_t j = 0; j < k; ++j) s = std::max(s, std::fabs(uc[selected_[j]]));
        std::memcpy(scales + c * sizeof(float), &s, sizeof s);
        for (std::size_t j = 0; j < k; ++j, ++at) {
          const std::uint16_t off = selected_[j];
          const std::uint8_t code = sparse_quantized_code(uc[off], s);
          const float q = sparse_quantized_level(code, s);
          uc[off] -= q;  // what the receivers will not have
          kept_sq += static_cast<double>(q) * q;
          std::memcpy(offsets + 2 * at, &off, sizeof off);
          codes[at / 4] |= static_cast<std::byte>(code << (2 * (at % 4)));
        }
      }
    });
    ls.kept = count;
    ls.kept_sq = kept_sq;
  }

  // selected_[0, k) = the offsets of the k largest |u| of the chunk \p u (all finite),
  // ascending. Each key is |u|'s bits above the complement of the offset: keys are
  // distinct, so the k largest keys are one set, the largest magnitudes with ties to the
  // lower offset, whatever order the selection visits them in.
  void select(std::span<const float> u, std::size_t k) {
    selected_.resize(k);
    if (k == u.size()) {
      for (std::size_t j = 0; j < k; ++j) selected_[j] = static_cast<std::uint16_t>(j);
      return;
    }
    if (k == 0) return;
    keys_.resize(u.size());
    for (std::size_t j = 0; j < u.size(); ++j)
      keys_[j] = (std::uint64_t{detail::float_bits(std::fabs(u[j]))} << 16) | (0xffffu - j);
    std::nth_element(keys_.begin(), keys_.begin() + static_cast<std::ptrdiff_t>(k - 1), keys_.end(), std::greater<>{});
    for (std::size_t j = 0; j < k; ++j) selected_[j] = static_cast<std::uint16_t>(0xffffu - (keys_[j] & 0xffffu));
    std::sort(selected_.begin(), selected_.end());
  }

  layout layout_;
  options options_;
  layered_scratch scratch_;
  std::vector<std::uint64_t> keys_;      // one chunk's selection keys
  std::vector<std::uint16_t> selected_;  // one chunk's kept offsets
};
static_assert(Compressor<sparseloco>);

}  // namespace gravac
