#pragma once
//! \file block_scaled_codec.hpp
//! \brief One layer's segment of the block-scaled compressors (MXFP8, MXFP4, NVFP4): the
//! writer with error feedback, the validation of an untrusted segment and the decoder. The
//! segment's layout is quantized_packet.hpp's; the element and scale codecs minifloat.hpp's.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>

#include "gravac/compress/detail/float_bits.hpp"
#include "gravac/compress/detail/minifloat.hpp"
#include "gravac/compress/detail/quantize_kernels.hpp"
#include "gravac/core/detail/square_sum.hpp"
#include "gravac/core/step.hpp"
#include "gravac/packet/detail/quantized_segment_check.hpp"
#include "gravac/packet/quantized_packet.hpp"

namespace gravac::detail {

//! The block-scaled formats.
enum class block_format : std::uint8_t {
  mxfp8_e4m3,  //!< MXFP8 with E4M3 elements
  mxfp8_e5m2,  //!< MXFP8 with E5M2 elements
  mxfp4,       //!< MXFP4 (E2M1 elements)
  nvfp4,       //!< NVFP4 (E2M1 elements, E4M3 scales, a float scale per layer)
};

//! The shape of a block-scaled format's segment.
struct block_shape {
  minifloat element;        //!< the element format
  std::size_t block;        //!< elements per scale
  unsigned code_bits;       //!< bits per element code (8 or 4)
  quant_encoding encoding;  //!< segment_header::encoding
  bool e8m0_scales;         //!< power-of-two E8M0 scales (MX); else E4M3 scales and a float per layer (NVFP4)
};

//! The shape of format \p f.
constexpr block_shape shape_of(block_format f) noexcept {
  switch (f) {
    case block_format::mxfp8_e4m3:
      return {minifloat::e4m3, mx_block, 8, quant_encoding::mxfp8_e4m3, true};
    case block_format::mxfp8_e5m2:
      return {minifloat::e5m2, mx_block, 8, quant_encoding::mxfp8_e5m2, true};
    case block_format::mxfp4:
      return {minifloat::e2m1, mx_block, 4, quant_encoding::mxfp4, true};
    case block_format::nvfp4:
      return {minifloat::e2m1, nvfp4_block, 4, quant_encoding::nvfp4, false};
  }
  return {};
}

//! NVFP4's per-layer scale t maps the layer's largest |u| to the largest element (6) at the
//! largest E4M3 block scale (448): t = max |u| / (6 * 448).
inline constexpr float nvfp4_scale_range = 6.0f * 448.0f;

//! True when NVFP4 per-layer scale \p t is one a decoder can use: finite, not negative, and
//! with 6 * (448 * t), the largest value a block can decode to (in the decoder's order of
//! operations), finite.
inline bool nvfp4_tensor_scale_ok(float t) noexcept { return valid_scale(t) && std::isfinite(6.0f * (448.0f * t)); }

//! NVFP4's per-layer scale for a layer whose largest finite |u| is \p amax: amax / 2688,
//! lowered one float ulp at a time while the largest decodable value would be infinite
//! (only for amax within a few ulps of the float maximum).
inline float nvfp4_tensor_scale(float amax) noexcept {
  float t = amax / nvfp4_scale_range;
  while (!nvfp4_tensor_scale_ok(t)) t = std::nextafter(t, 0.0f);
  return t;
}

//! The largest E8M0 code an MX segment of element format \p e may carry: 2^(127 - emax_elem).
//! A finite float's floor(log2) is at most 127, so the writer never exceeds it, and with it
//! the largest element times the scale stays a finite float.
constexpr std::uint32_t mx_max_scale_code(minifloat e) noexcept {
  return e8m0_code(e8m0_max_exponent - spec_of(e).emax);
}

//! Bits of the largest finite |x| of \p m floats (NaN and infinities left out; 0 when none).
//! Integer maxima on the bits (the order of non-negative floats), so the loop vectorizes.
GRAVAC_KERNEL_INLINE std::uint32_t finite_max_bits(const float* x, std::size_t m) noexcept {
  std::uint32_t best = 0;
  for (std::size_t i = 0; i < m; ++i) {
    const std::uint32_t a = float_bits(x[i]) & 0x7fffffffu;
    const std::uint32_t f = a < 0x7f800000u ? a : 0u;
    best = best > f ? best : f;
  }
  return best;
}

//! The random bits of elements [first, first + m) of a layer stream: element_bits(stream,
//! first + k) into \p r. \p first must be a multiple of random_group.
GRAVAC_KERNEL_INLINE void fill_element_bits(std::uint64_t stream, std::size_t first, std::size_t m,
                                            std::uint32_t* r) noexcept {
  for (std::size_t at = 0; at < m; at += random_group) {
    const std::uint32_t key = random_group_key(stream, (first + at) / random_group);
    const std::size_t end = std::min(m - at, random_group);
    for (std::size_t j = 0; j < end; ++j) r[at + j] = fmix32(key + static_cast<std::uint32_t>(j) * random_step);
  }
}

//! Writes, checks and decodes the segments of format \p F (docs/algorithms.md, "The quantized segment").
//!
//! What the writer computes, per block of B elements of u = g + e (the last block may be
//! shorter):
//! - MX: k = floor(log2 max |u|) - emax_elem clamped to [-127, 127] (mx_shared_exponent),
//!   the scale X = 2^k as E8M0, and each element's code of u * 2^-k (exact), rounded and
//!   saturated (encode_magnitude). It decodes to d = value(code) * X, exact in float.
//! - NVFP4: the layer's t = max |u| / 2688 (nvfp4_tensor_scale); the block's E4M3 scale
//!   s = E4M3(max_block |u| / (6 t)) rounded to nearest even and saturated; S = value(s) * t
//!   and each element's E2M1 code of |u| / S (both float operations, rounded), saturated. It
//!   decodes to d = value(code) * S. A block whose S is 0 sends zeros.
//! With error feedback e = u - d, else e = 0. NaN elements are sent as +0 and infinities
//! saturate (the residual then keeps the NaN or infinity; the trainer's non-finite check
//! screens u before any compressor runs), and a block's scale comes from its largest finite
//! |u|: nothing non-finite reaches the wire.
template <block_format F>
struct block_codec {
  //! The segment's shape.
  static constexpr block_shape shape = shape_of(F);
  //! The element format.
  static constexpr minifloat element = shape.element;
  //! Elements per scale.
  static constexpr std::size_t block = shape.block;

  //! Payload bytes of a segment of \p numel elements.
  static constexpr std::size_t payload_bytes(std::size_t numel) noexcept {
    return block_scaled_payload_bytes(numel, block, shape.code_bits);
  }
  //! Bytes of a segment (header included) of \p numel elements.
  static constexpr std::size_t segment_bytes(std::size_t numel) noexcept {
    return sizeof(segment_header) + payload_bytes(numel);
  }

  //! Writes layer \p index: u = g + e is coded, e becomes u - decompress(segment) when
  //! \p feedback, else 0. Rounds stochastically with the draws of \p stream when \p stochastic.
  static void write(byte_writer& w, std::uint32_t index, std::span<const float> g, std::span<float> e, bool stochastic,
                    bool feedback, std::uint64_t stream, layer_stats& ls) {
    if (stochastic)
      write_rounded<true>(w, index, g, e, feedback, stream, ls);
    else
      write_rounded<false>(w, index, g, e, feedback, stream, ls);
  }

  //! Validates a segment from a peer before any of it is decoded: encoding, no indices,
  //! count, payload size, the prefix (block size; NVFP4's per-layer scale usable), every
  //! scale (E8M0: not NaN and at most mx_max_scale_code; E4M3: sign clear, not NaN), every
  //! FP8 code finite (no NaN; no E5M2 infinity, which the writer never sends), zero padding.
  static validation check(const segment_header& sh, std::span<const std::byte> payload) {
    if (validation v = check_quantized_segment(sh, payload, shape.encoding, payload_bytes(sh.numel)); !v) return v;
    if (load_at<std::uint32_t>(payload, 0) != block) return validation::fail("block-scaled segment: wrong block size");
    if constexpr (shape.e8m0_scales) {
      if (load_at<std::uint32_t>(payload, 1) != 0) return validation::fail("block-scaled segment: prefix word set");
    } else {
      if (!nvfp4_tensor_scale_ok(load_at<float>(payload, 1)))
        return validation::fail("nvfp4 segment: per-layer scale not finite, negative or too large");
    }
    const std::size_t n = sh.numel, nb = bucket_count(n, block);
    const auto* scales = reinterpret_cast<const std::uint8_t*>(payload.data() + quant_prefix_bytes);
    bool bad = false;
    for (std::size_t b = 0; b < nb; ++b) {
      if constexpr (shape.e8m0_scales)
        bad |= scales[b] > mx_max_scale_code(element);  // 0xFF (NaN) included
      else
        bad |= scales[b] >= 0x7fu;  // a sign, or S.1111.111 (NaN)
    }
    if (bad) return validation::fail("block-scaled segment: NaN or out-of-range scale");
    const std::size_t code_at = quant_prefix_bytes + pad8(nb);
    if (!code_padding_zero(payload.data() + quant_prefix_bytes, code_at - quant_prefix_bytes, nb * 8))
      return validation::fail("block-scaled segment: scale padding set");
    const auto* codes = reinterpret_cast<const std::uint8_t*>(payload.data() + code_at);
    if constexpr (shape.code_bits == 8) {
      for (std::size_t i = 0; i < n; ++i)
        bad |= minifloat_is_nan(element, codes[i]) || minifloat_is_inf(element, codes[i]);
      if (bad) return validation::fail("block-scaled segment: NaN or infinite element");
    }
    if (!code_padding_zero(payload.data() + code_at, payload.size() - code_at, n * shape.code_bits))
      return validation::fail("block-scaled segment: padding bits set");
    return {};
  }

  //! Adds scale * decompress(segment) to \p out (the layer's slice); validated segments only.
  static void add(const segment_header& sh, std::span<const std::byte> payload, std::span<float> out, float scale) {
    const std::size_t n = sh.numel, nb = bucket_count(n, block);
    const auto* scales = reinterpret_cast<const std::uint8_t*>(payload.data() + quant_prefix_bytes);
    const std::byte* codes = payload.data() + quant_prefix_bytes + pad8(nb);
    const float t = shape.e8m0_scales ? 0.0f : load_at<float>(payload, 1);
    alignas(64) std::uint8_t code[quant_chunk];
    for (std::size_t c = 0; c < n; c += quant_chunk) {
      const std::size_t mc = std::min(quant_chunk, n - c);
      if constexpr (shape.code_bits == 8)
        std::memcpy(code, codes + c, mc);
      else
        unpack_code_bytes<4>(codes + c / 2, mc, code);
      for (std::size_t lo = 0; lo < mc; lo += block) {
        const float x = block_scale(scales[(c + lo) / block], t);
        const std::size_t m = std::min(block, mc - lo);
        float* o = out.data() + c + lo;
        for (std::size_t k = 0; k < m; ++k) o[k] += scale * decoded(code[lo + k], x);
      }
    }
  }

  //! The float a block's elements are multiplied by: 2^k for E8M0 code \p s (MX), or
  //! value(s) * t for E4M3 code \p s and per-layer scale \p t (NVFP4).
  GRAVAC_KERNEL_INLINE static float block_scale(std::uint32_t s, float t) noexcept {
    if constexpr (shape.e8m0_scales) {
      (void)t;
      return e8m0_value(s);
    } else {
      return decode_minifloat<minifloat::e4m3>(s) * t;
    }
  }

  //! The value element code \p c decodes to in a block of scale \p x: |value(c)| * x with the
  //! code's sign applied to the bits (so that no compiler contracts the product into a later
  //! addition: the writer's residual and the decoder see the same rounded product).
  GRAVAC_KERNEL_INLINE static float decoded(std::uint32_t c, float x) noexcept {
    constexpr std::uint32_t sign = sign_bit_of(element);
    const float mag = decode_minifloat<element>(c & (sign - 1u)) * x;
    return bits_float(float_bits(mag) | ((c & sign) != 0 ? 0x80000000u : 0u));
  }

 private:
  // Codes of the block u[0..m) (replaced by the residual) at scale x; the random bits of
  // its elements in r. MX codes |u| * 2^-k exactly; NVFP4 codes |u| / x. The decoded
  // values into dec (their squares are the kept energy).
  template <bool Stochastic>
  GRAVAC_KERNEL_INLINE static void code_block(float* __restrict u, std::size_t m, int k, float x, bool feedback,
                                              const std::uint32_t* __restrict r, std::uint8_t* __restrict code,
                                              float* __restrict dec) noexcept {
    if constexpr (!Stochastic) {
      code_block_nearest(u, m, k, x, feedback, code, dec);
    } else {
      constexpr std::uint32_t sign_bit = sign_bit_of(element);
      for (std::size_t i = 0; i < m; ++i) {
        const float v = u[i];
        const std::uint32_t b = float_bits(v);
        std::uint32_t a = b & 0x7fffffffu;
        const bool nan = a > 0x7f800000u;
        a = nan ? 0u : a;
        std::uint32_t mag;
        if constexpr (shape.e8m0_scales) {
          mag = encode_magnitude<element, Stochastic>(a, k, Stochastic ? r[i] : 0u);
        } else {
          (void)k;
          const std::uint32_t y = x > 0.0f ? float_bits(bits_float(a) / x) : 0u;
          mag = encode_magnitude<element, Stochastic>(y, 0, Stochastic ? r[i] : 0u);
        }
        const std::uint32_t c = mag | ((b >> 31) != 0 && !nan ? sign_bit : 0u);
        code[i] = static_cast<std::uint8_t>(c);
        const float d = decoded(c, x);
        u[i] = feedback ? v - d : 0.0f;
        dec[i] = d;
      }
    }
  }

  // code_block rounding to nearest even, the same codes, residual and sum, in float
  // operations the compiler vectorizes (no table, no per-element branch or variable shift):
  // y = |u| * 2^-k (MX; exact, but for values under 2^-126 that code to 0 either way) or
  // |u| / x (NVFP4, the division encode_magnitude's caller makes), capped at 2^(emax+2)
  // (an infinity saturates); y below 2^emin rounds to a multiple of the subnormal step
  // 2^(emin-mb) by adding and subtracting 2^(emin-mb+23) (the float addition rounds to
  // nearest even at that step), y above by rounding its float bits to mb mantissa bits
  // (add half a step less one, plus the kept lowest bit, then clear the dropped bits). The
  // rounded value, capped at the largest element, is the code's value exactly, so it
  // replaces the decoding table; the code is its exponent and mantissa fields rebased to
  // the format's bias, or for a subnormal value the count of subnormal steps. The decoded
  // values go to d, as code_block's.
  GRAVAC_KERNEL_INLINE static void code_block_nearest(float* __restrict u, std::size_t m, int k, float x, bool feedback,
                                                      std::uint8_t* __restrict code, float* __restrict d) noexcept {
    constexpr minifloat_spec sp = spec_of(element);
    constexpr int mb = static_cast<int>(sp.mantissa_bits);
    constexpr int emin = 1 - sp.bias;
    constexpr std::uint32_t sign_bit = sign_bit_of(element);
    constexpr std::uint32_t drop = 23u - sp.mantissa_bits;  // float mantissa bits below the format's
    const float cap = pow2_normal(sp.emax + 2);
    const float min_normal = pow2_normal(emin);
    const float sub_magic = pow2_normal(emin - mb + 23);
    const float sub_steps = pow2_normal(mb - emin);  // 1 / the subnormal step
    const float max_value = minifloat_value(element, sp.max_code);
    constexpr std::uint32_t rebase = static_cast<std::uint32_t>(127 + emin - 1) << sp.mantissa_bits;
    // MX: y = |u| * 2^-k; NVFP4: y = |u| / x, or 0 when x is 0 (a block that sends zeros).
    // Every operation runs for every element and the choices are integer minima and masks
    // on the bits (y and q are never negative or NaN, so their bits order as their values):
    // with a float operation feeding only one arm of a ?:, GCC moves it into a branch that
    // it may not undo (the operation could trap), and the loop no longer vectorizes.
    const float inv = shape.e8m0_scales ? pow2_normal(-k) : 0.0f;
    const std::uint32_t live = shape.e8m0_scales || x > 0.0f ? ~0u : 0u;
    const float div = live != 0 ? x : 1.0f;
    const std::uint32_t keep = feedback ? ~0u : 0u;
    const std::uint32_t cap_bits = float_bits(cap), min_normal_bits = float_bits(min_normal);
    const std::uint32_t max_bits = float_bits(max_value);
    for (std::size_t i = 0; i < m; ++i) {
      const float v = u[i];
      const std::uint32_t b = float_bits(v);
      const std::uint32_t a0 = b & 0x7fffffffu;
      const std::uint32_t nan = 0u - static_cast<std::uint32_t>(a0 > 0x7f800000u);  // all ones for a NaN
      const float av = bits_float(a0 & ~nan);
      std::uint32_t yb;
      if constexpr (shape.e8m0_scales)
        yb = float_bits(av * inv);
      else
        yb = float_bits(av / div) & live;
      yb = yb < cap_bits ? yb : cap_bits;
      const float y = bits_float(yb);
      const std::uint32_t sub_bits = float_bits((y + sub_magic) - sub_magic);
      const std::uint32_t nb = (yb + ((1u << (drop - 1)) - 1u) + ((yb >> drop) & 1u)) & ~((1u << drop) - 1u);
      const std::uint32_t small = 0u - static_cast<std::uint32_t>(yb < min_normal_bits);
      std::uint32_t qb = (sub_bits & small) | (nb & ~small);
      qb = qb < max_bits ? qb : max_bits;
      const float q = bits_float(qb);
      // Subnormal steps of min(q, 2^emin): at most 2^mb, so the conversion is always in range.
      const float qs = bits_float(qb < min_normal_bits ? qb : min_normal_bits);
      const auto steps = static_cast<std::uint32_t>(static_cast<std::int32_t>(qs * sub_steps));
      const std::uint32_t sub_code = 0u - static_cast<std::uint32_t>(qb < min_normal_bits);
      const std::uint32_t mag = (steps & sub_code) | (((qb >> drop) - rebase) & ~sub_code);
      const std::uint32_t neg = (0u - (b >> 31)) & ~nan;
      code[i] = static_cast<std::uint8_t>(mag | (neg & sign_bit));
      const float dv = bits_float(float_bits(q * x) | (neg & 0x80000000u));
      d[i] = dv;
      u[i] = bits_float(float_bits(v - dv) & keep);
    }
  }

  // The scale of a block whose largest finite |u| has bits amax; its code into *s.
  GRAVAC_KERNEL_INLINE static float choose_scale(std::uint32_t amax, float t, int& k, std::uint8_t* s) noexcept {
    if constexpr (shape.e8m0_scales) {
      k = mx_shared_exponent<element>(amax);
      *s = static_cast<std::uint8_t>(e8m0_code(k));
      return e8m0_value(*s);
    } else {
      k = 0;
      std::uint32_t sc = 0;
      if (t > 0.0f) sc = encode_magnitude<minifloat::e4m3, false>(float_bits(bits_float(amax) / (6.0f * t)), 0, 0);
      *s = static_cast<std::uint8_t>(sc);
      return block_scale(sc, t);
    }
  }

  template <bool Stochastic>
  static void write_rounded(byte_writer& w, std::uint32_t index, std::span<const float> g, std::span<float> e,
                            bool feedback, std::uint64_t stream, layer_stats& ls) {
    const std::size_t n = g.size(), nb = bucket_count(n, block);
    segment_header sh;
    sh.layer = index;
    sh.encoding = static_cast<std::uint8_t>(shape.encoding);
    sh.numel = n;
    sh.count = n;
    // The norms and the kept energy in the device's order too (core/detail/square_sum.hpp).
    square_sum_stream grad_sq, input_sq, kept_sq;
    write_segment(w, sh, [&](byte_writer& bw) {
      std::byte* prefix = bw.reserve(quant_prefix_bytes);
      auto* scales = reinterpret_cast<std::uint8_t*>(bw.reserve(nb));
      std::byte* codes = bw.reserve(code_bytes(n, shape.code_bits));
      float t = 0.0f;
      if constexpr (!shape.e8m0_scales) {
        // NVFP4's per-layer scale needs the whole layer's u first.
        std::uint32_t amax = 0;
        with_best_isa([&]() GRAVAC_KERNEL_LAMBDA {
          for (std::size_t c = 0; c < n; c += quant_chunk) {
            const std::size_t mc = std::min(quant_chunk, n - c);
            float* u = e.data() + c;
            for (std::size_t k = 0; k < mc; ++k) u[k] += g.data()[c + k];
            grad_sq.add(g.data() + c, mc);
            input_sq.add(u, mc);
            amax = std::max(amax, finite_max_bits(u, mc));
          }
        });
        t = nvfp4_tensor_scale(bits_float(amax));
      }
      const std::uint32_t prefix_words[2] = {static_cast<std::uint32_t>(block), float_bits(t)};
      std::memcpy(prefix, prefix_words, sizeof prefix_words);
      alignas(64) std::uint8_t code[quant_chunk];
      alignas(64) std::uint32_t r[Stochastic ? quant_chunk : 1];
      alignas(64) float decoded[quant_chunk];
      // Compiled for AVX2 where the processor has it (isa_dispatch.hpp; the same bits).
      with_best_isa([&]() GRAVAC_KERNEL_LAMBDA {
        for (std::size_t c = 0; c < n; c += quant_chunk) {
          const std::size_t mc = std::min(quant_chunk, n - c);
          float* u = e.data() + c;
          if constexpr (shape.e8m0_scales) {  // u = g + e, the chunk then in cache for its blocks
            for (std::size_t k = 0; k < mc; ++k) u[k] += g.data()[c + k];
            grad_sq.add(g.data() + c, mc);
            input_sq.add(u, mc);
          }
          if constexpr (Stochastic) fill_element_bits(stream, c, mc, r);
          for (std::size_t lo = 0; lo < mc; lo += block) {
            const std::size_t m = std::min(block, mc - lo);
            int k = 0;
            const float x = choose_scale(finite_max_bits(u + lo, m), t, k, scales + (c + lo) / block);
            code_block<Stochastic>(u + lo, m, k, x, feedback, r + (Stochastic ? lo : 0), code + lo, decoded + lo);
          }
          kept_sq.add(decoded, mc);
          if constexpr (shape.code_bits == 8) {
            std::memcpy(codes + c, code, mc);
          } else {
            std::fill(code + mc, code + ((mc + 7) & ~std::size_t{7}), std::uint8_t{0});
            pack_code_bytes<4>(code, mc, codes + c / 2);
          }
        }
      });
    });
    ls = {n, grad_sq.finish(), input_sq.finish(), kept_sq.finish()};
  }
};

}  // namespace gravac::detail
