#pragma once
//! \file half.hpp
//! \brief Portable float <-> fp16 / bf16 conversions (round to nearest even) on bit
//! patterns, so they vectorize without F16C and give the same bits on every rank.
//! Inputs must be finite and inside the target's range (cast16 clamps first).

#include <cstdint>

#include "gravac/compress/detail/float_bits.hpp"
#include "gravac/core/detail/isa_dispatch.hpp"

namespace gravac::detail {

//! Largest finite fp16 value.
inline constexpr float fp16_max = 65504.0f;
//! Largest finite bf16 value (0x7f7f).
inline constexpr float bf16_max = 0x1.fep127f;

//! fp16 bits of a magnitude: \p a is the bit pattern of a float in [0, fp16_max], the
//! result its fp16 bits rounded to nearest even. Both cases are computed and one is
//! selected with an integer select, so loops calling it vectorize.
GRAVAC_KERNEL_INLINE std::uint32_t fp16_of_magnitude(std::uint32_t a) noexcept {
  // Below 2^-14 fp16 is subnormal with unit 2^-24: adding 0.5 (whose float ulp is 2^-24)
  // lets the FPU round to that unit, and the mantissa then holds the fp16 bits.
  const std::uint32_t subnormal = float_bits(bits_float(a) + 0.5f) - 0x3f000000u;
  // Rebias the exponent (127 -> 15) and round the 13 dropped mantissa bits to nearest even
  // ((15 - 127) << 23 plus the rounding bias, modulo 2^32).
  const std::uint32_t normal = (a + 0xc8000fffu + ((a >> 13) & 1u)) >> 13;
  // A mask, not a ternary: GCC would sink the float add into a branch of the ternary and,
  // under the default -ftrapping-math, not vectorize the branch back.
  const std::uint32_t is_subnormal = 0u - static_cast<std::uint32_t>(a < 0x38800000u);
  return (subnormal & is_subnormal) | (normal & ~is_subnormal);
}

//! fp16 bits of \p f, rounded to nearest even; |f| <= fp16_max and finite.
inline std::uint16_t float_to_fp16(float f) noexcept {
  const std::uint32_t x = float_bits(f);
  return static_cast<std::uint16_t>(fp16_of_magnitude(x & 0x7fffffffu) | ((x >> 16) & 0x8000u));
}

//! Float value of finite fp16 bits \p h (exact).
GRAVAC_KERNEL_INLINE float fp16_to_float(std::uint16_t h) noexcept {
  // Normal values: rebias the exponent (15 -> 127) in the integer bits. Subnormal ones
  // (exponent 0): mantissa * 2^-24, converted from an integer. Neither step touches a float
  // denormal, which would cost a microcode assist per vector on x86; a mask selects.
  const std::uint32_t m = static_cast<std::uint32_t>(h) & 0x7fffu;
  const std::uint32_t normal = (m << 13) + 0x38000000u;
  const std::uint32_t subnormal = float_bits(static_cast<float>(static_cast<std::int32_t>(m)) * 0x1p-24f);
  const std::uint32_t is_subnormal = 0u - static_cast<std::uint32_t>(m < 0x400u);
  return bits_float(((subnormal & is_subnormal) | (normal & ~is_subnormal)) |
                    (static_cast<std::uint32_t>(h & 0x8000u) << 16));
}

//! True when fp16 bits \p h are infinite or NaN.
constexpr bool fp16_non_finite(std::uint16_t h) noexcept { return (h & 0x7c00u) == 0x7c00u; }

//! bf16 bits of \p f, rounded to nearest even; |f| <= bf16_max and finite.
inline std::uint16_t float_to_bf16(float f) noexcept {
  const std::uint32_t x = float_bits(f);
  return static_cast<std::uint16_t>((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

//! Float value of bf16 bits \p h (exact).
inline float bf16_to_float(std::uint16_t h) noexcept { return bits_float(static_cast<std::uint32_t>(h) << 16); }

//! True when bf16 bits \p h are infinite or NaN.
constexpr bool bf16_non_finite(std::uint16_t h) noexcept { return (h & 0x7f80u) == 0x7f80u; }

}  // namespace gravac::detail
