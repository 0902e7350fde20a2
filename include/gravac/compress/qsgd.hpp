#pragma once
//! \file qsgd.hpp
//! \brief QSGD (Alistarh et al. 2017) with error feedback: per bucket the L2 norm, per
//! element a sign and a level in 0..s chosen by unbiased stochastic rounding.

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

//! Options of QSGD.
struct qsgd_options {
  //! Levels s of |u| / ||u_bucket|| (1..32767). Codes take code_width(s) bits: s = 1 gives
  //! 2 bits, 7 gives 4, 127 gives 8, more gives 16.
  std::uint32_t levels = 127;
  //! Elements per bucket sharing one norm: a multiple of 64, or 0 for one norm per layer.
  //! Small buckets bound the variance (QSGD's d in the variance bound becomes the bucket).
  std::uint32_t bucket = 512;
};

//! QSGD with error feedback. Models Compressor.
//!
//! Each element sends sign(u_i) and l_i, with l_i = floor(s |u_i| / n_b) plus one with
//! probability equal to the fractional part (n_b the norm of its bucket), so that
//! E[n_b / s * l_i * sign(u_i)] = u_i. The receiver decodes (n_b / s) * l_i with the sign.
//! Element i of a layer draws uniform24(detail::element_bits(stream, i)) with stream =
//! mix_seed(seed, step, layer id), a counter-based draw (no sequential generator): the
//! same on every rank (no rank in the seed), which keeps a step reproducible from the
//! shared parameters alone; each rank's rounding error stays in its own residual, so
//! correlated draws across ranks do not accumulate. e = u - decompress(packet).
class qsgd {
 public:
  //! Opt-in tag for the Compressor concept.
  using compressor_tag = void;
  //! Works on host memory.
  using memory_space = host_space;
  //! Options (see qsgd_options).
  using options = qsgd_options;
  //! Each rank has its own norms, so codes cannot be summed elementwise.
  static constexpr bool summable_by_index = false;
  //! Packet kind written.
  static constexpr packet_kind kind = packet_kind::quantized;

  //! A compressor for \p lay; rejects a level count outside 1..32767 or a bucket that is not a multiple of 64.
  qsgd(const layout& lay, const options& opt = {})
      : layout_(lay), options_(opt), codec_(quant_encoding::qsgd, opt.levels, opt.bucket) {
    require(opt.levels >= 1 && opt.levels <= qsgd_max_levels,
            "qsgd: levels must be in 1.." + std::to_string(qsgd_max_levels) + ", got " + std::to_string(opt.levels));
    require(opt.bucket % 64 == 0, "qsgd: bucket must be a multiple of 64 (or 0 for whole layers), got " +
                                      std::to_string(opt.bucket));
  }

  //! Upper bound of the packet size.
  [[nodiscard]] std::size_t max_packet_bytes() const noexcept {
    std::size_t n = sizeof(packet_header);
    for (const auto& l : layout_.layers()) n += std::max(codec_.segment_bytes(l.numel), raw_segment_bytes(l.numel));
    return n;
  }

  //! Quantizes every layer whose kept fraction is below 1 (the fraction's value is not used;
  //! the levels set the size); layers at 1 or more go raw.
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
  detail::leveled_codec<detail::level_scale::l2_norm> codec_;
  detail::layered_scratch scratch_;
};
static_assert(Compressor<qsgd>);

}  // namespace gravac
