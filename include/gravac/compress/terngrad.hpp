#pragma once
//! \file terngrad.hpp
//! \brief TernGrad (Wen et al. 2017) with error feedback: scale * {-1, 0, 1}, drawn so that
//! the expectation is u; 2 bits per element plus one float scale per bucket.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include "gravac/compress/detail/layered.hpp"
#include "gravac/compress/detail/leveled_codec.hpp"
#include "gravac/concepts.hpp"
#include "gravac/detail/random.hpp"

namespace gravac {

//! Options of TernGrad.
struct terngrad_options {
  //! Elements per bucket sharing one scale (max |u| of the bucket): a multiple of 64, or 0
  //! for one scale per layer as in the paper. Buckets lower the variance and let the
  //! compressor read each element once while it is in cache.
  std::uint32_t bucket = 512;
};

//! TernGrad with error feedback. Models Compressor.
//!
//! With s_b = max |u| over the bucket, element i sends s_b * sign(u_i) with probability
//! |u_i| / s_b and 0 otherwise, so E[sent_i] = u_i. Codes: 00 zero, 01 +1, 11 -1 (10 is
//! rejected). Random draws as for qsgd (detail::element_bits of the stream from seed, step
//! and layer id; the same on every rank). e = u - decompress(packet).
class terngrad {
 public:
  //! Opt-in tag for the Compressor concept.
  using compressor_tag = void;
  //! Works on host memory.
  using memory_space = host_space;
  //! Options (see terngrad_options).
  using options = terngrad_options;
  //! Each rank has its own scales, so codes cannot be summed elementwise.
  static constexpr bool summable_by_index = false;
  //! Packet kind written.
  static constexpr packet_kind kind = packet_kind::quantized;

  //! A compressor for \p lay; rejects a bucket that is not a multiple of 64.
  terngrad(const layout& lay, const options& opt = {})
      : layout_(lay), options_(opt), codec_(quant_encoding::terngrad, 1, opt.bucket) {
    require(opt.bucket % 64 == 0, "terngrad: bucket must be a multiple of 64 (or 0 for whole layers), got " +
                                      std::to_string(opt.bucket));
  }

  //! Upper bound of the packet size.
  [[nodiscard]] std::size_t max_packet_bytes() const noexcept {
    std::size_t n = sizeof(packet_header);
    for (const auto& l : layout_.layers()) n += std::max(codec_.segment_bytes(l.numel), raw_segment_bytes(l.numel));
    return n;
  }

  //! Ternarizes every layer whose kept fraction is below 1; layers at 1 or more go raw.
  std::size_t compress(host_view g, host_view e, const step_params& p, std::span<std::byte> out,
                       compress_stats& st) {
    return detail::compress_layers(layout_, kind, g.span(), e.span(), p, out, st, scratch_,
                                   [&](byte_writer& w, std::uint32_t index, std::span<const float> gl,
                                       std::span<float> el, double, layer_stats& ls) {
                                     codec_.write(w, index, gl, el, detail::mix_seed(p.seed, p.step, layout_[index].id),
                                                  ls);
                                   });
  }

  //! Validates an untrusted packet.
  [[nodiscard]] validation validate(std::span<const std::byte> packet) const {
    return detail::validate_layers(packet, layout_, kind,
                                   [&](const segment_header& sh, std::span<const std::byte> pl) { return codec_.check(sh, pl); });
  }
  //! Adds scale * decompress(packet) to \p out.
  void decompress_add(std::span<const std::byte> packet, host_view out, float scale) const {
    detail::decompress_layers(packet, layout_, out.span(), scale,
                              [&](const segment_header& sh, std::span<const std::byte> pl, std::span<float> o, float s) {
                                codec_.add(sh, pl, o, s);
                              });
  }

 private:
  layout layout_;
  options options_;
  detail::leveled_codec<detail::level_scale::max_abs> codec_;
  detail::layered_scratch scratch_;
};
static_assert(Compressor<terngrad>);

}  // namespace gravac
