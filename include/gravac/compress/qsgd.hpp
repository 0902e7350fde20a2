#pragma once
//! \file qsgd.hpp
//! \brief QSGD (Alistarh et al. 2017) with error feedback: per bucket the L2 norm, per
//! element a sign and a level in 0..s chosen by unbiased stochastic rounding.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <utility>

#include "gravac/compress/detail/leveled_compressor.hpp"
#include "gravac/concepts/concepts.hpp"

namespace gravac {

//! Options of QSGD.
struct qsgd_options {
  //! Levels s of |u| / ||u_bucket|| (1..32767). Codes take code_width(s) bits: s = 1 gives
  //! 2 bits, 7 gives 4, 127 gives 8, more gives 16.
  //!
  //! With error feedback the residual stays bounded only when the quantization error is
  //! smaller than its input; QSGD's bound is E||Q(u) - u||^2 <= min(B / s^2, sqrt(B) / s)
  //! ||u||^2 for buckets of B elements (the layer when bucket = 0), so choose s >= about
  //! sqrt(B). Below that the residual grows geometrically and training diverges: s = 1 with
  //! any bucket, s = 3 or 7 with buckets of 512 (measured: ||e|| grows by about 4% a step at
  //! s = 7, B = 512 on Gaussian gradients). s = 7 with buckets of 64 and the defaults (s =
  //! 127, B = 512) stay bounded (test_quantizers checks both sides).
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
class qsgd : public detail::leveled_compressor<detail::level_scale::l2_norm> {
 public:
  //! Options (see qsgd_options).
  using options = qsgd_options;

  //! A compressor for \p lay; rejects a level count outside 1..32767 or a bucket that is not a multiple of 64.
  qsgd(const layout& lay, const options& opt = {})
      : leveled_compressor(lay, quant_encoding::qsgd, opt.levels, opt.bucket), options_(opt) {
    require(opt.levels >= 1 && opt.levels <= qsgd_max_levels, "qsgd: levels must be in 1..", qsgd_max_levels, ", got ",
            opt.levels);
    require(opt.bucket % 64 == 0, "qsgd: bucket must be a multiple of 64 (or 0 for whole layers), got ", opt.bucket);
  }

  //! The options it was built with.
  [[nodiscard]] const options& get_options() const noexcept { return options_; }

 private:
  options options_;
};
static_assert(Compressor<qsgd>);

}  // namespace gravac
