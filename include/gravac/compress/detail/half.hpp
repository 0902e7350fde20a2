#pragma once
//! \file half.hpp
//! \brief Portable float <-> fp16 / bf16 conversions (round to nearest even) on bit
//! patterns, so they vectorize without F16C and give the same bits on every rank.
//! Inputs must be finite and inside the target's range (cast16 clamps first).

#include <bit>
#include <cstdint>

namespace gravac::detail {

//! Largest finite fp16 value.
inline constexpr float fp16_max = 65504.0f;
//! Largest finite bf16 value (0x7f7f).
inline constexpr float bf16_max = 0x1.fep127f;

//! fp16 bits of \p f, rounded to nearest even; |f| <= fp16_max and finite.
inline std::uint16_t float_to_fp16(float f) noexcept {
  const std::uint32_t x = std::bit_cast<std::uint32_t>(f);
  const std::uint32_t sign = (x >> 16) & 0x8000u;
  std::uint32_t a = x & 0x7fffffffu;
  std::uint32_t h;
  if (a < 0x38800000u) {
    // Below 2^-14 fp16 is subnormal with unit 2^-24: adding 0.5 (whose float ulp is 2^-24)
    // lets the FPU round to that unit, and the mantissa then holds the fp16 bits.
    const float t = std::bit_cast<float>(a) + 0.5f;
    h = std::bit_cast<std::uint32_t>(t) - 0x3f000000u;
  } else {
    // Rebias the exponent (127 -> 15) and round the 13 dropped mantissa bits to nearest even.
    const std::uint32_t odd = (a >> 13) & 1u;
    a += 0xc8000fffu + odd;  // (15 - 127) << 23 plus the rounding bias, modulo 2^32
    h = a >> 13;
  }
  return static_cast<std::uint16_t>(h | sign);
}

//! Float value of finite fp16 bits \p h (exact).
inline float fp16_to_float(std::uint16_t h) noexcept {
  // Placing the fp16 exponent and mantissa in a float's low exponent bits and scaling by
  // 2^112 (the bias difference) handles normal and subnormal values alike.
  const std::uint32_t bits = (static_cast<std::uint32_t>(h & 0x8000u) << 16) | (static_cast<std::uint32_t>(h & 0x7fffu) << 13);
  return std::bit_cast<float>(bits) * 0x1p112f;
}

//! True when fp16 bits \p h are infinite or NaN.
constexpr bool fp16_non_finite(std::uint16_t h) noexcept { return (h & 0x7c00u) == 0x7c00u; }

//! bf16 bits of \p f, rounded to nearest even; |f| <= bf16_max and finite.
inline std::uint16_t float_to_bf16(float f) noexcept {
  const std::uint32_t x = std::bit_cast<std::uint32_t>(f);
  return static_cast<std::uint16_t>((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

//! Float value of bf16 bits \p h (exact).
inline float bf16_to_float(std::uint16_t h) noexcept { return std::bit_cast<float>(static_cast<std::uint32_t>(h) << 16); }

//! True when bf16 bits \p h are infinite or NaN.
constexpr bool bf16_non_finite(std::uint16_t h) noexcept { return (h & 0x7f80u) == 0x7f80u; }

}  // namespace gravac::detail
