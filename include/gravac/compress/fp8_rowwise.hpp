#pragma once
//! \file fp8_rowwise.hpp
//! \brief fp8_rowwise: FP8 E4M3 with one float scale per row, the scheme of torchft's fp8
//! allreduce (no error feedback there; an option here). The peer the block-scaled formats
//! are compared with; docs/algorithms.md, "Block-scaled formats", says where it departs.

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include "gravac/compress/detail/fp8_rowwise_codec.hpp"
#include "gravac/compress/layered.hpp"
#include "gravac/concepts/composition.hpp"
#include "gravac/concepts/concepts.hpp"
#include "gravac/core/error.hpp"
#include "gravac/packet/packet_bound.hpp"
#include "gravac/packet/quantized_packet.hpp"

namespace gravac {

//! Options of fp8_rowwise.
struct fp8_rowwise_options {
  //! Elements per float scale. torchft scales each row of a tensor; gravac's layers reach
  //! the compressed allreduce as flat shards, so a row here is a run of this many elements
  //! (256: the width of a typical hidden layer's row). At least 1.
  std::uint32_t row = 256;
  //! Keep e = u - decompress(packet). Off by default: the peer it reproduces has none.
  bool error_feedback = false;
};

//! FP8 E4M3 with a float scale per row of fp8_rowwise_options::row elements. Models
//! Compressor.
//!
//! Per row of u = g + e: s = max |u| / 448, each element the E4M3 code of u / s rounded to
//! nearest even (detail::rowwise_codec). 8 bits per element plus 32 per row: 8.125 bits at
//! rows of 256, about 3.9 times fewer than fp32, as mxfp8. Without error feedback the coding
//! error is lost every step, as in torchft.
class fp8_rowwise {
 public:
  //! Opt-in tag for the Compressor concept.
  using compressor_tag = void;
  //! Options (see fp8_rowwise_options).
  using options = fp8_rowwise_options;
  //! What it acts on (composition.hpp): nothing but "kept fraction 1 = raw".
  static constexpr decision acts_on = decision::none;
  //! Works on host memory.
  using memory_space = host_space;
  //! Each rank has its own scales, so codes cannot be summed elementwise.
  static constexpr bool summable_by_index = false;
  //! Packet kind written.
  static constexpr packet_kind kind = packet_kind::quantized;

  //! A compressor for \p lay; rejects a row of 0 elements.
  fp8_rowwise(const layout& lay, const options& opt = {}) : layout_(lay), options_(opt) {
    require(opt.row >= 1, "fp8_rowwise: row must be at least 1 element");
  }

  //! The options it was built with.
  [[nodiscard]] const options& get_options() const noexcept { return options_; }

  //! Upper bound of the packet size.
  [[nodiscard]] std::size_t max_packet_bytes() const noexcept {
    return packet_bytes_bound(layout_, [&](std::size_t, const layer& l) { return segment_bytes(l.numel); });
  }

  //! Bytes of the coded segment (its header included) of a layer of \p numel elements.
  [[nodiscard]] std::size_t segment_bytes(std::size_t numel) const noexcept {
    return sizeof(segment_header) + detail::rowwise_codec::payload_bytes(numel, options_.row);
  }

  //! Codes u = g + e layer by layer; e = u - decompress(packet), or 0 without error feedback.
  std::size_t compress(host_view g, host_view e, const step_params& p, std::span<std::byte> out, compress_stats& st) {
    return compress_layers(layout_, kind, g.span(), e.span(), p, out, st, scratch_,
                           [&](byte_writer& w, std::uint32_t index, std::span<const float> gl, std::span<float> el,
                               double, layer_stats& ls) {
                             detail::rowwise_codec::write(w, index, gl, el, options_.row, options_.error_feedback, ls);
                           });
  }

  //! Validates an untrusted packet (detail::rowwise_codec::check for every coded segment).
  [[nodiscard]] validation validate(std::span<const std::byte> packet) const {
    return validate_layers(packet, layout_, kind, [&](const segment_header& sh, std::span<const std::byte> pl) {
      return detail::rowwise_codec::check(sh, pl, options_.row);
    });
  }

  //! Adds scale * decompress(packet) to \p out.
  void decompress_add(std::span<const std::byte> packet, host_view out, float scale) const {
    decompress_layers(packet, layout_, out.span(), scale,
                      [&](const segment_header& sh, std::span<const std::byte> pl, std::span<float> o, float s) {
                        detail::rowwise_codec::add(sh, pl, o, s, options_.row);
                      });
  }

 private:
  layout layout_;
  options options_;
  layered_scratch scratch_;
};
static_assert(Compressor<fp8_rowwise>);

}  // namespace gravac
