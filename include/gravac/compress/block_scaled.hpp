#pragma once
//! \file block_scaled.hpp
//! \brief The block-scaled low-precision compressors with error feedback: mxfp8 and mxfp4
//! (OCP Microscaling Formats (MX) v1.0: FP8 E4M3 or E5M2, or FP4 E2M1 elements with one
//! E8M0 power-of-two scale per 32) and nvfp4 (NVIDIA's NVFP4: E2M1 elements with one E4M3
//! scale per 16 and one float scale per layer). docs/algorithms.md, "Block-scaled formats",
//! states what they compute and where gravac departs from the specifications.

#include <cstddef>
#include <cstdint>
#include <span>

#include "gravac/compress/detail/block_scaled_codec.hpp"
#include "gravac/compress/layered.hpp"
#include "gravac/concepts/composition.hpp"
#include "gravac/concepts/concepts.hpp"
#include "gravac/core/detail/random.hpp"
#include "gravac/packet/packet_bound.hpp"
#include "gravac/packet/quantized_packet.hpp"

namespace gravac {

//! How the block-scaled compressors round an element to its format.
enum class block_rounding : std::uint8_t {
  //! To the nearest code, ties to the even one (the specifications' conversion).
  nearest_even,
  //! Up or down with probability given by the distance (unbiased below the format's
  //! largest value, which saturates). Element i of a layer draws detail::element_bits(
  //! stream, i) with stream = mix_seed(seed, step, layer id): counter-based, the same on
  //! every rank and for every run with the same seed, no generator state.
  stochastic,
};

//! The element format of mxfp8.
enum class mxfp8_element : std::uint8_t {
  e4m3,  //!< FP8 E4M3: 3 mantissa bits, largest 448 (the default)
  e5m2,  //!< FP8 E5M2: 2 mantissa bits, largest 57344
};

//! Options of mxfp8.
struct mxfp8_options {
  mxfp8_element element = mxfp8_element::e4m3;             //!< the element format
  block_rounding rounding = block_rounding::nearest_even;  //!< how elements are rounded
  //! Keep e = u - decompress(packet) (error feedback); false leaves the residual at zero,
  //! so that what error feedback brings can be measured.
  bool error_feedback = true;
};

//! Options of mxfp4.
struct mxfp4_options {
  block_rounding rounding = block_rounding::nearest_even;  //!< how elements are rounded
  bool error_feedback = true;                              //!< as mxfp8_options::error_feedback
};

//! Options of nvfp4.
struct nvfp4_options {
  block_rounding rounding = block_rounding::nearest_even;  //!< how elements are rounded (block scales: nearest even)
  bool error_feedback = true;                              //!< as mxfp8_options::error_feedback
};

namespace detail {

//! The Compressor body mxfp8, mxfp4 and nvfp4 share: a block_codec per layer inside the
//! layered skeleton (layers at kept fraction 1 go raw; the fraction's value is not used
//! otherwise, the format sets the size). The public classes add their options.
class block_scaled_compressor {
  // Calls fn(block_codec<F>{}) for the format chosen at construction (defined first: the
  // members below deduce their return types from it).
  template <class Fn>
  decltype(auto) with_codec(Fn&& fn) const {
    switch (format_) {
      case block_format::mxfp8_e5m2:
        return fn(block_codec<block_format::mxfp8_e5m2>{});
      case block_format::mxfp4:
        return fn(block_codec<block_format::mxfp4>{});
      case block_format::nvfp4:
        return fn(block_codec<block_format::nvfp4>{});
      default:
        return fn(block_codec<block_format::mxfp8_e4m3>{});
    }
  }

 public:
  //! Opt-in tag for the Compressor concept.
  using compressor_tag = void;
  //! What it acts on (composition.hpp): nothing but "kept fraction 1 = raw"; every value is sent in the format.
  static constexpr decision acts_on = decision::none;
  //! Works on host memory.
  using memory_space = host_space;
  //! Each rank has its own scales, so codes cannot be summed elementwise.
  static constexpr bool summable_by_index = false;
  //! Packet kind written.
  static constexpr packet_kind kind = packet_kind::quantized;

  //! Upper bound of the packet size.
  [[nodiscard]] std::size_t max_packet_bytes() const noexcept {
    return packet_bytes_bound(layout_, [&](std::size_t, const layer& l) { return segment_bytes(l.numel); });
  }

  //! Bytes of the coded segment (its header included) of a layer of \p numel elements.
  [[nodiscard]] std::size_t segment_bytes(std::size_t numel) const noexcept {
    return with_codec([&](auto codec) { return decltype(codec)::segment_bytes(numel); });
  }

  //! Codes u = g + e layer by layer; e = u - decompress(packet), or 0 without error feedback.
  std::size_t compress(host_view g, host_view e, const step_params& p, std::span<std::byte> out, compress_stats& st) {
    return with_codec([&](auto codec) {
      return compress_layers(layout_, kind, g.span(), e.span(), p, out, st, scratch_,
                             [&](byte_writer& w, std::uint32_t index, std::span<const float> gl, std::span<float> el,
                                 double, layer_stats& ls) {
                               decltype(codec)::write(w, index, gl, el, stochastic_, feedback_,
                                                      mix_seed(p.seed, p.step, layout_[index].id), ls);
                             });
    });
  }

  //! Validates an untrusted packet (block_codec::check for every coded segment).
  [[nodiscard]] validation validate(std::span<const std::byte> packet) const {
    return with_codec([&](auto codec) {
      return validate_layers(packet, layout_, kind, [](const segment_header& sh, std::span<const std::byte> pl) {
        return decltype(codec)::check(sh, pl);
      });
    });
  }

  //! Adds scale * decompress(packet) to \p out.
  void decompress_add(std::span<const std::byte> packet, host_view out, float scale) const {
    with_codec([&](auto codec) {
      decompress_layers(packet, layout_, out.span(), scale,
                        [](const segment_header& sh, std::span<const std::byte> pl, std::span<float> o, float s) {
                          decltype(codec)::add(sh, pl, o, s);
                        });
    });
  }

 protected:
  //! A compressor for \p lay in \p format.
  block_scaled_compressor(const layout& lay, block_format format, block_rounding rounding, bool feedback)
      : layout_(lay), format_(format), stochastic_(rounding == block_rounding::stochastic), feedback_(feedback) {
    require(rounding == block_rounding::nearest_even || rounding == block_rounding::stochastic,
            "block-scaled compressor: unknown rounding");
  }

 private:
  layout layout_;
  block_format format_;
  bool stochastic_;
  bool feedback_;
  layered_scratch scratch_;
};

}  // namespace detail

//! MXFP8 (OCP MX v1.0) with error feedback. Models Compressor.
//!
//! Per block of 32 elements of u: the scale X = 2^(floor(log2 max |u|) - emax_elem) as an
//! E8M0 code (emax_elem 8 for E4M3, 15 for E5M2), and each element u / X as FP8, rounded
//! (mxfp8_options::rounding) and saturated. 8 bits per element plus 8 per block of 32: 8.25
//! bits, about 3.9 times fewer than fp32. e = u - decompress(packet): exactly, with rounding
//! to nearest even (the decoded value is exact and u - d has no rounding error).
class mxfp8 : public detail::block_scaled_compressor {
 public:
  //! Options (see mxfp8_options).
  using options = mxfp8_options;

  //! A compressor for \p lay; rejects an unknown element format or rounding.
  mxfp8(const layout& lay, const options& opt = {})
      : block_scaled_compressor(lay, format_of(opt.element), opt.rounding, opt.error_feedback), options_(opt) {}

  //! The options it was built with.
  [[nodiscard]] const options& get_options() const noexcept { return options_; }

 private:
  static detail::block_format format_of(mxfp8_element e) {
    require(e == mxfp8_element::e4m3 || e == mxfp8_element::e5m2, "mxfp8: unknown element format");
    return e == mxfp8_element::e4m3 ? detail::block_format::mxfp8_e4m3 : detail::block_format::mxfp8_e5m2;
  }
  options options_;
};
static_assert(Compressor<mxfp8>);

//! MXFP4 (OCP MX v1.0) with error feedback. Models Compressor.
//!
//! Per block of 32 elements of u: X = 2^(floor(log2 max |u|) - 2) as E8M0, and each element
//! u / X as FP4 E2M1 (0, 0.5, 1, 1.5, 2, 3, 4, 6 and negatives), rounded and saturated. 4
//! bits per element plus 8 per block: 4.25 bits, about 7.5 times fewer than fp32. The
//! residual is exact with rounding to nearest even, as mxfp8's.
class mxfp4 : public detail::block_scaled_compressor {
 public:
  //! Options (see mxfp4_options).
  using options = mxfp4_options;

  //! A compressor for \p lay; rejects an unknown rounding.
  mxfp4(const layout& lay, const options& opt = {})
      : block_scaled_compressor(lay, detail::block_format::mxfp4, opt.rounding, opt.error_feedback), options_(opt) {}

  //! The options it was built with.
  [[nodiscard]] const options& get_options() const noexcept { return options_; }

 private:
  options options_;
};
static_assert(Compressor<mxfp4>);

//! NVFP4 with error feedback. Models Compressor.
//!
//! Per layer a float scale t = max |u| / (6 * 448); per block of 16 elements an E4M3 scale
//! s = E4M3(max |u_block| / (6 t)), and each element u / (s t) as FP4 E2M1, rounded and
//! saturated. 4 bits per element plus 8 per block of 16 plus 32 per layer: 4.5 bits, about
//! 7.1 times fewer than fp32. Finer blocks and a scale with a mantissa fit the elements
//! closer than MXFP4's powers of two. e = u - decompress(packet) exactly with rounding to
//! nearest even wherever the decoded values are normal floats.
class nvfp4 : public detail::block_scaled_compressor {
 public:
  //! Options (see nvfp4_options).
  using options = nvfp4_options;

  //! A compressor for \p lay; rejects an unknown rounding.
  nvfp4(const layout& lay, const options& opt = {})
      : block_scaled_compressor(lay, detail::block_format::nvfp4, opt.rounding, opt.error_feedback), options_(opt) {}

  //! The options it was built with.
  [[nodiscard]] const options& get_options() const noexcept { return options_; }

 private:
  options options_;
};
static_assert(Compressor<nvfp4>);

}  // namespace gravac
