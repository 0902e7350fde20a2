#pragma once
//! \file leveled_codec.hpp
//! \brief The stochastic level quantizer behind QSGD and TernGrad: per bucket a scale
//! (the L2 norm for QSGD, max |u| for TernGrad), and per element a sign and a level
//! l in 0..s drawn so that E[l] = s * |u| / scale (unbiased stochastic rounding).

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <span>
#include <type_traits>

#include "gravac/compress/detail/quantize_kernels.hpp"
#include "gravac/core/detail/square_sum.hpp"
#include "gravac/core/step.hpp"
#include "gravac/packet/detail/quantized_segment_check.hpp"
#include "gravac/packet/quantized_packet.hpp"

namespace gravac::detail {

//! Which statistic of a bucket becomes its scale.
enum class level_scale : std::uint8_t {
  l2_norm,  //!< ||u_bucket||_2 (QSGD)
  max_abs,  //!< max |u_bucket| (TernGrad)
};

//! Encodes and decodes leveled segments (the format: docs/algorithms.md, "The quantized segment").
//!
//! Element i of a layer draws uniform24(element_bits(stream, i)) (quantize_kernels.hpp),
//! where the caller derives stream from (seed, step, layer id). The uniform has 24 bits, so
//! each level is unbiased up to 2^-24 of one level step.
template <level_scale Scale>
class leveled_codec {
 public:
  //! A codec writing \p enc segments with \p levels levels and buckets of \p bucket (0: whole layer).
  leveled_codec(quant_encoding enc, std::uint32_t levels, std::uint32_t bucket) noexcept
      : enc_(enc), levels_(levels), bucket_(bucket) {}

  //! Bytes of a segment for a layer of \p numel elements.
  [[nodiscard]] std::size_t segment_bytes(std::size_t numel) const noexcept {
    return sizeof(segment_header) + leveled_payload_bytes(numel, levels_, bucket_);
  }

  //! Writes layer \p index: u = g + e is quantized, e becomes u - decompress(segment).
  void write(byte_writer& w, std::uint32_t index, std::span<const float> g, std::span<float> e, std::uint64_t stream,
             layer_stats& ls) const {
    switch (code_width(levels_)) {
      case 2:
        return write_w<2>(w, index, g, e, stream, ls);
      case 4:
        return write_w<4>(w, index, g, e, stream, ls);
      case 8:
        return write_w<8>(w, index, g, e, stream, ls);
      default:
        return write_w<16>(w, index, g, e, stream, ls);
    }
  }

  //! Validates a segment payload from a peer: encoding, level count, bucket, sizes,
  //! finite non-negative scales, every code's level in range, zero padding.
  [[nodiscard]] validation check(const segment_header& sh, std::span<const std::byte> payload) const {
    if (sh.encoding != static_cast<std::uint8_t>(enc_))
      return validation::fail("quantized segment: unexpected encoding " + std::to_string(sh.encoding));
    if (payload.size() < quant_prefix_bytes) return validation::fail("quantized segment: payload truncated");
    const auto levels = load_at<std::uint32_t>(payload, 0);
    const auto bucket = load_at<std::uint32_t>(payload, 1);
    if (levels == 0 || levels > qsgd_max_levels) return validation::fail("quantized segment: level count out of range");
    if (Scale == level_scale::max_abs && levels != 1)
      return validation::fail("ternary segment with more than one level");
    if (bucket % 64 != 0) return validation::fail("quantized segment: bucket not a multiple of 64");
    if (validation v = check_quantized_segment(sh, payload, enc_, leveled_payload_bytes(sh.numel, levels, bucket)); !v)
      return v;
    const std::size_t nb = bucket_count(sh.numel, bucket);
    for (std::size_t b = 0; b < nb; ++b)
      if (!valid_scale(load_at<float>(payload.subspan(quant_prefix_bytes), b)))
        return validation::fail("quantized segment: scale not finite or negative");
    const std::size_t code_at = quant_prefix_bytes + pad8(nb * sizeof(float));
    const unsigned width = code_width(levels);
    const std::byte* codes = payload.data() + code_at;
    if (!code_padding_zero(codes, payload.size() - code_at, sh.numel * width))
      return validation::fail("quantized segment: padding bits set");
    switch (width) {
      case 2:
        return check_codes<2>(codes, sh.numel, levels);
      case 4:
        return check_codes<4>(codes, sh.numel, levels);
      case 8:
        return check_codes<8>(codes, sh.numel, levels);
      default:
        return check_codes<16>(codes, sh.numel, levels);
    }
  }

  //! Adds scale * decompress(segment) to \p out (the layer's slice); validated segments only.
  void add(const segment_header& sh, std::span<const std::byte> payload, std::span<float> out, float scale) const {
    const auto levels = load_at<std::uint32_t>(payload, 0);
    switch (code_width(levels)) {
      case 2:
        return add_w<2>(sh, payload, out, scale);
      case 4:
        return add_w<4>(sh, payload, out, scale);
      case 8:
        return add_w<8>(sh, payload, out, scale);
      default:
        return add_w<16>(sh, payload, out, scale);
    }
  }

  //! The value one level step is worth in a bucket of scale \p s: what encoder and decoder
  //! both multiply levels by, so that they agree bit for bit.
  static float step_value(float s, std::uint32_t levels) noexcept { return s / static_cast<float>(levels); }

 private:
  //! One code per element before packing: a byte up to 8 bits, else 16 bits.
  template <unsigned W>
  using code_type = std::conditional_t<(W <= 8), std::uint8_t, std::uint16_t>;

  //! One element: level l = floor(a) + (r < a - floor(a)) with a = |x| * inv, capped at
  //! \p lv; its code; x replaced by the residual x - sign * f * l. Integer selects and bit
  //! operations only (no float ternaries, which GCC leaves as branches under the default
  //! -ftrapping-math), so the loops around it vectorize. Returns the decoded magnitude f * l.
  template <unsigned W>
  GRAVAC_KERNEL_INLINE static float quantize_one(float* __restrict u, code_type<W>* __restrict code, std::size_t k,
                                                 std::uint32_t bits, float inv, float f, std::int32_t lv) noexcept {
    const float x = u[k];
    const std::uint32_t xb = float_bits(x);
    const float a = bits_float(xb & 0x7fffffffu) * inv;  // 0 <= a <= lv (rounding aside)
    const auto fl = static_cast<std::int32_t>(a);        // a >= 0: truncation is floor
    std::int32_t l = fl + static_cast<std::int32_t>(uniform24(bits) < a - static_cast<float>(fl));
    l = l < lv ? l : lv;
    // The level the code holds: l itself for finite x; for a NaN or infinite x (l is then
    // INT_MIN or INT_MIN + 1) its low bits, so that e = u - decompress(packet) always.
    const std::int32_t held = l & static_cast<std::int32_t>((1u << (W - 1)) - 1u);
    const float v = f * static_cast<float>(held);
    const std::uint32_t neg = (xb >> 31) & static_cast<std::uint32_t>(l != 0);  // a sign only on a level
    code[k] = static_cast<code_type<W>>(static_cast<std::uint32_t>(l) | (neg << (W - 1)));
    u[k] = x - bits_float(float_bits(v) | (neg << 31));
    return v;
  }

  //! Levels, codes and residual of \p m elements of u (in \p u, replaced by the residual),
  //! element \p first of the layer stream first (a multiple of random_group); the decoded
  //! magnitudes into \p decoded (their squares are the kept energy). The draws are computed inline, 64 elements per
  //! group key, so the inner loop has a fixed trip count and no dependency between elements.
  //! \p g_layer, \p e_layer (\p n elements) and \p codes_layer are the whole layer's, for
  //! stream_prefetch.
  template <unsigned W>
  GRAVAC_KERNEL_INLINE static void quantize_levels(std::uint64_t stream, std::size_t first, float* __restrict u,
                                                   std::size_t m, float inv, float f, std::int32_t lv,
                                                   code_type<W>* __restrict code, float* __restrict decoded,
                                                   const float* g_layer, const float* e_layer, std::size_t n,
                                                   std::byte* codes_layer) noexcept {
    for (std::size_t at = 0; at < m; at += random_group) {
      stream_prefetch(g_layer, e_layer, n, first + at, codes_layer, W);
      const std::uint32_t key = random_group_key(stream, (first + at) / random_group);
      float* ua = u + at;
      code_type<W>* ca = code + at;
      float* va = decoded + at;
      if (m - at >= random_group) {
        for (std::uint32_t j = 0; j < random_group; ++j)
          va[j] = quantize_one<W>(ua, ca, j, fmix32(key + j * random_step), inv, f, lv);
      } else {
        const auto rest = static_cast<std::uint32_t>(m - at);
        for (std::uint32_t j = 0; j < rest; ++j)
          va[j] = quantize_one<W>(ua, ca, j, fmix32(key + j * random_step), inv, f, lv);
      }
    }
  }

  template <unsigned W>
  void write_w(byte_writer& w, std::uint32_t index, std::span<const float> g, std::span<float> e, std::uint64_t stream,
               layer_stats& ls) const {
    const std::size_t n = g.size();
    const std::size_t B = bucket_ ? bucket_ : n;
    const std::size_t nb = bucket_count(n, bucket_);
    segment_header sh;
    sh.layer = index;
    sh.encoding = static_cast<std::uint8_t>(enc_);
    sh.numel = n;
    sh.count = n;
    // The layer's norms and kept energy in the one order of core/detail/square_sum.hpp
    // (the device's too), fed as each bucket's u and each chunk's decoded values are final.
    square_sum_stream grad_sq, input_sq, kept_sq;
    write_segment(w, sh, [&](byte_writer& bw) {
      const std::uint32_t prefix[2] = {levels_, bucket_};
      bw.put(prefix);
      std::byte* scales = bw.reserve(nb * sizeof(float));
      std::byte* codes = bw.reserve(code_bytes(n, W));
      alignas(64) code_type<W> code[quant_chunk];
      alignas(64) float decoded[quant_chunk];
      const auto lv = static_cast<std::int32_t>(levels_);
      with_best_isa([&]() GRAVAC_KERNEL_LAMBDA {
        for (std::size_t b = 0; b < nb; ++b) {
          const std::size_t lo = b * B, m = std::min(B, n - lo);
          // Pass 1 over the bucket: u = g + e into e, and the bucket's scale.
          double bucket_sq = 0;
          float bucket_max = 0;
          for (std::size_t c = 0; c < m; c += quant_chunk) {
            const auto s = accumulate_block(g.data() + lo + c, e.data() + lo + c, std::min(quant_chunk, m - c));
            bucket_sq += s.u_sq;
            bucket_max = std::max(bucket_max, s.u_max);
          }
          grad_sq.add(g.data() + lo, m);
          input_sq.add(e.data() + lo, m);
          // The norm of finite values can pass the float maximum: capped (max_level_scale), so
          // the scale and every decoded level stay finite; the residual keeps the rest.
          const float scale = std::min(
              Scale == level_scale::l2_norm ? static_cast<float>(std::sqrt(bucket_sq)) : bucket_max, max_level_scale);
          std::memcpy(scales + b * sizeof(float), &scale, sizeof(float));
          const float f = step_value(scale, levels_);
          // levels / scale, kept finite: a subnormal scale would make it infinite, and 0 * inf
          // a NaN level. Capped, a tiny bucket is merely under-sent (the residual keeps the rest).
          const float inv =
              scale > 0 ? std::min(static_cast<float>(levels_) / scale, std::numeric_limits<float>::max()) : 0.0f;
          // Pass 2 (the bucket is in cache when it is small): draws, levels, codes, residual.
          // Being compute bound, it asks for the lines of the buckets ahead as it goes
          // (stream_prefetch), so that memory streams them meanwhile.
          for (std::size_t c = 0; c < m; c += quant_chunk) {
            const std::size_t mc = std::min(quant_chunk, m - c);
            quantize_levels<W>(stream, lo + c, e.data() + lo + c, mc, inv, f, lv, code, decoded, g.data(), e.data(), n,
                               codes);
            kept_sq.add(decoded, mc);
            std::byte* dst = codes + (lo + c) * W / 8;
            if constexpr (W >= 8) {
              std::memcpy(dst, code, mc * sizeof(code[0]));
            } else {
              std::fill(code + mc, code + ((mc + 7) & ~std::size_t{7}), code_type<W>{0});
              pack_code_bytes<W>(code, mc, dst);
            }
          }
        }
      });
    });
    ls = {n, grad_sq.finish(), input_sq.finish(), kept_sq.finish()};
  }

  template <unsigned W>
  static validation check_codes(const std::byte* codes, std::size_t n, std::uint32_t levels) {
    if constexpr (W == 2) {
      // 2-bit codes: the only invalid one is 10 (a sign on level 0). One word holds 32 codes.
      const std::size_t bytes = code_bytes(n, 2);
      for (std::size_t at = 0; at < bytes; at += 8) {
        std::uint64_t word = 0;
        std::memcpy(&word, codes + at, std::min<std::size_t>(8, bytes - at));
        if ((word >> 1) & ~word & 0x5555555555555555ull) return validation::fail("quantized segment: invalid code");
      }
      (void)levels;
      return {};
    } else {
      constexpr std::uint16_t sign_bit = static_cast<std::uint16_t>(1u << (W - 1));
      std::uint16_t code[quant_chunk];
      for (std::size_t c = 0; c < n; c += quant_chunk) {
        const std::size_t mc = std::min(quant_chunk, n - c);
        unpack_codes<W>(codes + c * W / 8, mc, code);
        bool bad = false;
        for (std::size_t k = 0; k < mc; ++k) {
          const unsigned l = code[k] & (sign_bit - 1u);
          bad |= l > levels || code[k] == sign_bit;
        }
        if (bad) return validation::fail("quantized segment: level out of range");
      }
      return {};
    }
  }

  // out[k] += scale * (±f * level): the sign applied as a bit flip (scale * -v is exactly
  // -(scale * v)), not a float ternary, so the loop vectorizes.
  template <unsigned W>
  static void add_codes(const code_type<W>* __restrict code, std::size_t m, float f, float scale,
                        float* __restrict out) noexcept {
    constexpr std::uint32_t level_mask = (1u << (W - 1)) - 1u;
    for (std::size_t k = 0; k < m; ++k) {
      const std::uint32_t c = code[k];
      const float v = f * static_cast<float>(static_cast<std::int32_t>(c & level_mask));
      out[k] += bits_float(float_bits(scale * v) ^ ((c >> (W - 1)) << 31));
    }
  }

  template <unsigned W>
  static void add_w(const segment_header& sh, std::span<const std::byte> payload, std::span<float> out, float scale) {
    const auto levels = load_at<std::uint32_t>(payload, 0);
    const auto bucket = load_at<std::uint32_t>(payload, 1);
    const std::size_t n = sh.numel;
    const std::size_t B = bucket ? bucket : n;
    const std::size_t nb = bucket_count(n, bucket);
    const auto scales = payload.subspan(quant_prefix_bytes);
    const std::byte* codes = payload.data() + quant_prefix_bytes + pad8(nb * sizeof(float));
    alignas(64) code_type<W> code[quant_chunk];
    for (std::size_t b = 0; b < nb; ++b) {
      const std::size_t lo = b * B, m = std::min(B, n - lo);
      const float f = step_value(load_at<float>(scales, b), levels);
      for (std::size_t c = 0; c < m; c += quant_chunk) {
        const std::size_t mc = std::min(quant_chunk, m - c);
        const std::byte* src = codes + (lo + c) * W / 8;
        if constexpr (W >= 8)
          std::memcpy(code, src, mc * sizeof(code[0]));
        else
          unpack_code_bytes<W>(src, mc, code);
        add_codes<W>(code, mc, f, scale, out.data() + lo + c);
      }
    }
  }

  quant_encoding enc_;
  std::uint32_t levels_;
  std::uint32_t bucket_;
};

}  // namespace gravac::detail
