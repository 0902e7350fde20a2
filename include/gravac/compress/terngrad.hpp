#pragma once
//! \file terngrad.hpp
//! \brief TernGrad (Wen et al. 2017) with error feedback: scale * {-1, 0, 1}, drawn so that
//! the expectation is u; 2 bits per element plus one float scale per bucket.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include "gravac/compress/detail/leveled_compressor.hpp"
#include "gravac/concepts/concepts.hpp"

namespace gravac {

//! Options of TernGrad.
struct terngrad_options {
  //! Elements per bucket sharing one scale (max |u| of the bucket): a multiple of 64, or 0
  //! for one scale per layer as in the paper. Buckets lower the variance and let the
  //! compressor read each element once while it is in cache. With error feedback the
  //! residual stays bounded but large, about 8 gradient norms for buckets of 512 and 3 for
  //! buckets of 64 on Gaussian gradients: TernGrad's error is larger than its input.
  std::uint32_t bucket = 512;
};

//! TernGrad with error feedback. Models Compressor.
//!
//! With s_b = max |u| over the bucket, element i sends s_b * sign(u_i) with probability
//! |u_i| / s_b and 0 otherwise, so E[sent_i] = u_i. Codes: 00 zero, 01 +1, 11 -1 (10 is
//! rejected). Random draws as for qsgd (detail::element_bits of the stream from seed, step
//! and layer id; the same on every rank). e = u - decompress(packet).
class terngrad : public detail::leveled_compressor<detail::level_scale::max_abs> {
 public:
  //! Options (see terngrad_options).
  using options = terngrad_options;

  //! A compressor for \p lay; rejects a bucket that is not a multiple of 64.
  terngrad(const layout& lay, const options& opt = {})
      : leveled_compressor(lay, quant_encoding::terngrad, 1, opt.bucket), options_(opt) {
    require(opt.bucket % 64 == 0,
            "terngrad: bucket must be a multiple of 64 (or 0 for whole layers), got " + std::to_string(opt.bucket));
  }

  //! The options it was built with.
  [[nodiscard]] const options& get_options() const noexcept { return options_; }

 private:
  options options_;
};
static_assert(Compressor<terngrad>);

}  // namespace gravac
