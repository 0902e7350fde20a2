#pragma once
//! \file cast16.hpp
//! \brief cast16: every element as a 16-bit float (fp16 or bf16) of u / N, with error
//! feedback. Halves the bytes; no randomness, no indices.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>

#include "gravac/compress/cast16_format.hpp"
#include "gravac/compress/detail/cast16_limits.hpp"
#include "gravac/compress/detail/half.hpp"
#include "gravac/compress/detail/quantize_kernels.hpp"
#include "gravac/compress/layered.hpp"
#include "gravac/concepts/composition.hpp"
#include "gravac/concepts/concepts.hpp"
#include "gravac/core/detail/square_sum.hpp"
#include "gravac/packet/detail/quantized_segment_check.hpp"
#include "gravac/packet/packet_bound.hpp"
#include "gravac/packet/quantized_packet.hpp"

namespace gravac {

//! Options of cast16.
struct cast16_options {
  cast16_format format = cast16_format::fp16;  //!< the 16-bit format on the wire
};

//! Casts u / N to 16 bits. Models Compressor.
//!
//! Why divide by N (step_params::ranks) before the cast: a half-precision sum of N
//! gradients near the fp16 maximum overflows, but a sum of N values of u_r / N cannot
//! exceed the largest |u_r|. The segment carries the multiplier N, and decompress returns
//! N * half(u / N), an approximation of u itself; the collectives then apply their usual
//! 1/N (allgather scales each decoded packet, dense_allreduce the sum). So the result is
//! the rank average, as for every compressor, and no stage overflows: the division happens
//! in float before the cast, and decoding multiplies back in float. A collective that sums
//! the 16-bit codes themselves (a half-precision allreduce) would use the codes' sum as the
//! average directly and skip its 1/N. Values with |u / N| above the format's largest
//! finite value are clamped to it (never infinity); the residual keeps the excess. For
//! bf16 the clamp is lowered so that N times the clamped value stays finite
//! (detail::cast16_limit_bits), so finite u near the float maximum decodes finite.
//! e = u - decompress(packet).
class cast16 {
 public:
  //! Opt-in tag for the Compressor concept.
  using compressor_tag = void;
  //! What it acts on (composition.hpp): nothing but "kept fraction 1 = raw"; it sends every value in 16 bits.
  static constexpr decision acts_on = decision::none;
  //! Works on host memory.
  using memory_space = host_space;
  //! Options (see cast16_options).
  using options = cast16_options;
  //! Every element is sent, but in 16 bits: the codes are not float values to sum.
  static constexpr bool summable_by_index = false;
  //! Packet kind written.
  static constexpr packet_kind kind = packet_kind::quantized;

  //! A compressor for \p lay.
  cast16(const layout& lay, const options& opt = {}) : layout_(lay), options_(opt) {
    require(opt.format == cast16_format::fp16 || opt.format == cast16_format::bf16, "cast16: unknown format");
  }

  //! The options it was built with.
  [[nodiscard]] const options& get_options() const noexcept { return options_; }

  //! Upper bound of the packet size.
  [[nodiscard]] std::size_t max_packet_bytes() const noexcept {
    return packet_bytes_bound(
        layout_, [](std::size_t, const layer& l) { return sizeof(segment_header) + half_payload_bytes(l.numel); });
  }

  //! Casts every layer whose kept fraction is below 1; layers at 1 or more go raw.
  std::size_t compress(host_view g, host_view e, const step_params& p, std::span<std::byte> out, compress_stats& st) {
    const float ranks = static_cast<float>(std::max(1, p.ranks));
    return compress_layers(layout_, kind, g.span(), e.span(), p, out, st, scratch_,
                           [&](byte_writer& w, std::uint32_t index, std::span<const float> gl, std::span<float> el,
                               double, layer_stats& ls) {
                             if (options_.format == cast16_format::fp16)
                               write_layer<cast16_format::fp16>(w, index, gl, el, ranks, ls);
                             else
                               write_layer<cast16_format::bf16>(w, index, gl, el, ranks, ls);
                           });
  }

  //! Validates an untrusted packet: size, a finite positive multiplier, no infinite or NaN code.
  [[nodiscard]] validation validate(std::span<const std::byte> packet) const {
    return validate_layers(packet, layout_, kind, [](const segment_header& sh, std::span<const std::byte> pl) {
      const auto enc =
          sh.encoding == static_cast<std::uint8_t>(quant_encoding::bf16) ? quant_encoding::bf16 : quant_encoding::fp16;
      if (validation v = detail::check_quantized_segment(sh, pl, enc, half_payload_bytes(sh.numel)); !v) return v;
      const float mult = load_at<float>(pl, 0);
      if (!(std::isfinite(mult) && mult > 0) || load_at<std::uint32_t>(pl, 1) != 0)
        return validation::fail("cast16 segment: bad multiplier");
      const auto codes = pl.subspan(quant_prefix_bytes);
      const std::uint16_t special = enc == quant_encoding::fp16 ? 0x7c00u : 0x7f80u;
      bool bad = false;
      for (std::size_t i = 0; i < sh.numel; ++i) bad |= (load_at<std::uint16_t>(codes, i) & special) == special;
      for (std::size_t i = sh.numel * 2; i < codes.size(); ++i) bad |= codes[i] != std::byte{0};
      if (bad) return validation::fail("cast16 segment: infinite or NaN value, or padding set");
      return validation{};
    });
  }

  //! Adds scale * decompress(packet) to \p out.
  void decompress_add(std::span<const std::byte> packet, host_view out, float scale) const {
    decompress_layers(packet, layout_, out.span(), scale,
                      [](const segment_header& sh, std::span<const std::byte> pl, std::span<float> o, float s) {
                        const float mult = load_at<float>(pl, 0);
                        const auto codes = pl.subspan(quant_prefix_bytes);
                        if (sh.encoding == static_cast<std::uint8_t>(quant_encoding::fp16)) {
                          for (std::size_t i = 0; i < sh.numel; ++i)
                            o[i] += s * (detail::fp16_to_float(load_at<std::uint16_t>(codes, i)) * mult);
                        } else {
                          for (std::size_t i = 0; i < sh.numel; ++i)
                            o[i] += s * (detail::bf16_to_float(load_at<std::uint16_t>(codes, i)) * mult);
                        }
                      });
  }

 private:
  //! Codes of \p m elements of u (in \p u, replaced by the residual u - decoded): |u / N|
  //! clamped to the format's largest finite value by an integer min on its bits (the bit
  //! order of non-negative floats is their value order), converted, decoded back. Integer
  //! selects only, so the loop vectorizes. The decoded values into \p decoded.
  //! \p u is element \p first of a layer of \p n elements whose g, e and codes are \p g_layer,
  //! \p e_layer and \p codes_layer: being compute bound, the loop asks for the lines ahead
  //! (stream_prefetch).
  template <cast16_format F>
  GRAVAC_KERNEL_INLINE static void cast_block(float* __restrict u, std::size_t m, float inv, float ranks,
                                              std::uint16_t* __restrict h, float* __restrict decoded,
                                              const float* g_layer, const float* e_layer, std::size_t n,
                                              std::size_t first, const std::byte* codes_layer) noexcept {
    const std::uint32_t limit_bits = detail::cast16_limit_bits(F, ranks);
    for (std::size_t at = 0; at < m; at += detail::random_group) {
      detail::stream_prefetch(g_layer, e_layer, n, first + at, codes_layer, 16);
      const std::size_t end = std::min(at + detail::random_group, m);
      for (std::size_t k = at; k < end; ++k) cast_one<F>(u, h, decoded, k, inv, ranks, limit_bits);
    }
  }

  //! Element \p k of cast_block: its code into \p h, the residual into \p u, the decoded value into \p decoded.
  template <cast16_format F>
  GRAVAC_KERNEL_INLINE static void cast_one(float* __restrict u, std::uint16_t* __restrict h, float* __restrict decoded,
                                            std::size_t k, float inv, float ranks, std::uint32_t limit_bits) noexcept {
    const float x = u[k];
    const std::uint32_t q = detail::float_bits(x * inv);
    std::uint32_t a = q & 0x7fffffffu;
    a = a < limit_bits ? a : limit_bits;
    const std::uint32_t sign = (q >> 16) & 0x8000u;
    std::uint32_t code;
    float v;
    if constexpr (F == cast16_format::fp16) {
      code = detail::fp16_of_magnitude(a) | sign;
      v = detail::fp16_to_float(static_cast<std::uint16_t>(code)) * ranks;
    } else {
      code = ((a + 0x7fffu + ((a >> 16) & 1u)) >> 16) | sign;  // float_to_bf16 of the clamped value
      v = detail::bf16_to_float(static_cast<std::uint16_t>(code)) * ranks;
    }
    h[k] = static_cast<std::uint16_t>(code);
    u[k] = x - v;
    decoded[k] = v;
  }

  template <cast16_format F>
  static void write_layer(byte_writer& w, std::uint32_t index, std::span<const float> g, std::span<float> e,
                          float ranks, layer_stats& ls) {
    const std::size_t n = g.size();
    segment_header sh;
    sh.layer = index;
    sh.encoding = static_cast<std::uint8_t>(F == cast16_format::fp16 ? quant_encoding::fp16 : quant_encoding::bf16);
    sh.numel = n;
    sh.count = n;
    const float inv = 1.0f / ranks;
    write_segment(w, sh, [&](byte_writer& bw) {
      const float prefix[2] = {ranks, 0.0f};
      bw.put(prefix);
      std::byte* codes = bw.reserve(n * 2);
      // The norms and the kept energy in the device's order too (core/detail/square_sum.hpp).
      detail::square_sum_stream grad_sq, input_sq, kept_sq;
      alignas(64) std::uint16_t h[detail::quant_chunk];
      alignas(64) float decoded[detail::quant_chunk];
      detail::with_best_isa([&]() GRAVAC_KERNEL_LAMBDA {
        for (std::size_t c = 0; c < n; c += detail::quant_chunk) {
          const std::size_t mc = std::min(detail::quant_chunk, n - c);
          float* u = e.data() + c;
          for (std::size_t k = 0; k < mc; ++k) u[k] += g.data()[c + k];  // u = g + e, in cache now
          grad_sq.add(g.data() + c, mc);
          input_sq.add(u, mc);
          cast_block<F>(u, mc, inv, ranks, h, decoded, g.data(), e.data(), n, c, codes);
          kept_sq.add(decoded, mc);
          std::memcpy(codes + 2 * c, h, 2 * mc);
        }
      });
      ls = {n, grad_sq.finish(), input_sq.finish(), kept_sq.finish()};
    });
  }

  layout layout_;
  options options_;
  layered_scratch scratch_;
};
static_assert(Compressor<cast16>);

}  // namespace gravac
