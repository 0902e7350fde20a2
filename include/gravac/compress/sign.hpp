#pragma once
//! \file sign.hpp
//! \brief EF-signSGD (Karimireddy et al. 2019): one sign bit per element, packed 8 to a
//! byte, and one scale per layer, the mean |u|; error feedback carries the rest.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>

#include "gravac/compress/detail/quantize_kernels.hpp"
#include "gravac/compress/layered.hpp"
#include "gravac/concepts/composition.hpp"
#include "gravac/concepts/concepts.hpp"
#include "gravac/core/detail/square_sum.hpp"
#include "gravac/packet/detail/quantized_segment_check.hpp"
#include "gravac/packet/packet_bound.hpp"
#include "gravac/packet/quantized_packet.hpp"

namespace gravac {

//! sign has no options.
struct sign_options {};

//! EF-sign compression. Models Compressor.
//!
//! Sends scale * sign(u_i) with scale = ||u_l||_1 / numel (the mean |u| of the layer),
//! sign(0) = +1. Deterministic (no random draws). e = u - decompress(packet).
class sign {
 public:
  //! Opt-in tag for the Compressor concept.
  using compressor_tag = void;
  //! What it acts on (composition.hpp): nothing but "kept fraction 1 = raw"; it sends one sign per value.
  static constexpr decision acts_on = decision::none;
  //! Works on host memory.
  using memory_space = host_space;
  //! Options (see sign_options).
  using options = sign_options;
  //! Each rank has its own scale, so bits cannot be summed elementwise.
  static constexpr bool summable_by_index = false;
  //! Packet kind written.
  static constexpr packet_kind kind = packet_kind::quantized;

  //! A compressor for \p lay.
  sign(const layout& lay, const options& = {}) : layout_(lay) {}

  //! Upper bound of the packet size.
  [[nodiscard]] std::size_t max_packet_bytes() const noexcept {
    return packet_bytes_bound(
        layout_, [](std::size_t, const layer& l) { return sizeof(segment_header) + sign_payload_bytes(l.numel); });
  }

  //! Sends signs and the mean |u| of every layer whose kept fraction is below 1; layers
  //! at 1 or more go raw.
  std::size_t compress(host_view g, host_view e, const step_params& p, std::span<std::byte> out, compress_stats& st) {
    return compress_layers(layout_, kind, g.span(), e.span(), p, out, st, scratch_,
                           [](byte_writer& w, std::uint32_t index, std::span<const float> gl, std::span<float> el,
                              double, layer_stats& ls) { write_layer(w, index, gl, el, ls); });
  }

  //! Validates an untrusted packet: size, a finite non-negative scale, zero padding.
  [[nodiscard]] validation validate(std::span<const std::byte> packet) const {
    return validate_layers(packet, layout_, kind, [](const segment_header& sh, std::span<const std::byte> pl) {
      if (validation v = detail::check_quantized_segment(sh, pl, quant_encoding::sign, sign_payload_bytes(sh.numel));
          !v)
        return v;
      if (!detail::valid_scale(load_at<float>(pl, 0)) || load_at<std::uint32_t>(pl, 1) != 0)
        return validation::fail("sign segment: bad scale");
      if (!detail::code_padding_zero(pl.data() + quant_prefix_bytes, pl.size() - quant_prefix_bytes, sh.numel))
        return validation::fail("sign segment: padding bits set");
      return validation{};
    });
  }

  //! Adds scale * decompress(packet) to \p out.
  void decompress_add(std::span<const std::byte> packet, host_view out, float scale) const {
    decompress_layers(packet, layout_, out.span(), scale,
                      [](const segment_header& sh, std::span<const std::byte> pl, std::span<float> o, float s) {
                        decode_add(pl, sh.numel, o.data(), s);
                      });
  }

 private:
  // out[i] += s * (bit i ? -v : v): bits spread to bytes, then a sign flip (s * -v is
  // exactly -(s * v)), so the loop vectorizes.
  static void decode_add(std::span<const std::byte> pl, std::size_t n, float* __restrict out, float s) noexcept {
    const std::uint32_t sv = detail::float_bits(s * load_at<float>(pl, 0));
    const std::byte* bits = pl.data() + quant_prefix_bytes;
    alignas(64) std::uint8_t neg[detail::quant_chunk];
    for (std::size_t c = 0; c < n; c += detail::quant_chunk) {
      const std::size_t mc = std::min(detail::quant_chunk, n - c);
      detail::unpack_bits_to_bytes(bits + c / 8, mc, neg);
      float* o = out + c;
      for (std::size_t k = 0; k < mc; ++k) o[k] += detail::bits_float(sv ^ (static_cast<std::uint32_t>(neg[k]) << 31));
    }
  }

  static void write_layer(byte_writer& w, std::uint32_t index, std::span<const float> g, std::span<float> e,
                          layer_stats& ls) {
    const std::size_t n = g.size();
    segment_header sh;
    sh.layer = index;
    sh.encoding = static_cast<std::uint8_t>(quant_encoding::sign);
    sh.numel = n;
    sh.count = n;
    write_segment(w, sh, [&](byte_writer& bw) {
      std::byte* prefix = bw.reserve(quant_prefix_bytes);
      std::byte* bits = bw.reserve(detail::code_bytes(n, 1));
      alignas(64) std::uint8_t code[detail::quant_chunk];
      detail::square_sum_stream grad_sq, input_sq;  // in the device's order too (square_sum.hpp)
      double abs_sum = 0;
      float scale = 0;
      detail::with_best_isa([&]() GRAVAC_KERNEL_LAMBDA {
        // Pass 1: u = g + e into e, the signs, and sum |u|. The scale needs the whole layer,
        // so the residual is finished in a second pass.
        for (std::size_t c = 0; c < n; c += detail::quant_chunk) {
          const std::size_t mc = std::min(detail::quant_chunk, n - c);
          const auto s = detail::accumulate_block(g.data() + c, e.data() + c, mc);
          grad_sq.add(g.data() + c, mc);
          input_sq.add(e.data() + c, mc);
          abs_sum += s.u_abs;
          // Local restrict pointers: code is a byte array, which may alias anything, so
          // through the lambda's captures every store would reload them (a scalar loop).
          const float* __restrict u = e.data() + c;
          std::uint8_t* __restrict cb = code;
          for (std::size_t at = 0; at < mc; at += detail::random_group) {
            detail::stream_prefetch(g.data(), e.data(), n, c + at, bits, 1);  // memory streams meanwhile
            const std::size_t end = std::min(at + detail::random_group, mc);
            for (std::size_t k = at; k < end; ++k) cb[k] = static_cast<std::uint8_t>(u[k] < 0);
          }
          std::fill(code + mc, code + ((mc + 7) & ~std::size_t{7}), std::uint8_t{0});
          detail::pack_code_bytes<1>(code, mc, bits + c / 8);
        }
        scale = static_cast<float>(abs_sum / static_cast<double>(n));
        const std::uint32_t zero = 0;
        std::memcpy(prefix, &scale, sizeof scale);
        std::memcpy(prefix + 4, &zero, sizeof zero);
        for (std::size_t i = 0; i < n; ++i) {
          const float u = e[i];
          e[i] = u - (u < 0 ? -scale : scale);  // a select, not a branch: vectorizes
        }
      });
      ls = {n, grad_sq.finish(), input_sq.finish(), static_cast<double>(n) * scale * scale};
    });
  }

  layout layout_;
  layered_scratch scratch_;
};
static_assert(Compressor<sign>);

}  // namespace gravac
