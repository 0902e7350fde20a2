#pragma once
//! \file adacomp.hpp
//! \brief AdaComp (Chen et al. 2017, arXiv 1712.02679): per layer, bins of L_T elements;
//! an element is sent (index and sign) when the residue plus the gradient reaches its
//! bin's largest residue; one scale per layer. The number sent adapts by itself.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <iterator>
#include <limits>
#include <span>
#include <string>
#include <vector>

#include "gravac/compress/detail/adacomp_bits.hpp"
#include "gravac/compress/detail/float_bits.hpp"
#include "gravac/compress/detail/quantize_kernels.hpp"
#include "gravac/compress/layered.hpp"
#include "gravac/compress/step_settings.hpp"
#include "gravac/concepts/composition.hpp"
#include "gravac/concepts/concepts.hpp"
#include "gravac/core/detail/square_sum.hpp"
#include "gravac/packet/detail/bit_codes.hpp"
#include "gravac/packet/packet_bound.hpp"

namespace gravac {

//! Options of AdaComp: the default bin length L_T per layer kind, used where
//! adacomp_settings::bin_length is 0 for the layer.
struct adacomp_options {
  std::uint32_t conv_bin = 50;    //!< L_T of convolution layers (the paper: about 50)
  std::uint32_t dense_bin = 500;  //!< L_T of dense and recurrent layers (the paper: about 500)
  //! L_T of biases and norms. The paper does not say; they are small (often fewer than 500
  //! elements, one bin at 500) and cheap to send, so they get the conv value: a bin of 50
  //! still sends the largest few per bin instead of about one per layer.
  std::uint32_t bias_bin = 50;
};

//! Bytes of an AdaComp segment sending \p count elements of a layer of \p numel: the
//! header, 8 bytes (scale, L_T), the indices and the sign bits (about 33 bits per element).
constexpr std::size_t adacomp_segment_bytes(std::size_t numel, std::size_t count) noexcept {
  return sizeof(segment_header) + 8 + pad8(count * index_width_for(numel)) + pad8(detail::code_bytes(count, 1));
}

//! AdaComp with its own residue. Models Compressor.
//!
//! Per layer, with residue R (the trainer's residual) and gradient g, exactly as
//! docs/algorithms.md, "Compressors": (1) R += g, H = R + g; (2) bins of L_T consecutive elements, gmax_b =
//! max |R_i| in bin b; (3) send every i with |H_i| >= gmax_{bin(i)}: its index and the sign
//! of R_i; (4) scale = mean over bins of gmax_b (the sum is detail::exponent_sum, exact per
//! exponent and combined in a fixed order, so adacomp_cuda computes the same scale bit for
//! bit; divided by the bin count in double, rounded to float once); (5) R_i -= sign(R_i) *
//! scale for each sent i; (6) the receiver adds scale * sign_i.
//! An element whose R_i is exactly 0 is never sent: its sign is undefined, and a bin of
//! zeros (gmax 0) would otherwise send every element. An infinite or NaN R_i is never sent
//! and does not count in its bin's maximum (the scale stays finite, so the packet stays
//! valid); it stays in the residue and compress_stats::non_finite is set.
//!
//! Error feedback: R_new + decompress(sent) == R_old + g. Unsent elements satisfy it bit
//! for bit (R_new = fl(R_old + g), nothing decoded). A sent element has R_new = fl(R - s)
//! with s = ±scale, so fl(R_new + s) differs from R = fl(R_old + g) by at most one rounding
//! of each operation, i.e. |error| <= ulp(max(|R|, scale)); it is exact whenever scale/2 <=
//! |R| <= 2 scale (Sterbenz), the common case for sent elements.
//!
//! Segment (packet_kind::adacomp): index_width 4 or 8, count = elements sent, payload =
//! float scale, uint32 L_T, the ascending indices (padded to 8), the sign bits (1 =
//! negative, 8 to a byte, padded to 8 with zero bits).
class adacomp {
 public:
  //! Opt-in tag for the Compressor concept.
  using compressor_tag = void;
  //! What it acts on (composition.hpp): the bin length; it chooses per bin what to send.
  static constexpr decision acts_on = decision::bin_length;
  //! Works on host memory.
  using memory_space = host_space;
  //! Options (see adacomp_options).
  using options = adacomp_options;
  //! Per-step settings: the bin length per layer (set_step_settings).
  using step_settings = adacomp_settings;
  //! Each rank sends its own indices and scale: values at shared indices are not summable.
  static constexpr bool summable_by_index = false;
  //! Packet kind written.
  static constexpr packet_kind kind = packet_kind::adacomp;

  //! A compressor for \p lay; rejects a zero bin length. Workspaces are sized here once.
  adacomp(const layout& lay, const options& opt = {}) : layout_(lay), options_(opt) {
    require(opt.conv_bin > 0 && opt.dense_bin > 0 && opt.bias_bin > 0, "adacomp: bin lengths must be positive");
    std::size_t n32 = 0, n64 = 0;
    for (const auto& l : lay.layers()) {
      std::size_t& need = index_width_for(l.numel) == 4 ? n32 : n64;
      need = std::max(need, l.numel);
    }
    indices32_.resize(n32 + 8);
    indices64_.resize(n64 ? n64 + 8 : 0);
    negative_.resize(lay.max_layer_numel() + 8);
    gmax_.resize(detail::quant_chunk);
  }

  //! The bin lengths of the following compress() calls, one per layer of this layout (0,
  //! a missing layer or an empty vector: the option for the layer's kind), until set again.
  void set_step_settings(const step_settings& s) {
    settings_.bin_length.assign(s.bin_length.begin(), s.bin_length.end());  // no allocation once sized
  }
  //! The settings in use (set_step_settings).
  [[nodiscard]] const step_settings& settings() const noexcept { return settings_; }

  //! L_T of layer \p index: the step settings' value when non-zero, else the option for the layer's kind.
  [[nodiscard]] std::uint32_t bin_length(std::size_t index) const noexcept {
    const auto& b = settings_.bin_length;
    if (index < b.size() && b[index] > 0) return b[index];
    switch (layout_[index].kind) {
      case layer_kind::conv:
        return options_.conv_bin;
      case layer_kind::bias_or_norm:
        return options_.bias_bin;
      default:
        return options_.dense_bin;
    }
  }

  //! Upper bound of the packet size (every element sent).
  [[nodiscard]] std::size_t max_packet_bytes() const noexcept {
    return packet_bytes_bound(layout_,
                              [](std::size_t, const layer& l) { return adacomp_segment_bytes(l.numel, l.numel); });
  }

  //! Runs AdaComp on every layer whose kept fraction is below 1 (the fraction's value is
  //! not used: AdaComp decides how many to send); layers at 1 or more go raw.
  std::size_t compress(host_view g, host_view e, const step_params& p, std::span<std::byte> out, compress_stats& st) {
    return compress_layers(
        layout_, kind, g.span(), e.span(), p, out, st, scratch_,
        [&](byte_writer& w, std::uint32_t index, std::span<const float> gl, std::span<float> el, double,
            layer_stats& ls) { write_layer(w, index, gl, el, bin_length(index), ls, st.non_finite); });
  }

  //! Validates an untrusted packet: index width, count, sizes, a finite scale, indices in
  //! range and strictly increasing (no repeats), zero padding.
  [[nodiscard]] validation validate(std::span<const std::byte> packet) const {
    return validate_layers(packet, layout_, kind, [](const segment_header& sh, std::span<const std::byte> pl) {
      return validate_segment(sh, pl);
    });
  }

  //! Adds scale * decompress(packet) to \p out.
  void decompress_add(std::span<const std::byte> packet, host_view out, float scale) const {
    decompress_layers(packet, layout_, out.span(), scale,
                      [](const segment_header& sh, std::span<const std::byte> pl, std::span<float> o, float s) {
                        const float v = load_at<float>(pl, 0);
                        const auto idx = pl.subspan(8);
                        const std::byte* bits = pl.data() + 8 + pad8(sh.count * sh.index_width);
                        const float pos = s * v, neg = s * -v;
                        for (std::size_t j = 0; j < sh.count; ++j) {
                          const std::uint64_t i =
                              sh.index_width == 4 ? load_at<std::uint32_t>(idx, j) : load_at<std::uint64_t>(idx, j);
                          const bool negative = (static_cast<unsigned>(bits[j / 8]) >> (j % 8)) & 1u;
                          o[i] += negative ? neg : pos;
                        }
                      });
  }

  //! Checks one AdaComp segment payload (see validate).
  static validation validate_segment(const segment_header& sh, std::span<const std::byte> pl) {
    if (sh.encoding != 0) return validation::fail("adacomp segment: unknown encoding");
    if (sh.index_width != index_width_for(sh.numel)) return validation::fail("adacomp segment: wrong index width");
    if (sh.count > sh.numel) return validation::fail("adacomp segment: count exceeds numel");
    const std::size_t idx_bytes = pad8(sh.count * sh.index_width);
    const std::size_t bit_bytes = pad8(detail::code_bytes(sh.count, 1));
    if (pl.size() != 8 + idx_bytes + bit_bytes)
      return validation::fail("adacomp segment: payload size does not match count");
    const float scale = load_at<float>(pl, 0);
    if (!(std::isfinite(scale) && scale >= 0)) return validation::fail("adacomp segment: scale not finite");
    if (load_at<std::uint32_t>(pl, 1) == 0) return validation::fail("adacomp segment: zero bin length");
    const auto idx = pl.subspan(8);
    std::uint64_t prev = 0;
    for (std::size_t j = 0; j < sh.count; ++j) {
      const std::uint64_t i = sh.index_width == 4 ? load_at<std::uint32_t>(idx, j) : load_at<std::uint64_t>(idx, j);
      if (i >= sh.numel) return validation::fail("adacomp segment: index out of range");
      if (j > 0 && i <= prev) return validation::fail("adacomp segment: indices not strictly increasing");
      prev = i;
    }
    if (!detail::code_padding_zero(pl.data() + 8 + idx_bytes, bit_bytes, sh.count))
      return validation::fail("adacomp segment: padding bits set");
    return {};
  }

 private:
  // Appends the indices of the sent elements of a chunk (\p sent[k] is 0 or 1, readable
  // up to m rounded up to 8 and zero after m) starting at element \p first. Eight flags at
  // a time: their byte mask, then eight table entries are written (up to eight slots past
  // the new count are scratch) and count advances by the mask's population.
  template <class Index>
  static std::size_t compact(const std::uint8_t* __restrict sent, std::size_t m, std::size_t first,
                             Index* __restrict idx, std::size_t count) noexcept {
    for (std::size_t k = 0; k < m; k += 8) {
      std::uint64_t x;
      std::memcpy(&x, sent + k, 8);
      const auto mask = static_cast<unsigned>((x * 0x0102040810204080ull) >> 56);  // byte j -> bit j
      const std::uint8_t* at = detail::byte_bit_positions.at[mask];
      for (std::size_t j = 0; j < 8; ++j) idx[count + j] = static_cast<Index>(first + k + at[j]);
      count += detail::byte_bit_positions.count[mask];
    }
    return count;
  }

  // The six steps on one layer (see the class comment). Spans of whole bins, about
  // quant_chunk elements long (one bin when bins are longer), are read from memory once and
  // scanned again in cache: (1) R += g over the span, (2) each bin's max |R| by an integer
  // max on the magnitude bits (the bit order of non-negative floats is their value order),
  // (3) vectorized flags against a per-element copy of the bin's max, then a branch-free
  // compaction. (5) runs over the sent indices once the scale (4) is known.
  void write_layer(byte_writer& w, std::uint32_t index, std::span<const float> g, std::span<float> r, std::uint32_t bin,
                   layer_stats& ls, bool& non_finite) {
    const std::size_t n = g.size();
    const bool wide = index_width_for(n) == 8;
    std::size_t count = 0;
    double gsq = 0, rsq = 0;
    gmax_sum_.clear();
    constexpr float inf = std::numeric_limits<float>::infinity();
    const std::size_t bins = (n + bin - 1) / bin;
    const std::size_t span = bin >= detail::quant_chunk ? bin : detail::quant_chunk / bin * bin;
    alignas(64) float thr[detail::quant_chunk];
    alignas(64) std::uint8_t flag[detail::quant_chunk];
    // The norms in the one order the device sums them in too (core/detail/square_sum.hpp),
    // each leaf as soon as (1) wrote it, from cache.
    detail::square_sum_pair_stream norms(g.data(), r.data(), n);
    for (std::size_t lo = 0; lo < n; lo += span) {
      const std::size_t hi = std::min(n, lo + span);
      for (std::size_t i = lo; i < hi; ++i) r[i] += g[i];  // (1); its norms come from the stream below
      norms.add_to(hi);
      const std::size_t nbins = (hi - lo + bin - 1) / bin;  // at most quant_chunk, or 1
      for (std::size_t b = 0; b < nbins; ++b) {             // (2)
        const float* rb = r.data() + lo + b * bin;
        const std::size_t len = std::min<std::size_t>(bin, hi - lo - b * bin);
        std::uint32_t mx = 0, bad = 0;
        for (std::size_t i = 0; i < len; ++i) {
          const std::uint32_t a = detail::float_bits(rb[i]) & 0x7fffffffu;
          const std::uint32_t finite = a < 0x7f800000u ? a : 0u;  // infinity and NaN do not count
          bad |= a >= 0x7f800000u;
          mx = mx > finite ? mx : finite;
        }
        non_finite = non_finite || bad != 0;
        gmax_[b] = detail::bits_float(mx);
        gmax_sum_.add(mx);
      }
      for (std::size_t c = lo; c < hi; c += detail::quant_chunk) {  // (3)
        const std::size_t mc = std::min(detail::quant_chunk, hi - c);
        for (std::size_t at = c; at < c + mc;) {
          const std::size_t b = (at - lo) / bin;
          const std::size_t end = std::min(c + mc, lo + (b + 1) * bin);
          std::fill(thr + (at - c), thr + (end - c), gmax_[b]);
          at = end;
        }
        const float* rc = r.data() + c;
        const float* gc = g.data() + c;
        for (std::size_t k = 0; k < mc; ++k)
          // Integer '&' of the three tests (not '&&'), so the loop stays branch-free.
          flag[k] =
              static_cast<std::uint8_t>(static_cast<int>(rc[k] != 0.0f) & static_cast<int>(std::fabs(rc[k]) < inf) &
                                        static_cast<int>(std::fabs(rc[k] + gc[k]) >= thr[k]));
        std::fill(flag + mc, flag + ((mc + 7) & ~std::size_t{7}), std::uint8_t{0});
        count = wide ? compact(flag, mc, c, indices64_.data(), count) : compact(flag, mc, c, indices32_.data(), count);
      }
    }
    norms.finish(gsq, rsq);                                                                 // before (5) changes R
    const float scale = static_cast<float>(gmax_sum_.value() / static_cast<double>(bins));  // (4)
    const std::uint32_t scale_bits = detail::float_bits(scale);
    // (5), which also records the signs sent (R_i of a sent element is not zero, so its sign
    // is that of its bits). R_i - (-scale) is R_i + scale exactly.
    auto update = [&](const auto* idx) {
      for (std::size_t j = 0; j < count; ++j) {
        const float x = r[idx[j]];
        const std::uint32_t neg = detail::float_bits(x) >> 31;
        negative_[j] = static_cast<std::uint8_t>(neg);
        r[idx[j]] = x - detail::bits_float(scale_bits ^ (neg << 31));
      }
    };
    if (wide)
      update(indices64_.data());
    else
      update(indices32_.data());
    segment_header sh;
    sh.layer = index;
    sh.index_width = wide ? 8 : 4;
    sh.numel = n;
    sh.count = count;
    write_segment(w, sh, [&](byte_writer& bw) {
      std::byte* head = bw.reserve(8);
      std::memcpy(head, &scale, 4);
      std::memcpy(head + 4, &bin, 4);
      std::byte* dst = bw.reserve(count * sh.index_width);
      if (wide)
        std::memcpy(dst, indices64_.data(), count * 8);
      else
        std::memcpy(dst, indices32_.data(), count * 4);
      std::fill(negative_.begin() + static_cast<std::ptrdiff_t>(count),
                negative_.begin() + static_cast<std::ptrdiff_t>(count + 8), std::uint8_t{0});
      detail::pack_code_bytes<1>(negative_.data(), count, bw.reserve(detail::code_bytes(count, 1)));
    });
    ls = {count, gsq, rsq, static_cast<double>(count) * scale * scale};
  }

  layout layout_;
  options options_;
  step_settings settings_;  // set_step_settings
  layered_scratch scratch_;
  std::vector<std::uint32_t> indices32_;  // sent indices of layers with 32-bit indices (+ 8 scratch)
  std::vector<std::uint64_t> indices64_;  // sent indices of larger layers (usually empty; + 8 scratch)
  std::vector<std::uint8_t> negative_;    // sign of each sent element, one per byte (+ 8 padding)
  std::vector<float> gmax_;               // max |R| of each bin of a span
  detail::exponent_sum gmax_sum_;         // the sum of a layer's bin maxima (step 4)
};
static_assert(Compressor<adacomp>);

}  // namespace gravac
