#pragma once
//! \file fp8_rowwise_codec.hpp
//! \brief One layer's segment of fp8_rowwise: FP8 E4M3 codes with one float scale per row
//! (the scheme of torchft's fp8 allreduce): the writer, with error feedback as an option,
//! the validation of an untrusted segment and the decoder.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>

#include "gravac/compress/detail/block_scaled_codec.hpp"
#include "gravac/compress/detail/float_bits.hpp"
#include "gravac/compress/detail/minifloat.hpp"
#include "gravac/compress/detail/quantize_kernels.hpp"
#include "gravac/core/step.hpp"
#include "gravac/packet/detail/bit_codes.hpp"
#include "gravac/packet/detail/quantized_segment_check.hpp"
#include "gravac/packet/quantized_packet.hpp"

namespace gravac::detail {

//! The largest E4M3 value: a row's largest |u| is coded to it.
inline constexpr float e4m3_max = 448.0f;

//! True when row scale \p s is one a decoder can use: finite, not negative, and with the
//! largest element times it (448 * s) finite.
inline bool rowwise_scale_ok(float s) noexcept { return valid_scale(s) && std::isfinite(e4m3_max * s); }

//! A row's scale for its largest finite |u| \p amax: amax / 448, lowered one ulp at a time
//! while 448 times it would round past the float maximum (amax within an ulp or two of it).
inline float rowwise_scale(float amax) noexcept {
  float s = amax / e4m3_max;
  while (!rowwise_scale_ok(s)) s = std::nextafter(s, 0.0f);
  return s;
}

//! Writes, checks and decodes fp8_rowwise segments of rows of \p row elements (the last
//! row of a layer may be shorter).
//!
//! Per row of u = g + e: s = max |u| / 448 as a float (rowwise_scale), and each element's
//! E4M3 code of |u| / s (a float division, rounded) rounded to nearest even and saturated;
//! it decodes to d = value(code) * s. A row whose s is 0 sends zeros. With error feedback
//! e = u - d, else e = 0. NaN elements are sent as +0 and infinities saturate; a row's scale
//! comes from its largest finite |u|, so nothing non-finite reaches the wire.
struct rowwise_codec {
  //! Payload bytes of a segment of \p numel elements.
  static constexpr std::size_t payload_bytes(std::size_t numel, std::size_t row) noexcept {
    return rowwise_payload_bytes(numel, row);
  }

  //! Writes layer \p index; e becomes u - decompress(segment) when \p feedback, else 0.
  static void write(byte_writer& w, std::uint32_t index, std::span<const float> g, std::span<float> e, std::size_t row,
                    bool feedback, layer_stats& ls) {
    const std::size_t n = g.size(), nr = bucket_count(n, row);
    segment_header sh;
    sh.layer = index;
    sh.encoding = static_cast<std::uint8_t>(quant_encoding::fp8_rowwise);
    sh.numel = n;
    sh.count = n;
    double gsq = 0, usq = 0, ksq = 0;
    write_segment(w, sh, [&](byte_writer& bw) {
      std::byte* prefix = bw.reserve(quant_prefix_bytes);
      std::byte* scales = bw.reserve(nr * sizeof(float));  // reserve() zeroes the padding
      auto* codes = reinterpret_cast<std::uint8_t*>(bw.reserve(n));
      const std::uint32_t prefix_words[2] = {static_cast<std::uint32_t>(row), 0u};
      std::memcpy(prefix, prefix_words, sizeof prefix_words);
      for (std::size_t r = 0; r < nr; ++r) {
        const std::size_t lo = r * row, m = std::min(row, n - lo);
        float* u = e.data() + lo;
        const auto sums = accumulate_block(g.data() + lo, u, m);
        gsq += sums.g_sq;
        usq += sums.u_sq;
        const float s = rowwise_scale(bits_float(finite_max_bits(u, m)));
        std::memcpy(scales + r * sizeof(float), &s, sizeof s);
        ksq += code_row(u, m, s, feedback, codes + lo);
      }
    });
    ls = {n, gsq, usq, ksq};
  }

  //! Validates a segment from a peer before any of it is decoded: encoding, no indices,
  //! count, payload size, the row length (that of the receiving compressor), every scale
  //! usable (rowwise_scale_ok), every code finite (no NaN) and zero padding.
  static validation check(const segment_header& sh, std::span<const std::byte> payload, std::size_t row) {
    if (validation v = check_quantized_segment(sh, payload, quant_encoding::fp8_rowwise, payload_bytes(sh.numel, row));
        !v)
      return v;
    if (load_at<std::uint32_t>(payload, 0) != row) return validation::fail("fp8_rowwise segment: wrong row length");
    if (load_at<std::uint32_t>(payload, 1) != 0) return validation::fail("fp8_rowwise segment: prefix word set");
    const std::size_t n = sh.numel, nr = bucket_count(n, row);
    bool bad = false;
    for (std::size_t r = 0; r < nr; ++r) {
      float s;
      std::memcpy(&s, payload.data() + quant_prefix_bytes + r * sizeof(float), sizeof s);
      bad |= !rowwise_scale_ok(s);
    }
    if (bad) return validation::fail("fp8_rowwise segment: row scale not finite, negative or too large");
    const std::size_t code_at = quant_prefix_bytes + pad8(nr * sizeof(float));
    if (!code_padding_zero(payload.data() + quant_prefix_bytes, code_at - quant_prefix_bytes, nr * 32))
      return validation::fail("fp8_rowwise segment: scale padding set");
    const auto* codes = reinterpret_cast<const std::uint8_t*>(payload.data() + code_at);
    for (std::size_t i = 0; i < n; ++i) bad |= minifloat_is_nan(minifloat::e4m3, codes[i]);
    if (bad) return validation::fail("fp8_rowwise segment: NaN element");
    if (!code_padding_zero(payload.data() + code_at, payload.size() - code_at, n * 8))
      return validation::fail("fp8_rowwise segment: padding bits set");
    return {};
  }

  //! Adds scale * decompress(segment) to \p out (the layer's slice); validated segments only.
  static void add(const segment_header& sh, std::span<const std::byte> payload, std::span<float> out, float scale,
                  std::size_t row) {
    const std::size_t n = sh.numel, nr = bucket_count(n, row);
    const auto* codes =
        reinterpret_cast<const std::uint8_t*>(payload.data() + quant_prefix_bytes + pad8(nr * sizeof(float)));
    for (std::size_t r = 0; r < nr; ++r) {
      float s;
      std::memcpy(&s, payload.data() + quant_prefix_bytes + r * sizeof(float), sizeof s);
      const std::size_t lo = r * row, m = std::min(row, n - lo);
      float* o = out.data() + lo;
      for (std::size_t k = 0; k < m; ++k) o[k] += scale * codec::decoded(codes[lo + k], s);
    }
  }

 private:
  // The element arithmetic is MXFP8 E4M3's (the same codes and decoded products).
  using codec = block_codec<block_format::mxfp8_e4m3>;

  // Codes the row u[0..m) (replaced by the residual, or zero) at scale s; returns the sum of
  // the decoded squares.
  static double code_row(float* __restrict u, std::size_t m, float s, bool feedback,
                         std::uint8_t* __restrict code) noexcept {
    constexpr std::uint32_t sign_bit = sign_bit_of(minifloat::e4m3);
    double sq = 0;
    for (std::size_t i = 0; i < m; ++i) {
      const float v = u[i];
      const std::uint32_t b = float_bits(v);
      std::uint32_t a = b & 0x7fffffffu;
      const bool nan = a > 0x7f800000u;
      a = nan ? 0u : a;
      const std::uint32_t y = s > 0.0f ? float_bits(bits_float(a) / s) : 0u;
      const std::uint32_t c =
          encode_magnitude<minifloat::e4m3, false>(y, 0, 0u) | ((b >> 31) != 0 && !nan ? sign_bit : 0u);
      code[i] = static_cast<std::uint8_t>(c);
      const float d = codec::decoded(c, s);
      u[i] = feedback ? v - d : 0.0f;
      sq += static_cast<double>(d) * d;
    }
    return sq;
  }
};

}  // namespace gravac::detail
