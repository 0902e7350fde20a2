#pragma once
//! \file leveled_compressor.hpp
//! \brief The Compressor body QSGD and TernGrad share: a leveled_codec per layer inside
//! the layered skeleton. The public classes add only their options and their checks.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>

#include "gravac/compress/detail/leveled_codec.hpp"
#include "gravac/compress/layered.hpp"
#include "gravac/concepts/composition.hpp"
#include "gravac/concepts/concepts.hpp"
#include "gravac/core/detail/random.hpp"
#include "gravac/packet/packet_bound.hpp"

namespace gravac::detail {

//! Quantizes every layer whose kept fraction is below 1 with a leveled_codec (the fraction's
//! value is not used: the levels set the size); layers at 1 or more go raw. Element draws
//! come from mix_seed(seed, step, layer id): the same on every rank.
template <level_scale Scale>
class leveled_compressor {
 public:
  //! Opt-in tag for the Compressor concept.
  using compressor_tag = void;
  //! What it acts on (composition.hpp): nothing but "kept fraction 1 = raw"; a quantizer sends every value at its level
  //! count.
  static constexpr decision acts_on = decision::none;
  //! Works on host memory.
  using memory_space = host_space;
  //! Each rank has its own scales, so codes cannot be summed elementwise.
  static constexpr bool summable_by_index = false;
  //! Packet kind written.
  static constexpr packet_kind kind = packet_kind::quantized;

  //! Upper bound of the packet size.
  [[nodiscard]] std::size_t max_packet_bytes() const noexcept {
    return packet_bytes_bound(layout_, [&](std::size_t, const layer& l) { return codec_.segment_bytes(l.numel); });
  }

  //! Quantizes u = g + e layer by layer; e = u - decompress(packet).
  std::size_t compress(host_view g, host_view e, const step_params& p, std::span<std::byte> out, compress_stats& st) {
    return compress_layers(
        layout_, kind, g.span(), e.span(), p, out, st, scratch_,
        [&](byte_writer& w, std::uint32_t index, std::span<const float> gl, std::span<float> el, double,
            layer_stats& ls) { codec_.write(w, index, gl, el, mix_seed(p.seed, p.step, layout_[index].id), ls); });
  }

  //! Validates an untrusted packet.
  [[nodiscard]] validation validate(std::span<const std::byte> packet) const {
    return validate_layers(packet, layout_, kind, [&](const segment_header& sh, std::span<const std::byte> pl) {
      return codec_.check(sh, pl);
    });
  }
  //! Adds scale * decompress(packet) to \p out.
  void decompress_add(std::span<const std::byte> packet, host_view out, float scale) const {
    decompress_layers(packet, layout_, out.span(), scale,
                      [&](const segment_header& sh, std::span<const std::byte> pl, std::span<float> o, float s) {
                        codec_.add(sh, pl, o, s);
                      });
  }

 protected:
  //! A compressor for \p lay coding with \p encoding, \p levels and \p bucket.
  leveled_compressor(const layout& lay, quant_encoding encoding, std::uint32_t levels, std::uint32_t bucket)
      : layout_(lay), codec_(encoding, levels, bucket) {}

 private:
  layout layout_;
  leveled_codec<Scale> codec_;
  layered_scratch scratch_;
};

}  // namespace gravac::detail
