#pragma once
//! \file
//! \brief cast16's clamp: the largest magnitude of u / N that decodes finite on N ranks,
//! shared by cast16 and cast16_cuda so both send the same bits.

#include <cmath>
#include <cstdint>

#include "gravac/compress/cast16_format.hpp"
#include "gravac/compress/detail/float_bits.hpp"
#include "gravac/compress/detail/half.hpp"

namespace gravac::detail {

//! Float bits of the largest magnitude cast16 sends of u / N on \p ranks = N ranks: the
//! format's largest finite value, lowered one unit of the format's last place at a time
//! while that value times N (what the decoder multiplies back) passes the float maximum,
//! which happens for bf16 from N = 2 (fp16's maximum times N stays far below it). So the
//! decoded value and the residual stay finite for every finite u. cast16_cuda clamps with
//! the same bits.
inline std::uint32_t cast16_limit_bits(cast16_format format, float ranks) noexcept {
  const bool fp16 = format == cast16_format::fp16;
  std::uint32_t bits = float_bits(fp16 ? fp16_max : bf16_max);
  const std::uint32_t unit = fp16 ? 0x2000u : 0x10000u;  // 13 and 16 float mantissa bits dropped
  while (!std::isfinite(bits_float(bits) * ranks)) bits -= unit;
  return bits;
}

}  // namespace gravac::detail
