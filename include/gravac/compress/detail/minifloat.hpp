#pragma once
//! \file minifloat.hpp
//! \brief The element and scale codecs of the block-scaled formats (docs/algorithms.md,
//! "Block-scaled formats"): FP8 E4M3 and E5M2 (OCP 8-bit floating point, the elements of
//! MXFP8 and the scales of NVFP4), FP4 E2M1 (the elements of MXFP4 and NVFP4) and E8M0 (the
//! power-of-two scales of the MX formats), as in the OCP Microscaling Formats (MX)
//! specification v1.0.
//!
//! Every conversion is integer arithmetic on the float's bits, so it is exact (subnormals
//! included) and gives the same bits on every machine and on a device; rounding, saturation
//! and NaN: docs/algorithms.md, "Block-scaled formats".

#include <array>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <limits>

#include "gravac/compress/detail/float_bits.hpp"
#include "gravac/core/detail/isa_dispatch.hpp"

namespace gravac::detail {

//! The element formats of the block-scaled compressors.
enum class minifloat : std::uint8_t {
  e4m3,  //!< FP8 E4M3: bias 7, largest 448, no infinities, S.1111.111 is NaN
  e5m2,  //!< FP8 E5M2: bias 15, largest 57344, IEEE-like infinities and NaNs
  e2m1,  //!< FP4 E2M1: bias 1, values 0, 0.5, 1, 1.5, 2, 3, 4, 6 and their negatives
};

//! The parameters of a minifloat format.
struct minifloat_spec {
  unsigned exponent_bits;  //!< width of the exponent field
  unsigned mantissa_bits;  //!< width of the trailing significand field
  int bias;                //!< exponent bias
  std::uint32_t max_code;  //!< the code (sign clear) of the largest finite value
  int emax;                //!< the unbiased exponent of the largest finite value (the spec's emax_elem)
};

//! The parameters of format \p f.
constexpr minifloat_spec spec_of(minifloat f) noexcept {
  switch (f) {
    case minifloat::e4m3:
      return {4, 3, 7, 0x7eu, 8};
    case minifloat::e5m2:
      return {5, 2, 15, 0x7bu, 15};
    case minifloat::e2m1:
      return {2, 1, 1, 0x7u, 2};
  }
  return {};
}

//! The sign bit of a code of format \p f (bit 7 of an FP8 code, bit 3 of an FP4 code).
constexpr std::uint32_t sign_bit_of(minifloat f) noexcept {
  return 1u << (spec_of(f).exponent_bits + spec_of(f).mantissa_bits);
}

//! True when code \p c of format \p f is a NaN (E4M3: S.1111.111; E5M2: exponent all ones
//! and a non-zero significand; E2M1 has none).
constexpr bool minifloat_is_nan(minifloat f, std::uint32_t c) noexcept {
  const std::uint32_t mag = c & (sign_bit_of(f) - 1u);
  if (f == minifloat::e4m3) return mag == 0x7fu;
  if (f == minifloat::e5m2) return mag > 0x7cu;
  return false;
}

//! True when code \p c of format \p f is an infinity (E5M2 only: S.11111.00).
constexpr bool minifloat_is_inf(minifloat f, std::uint32_t c) noexcept {
  return f == minifloat::e5m2 && (c & 0x7fu) == 0x7cu;
}

//! 2^n for n in [-126, 127], exactly (the float's exponent field).
constexpr float pow2_normal(int n) noexcept { return std::bit_cast<float>(static_cast<std::uint32_t>(n + 127) << 23); }

//! The value of code \p c (sign included) of format \p f, exactly: a NaN or an infinity for
//! the codes the format reserves; otherwise (-1)^S * 2^(1 - bias) * (0.M) for exponent
//! field 0 (subnormal), (-1)^S * 2^(E - bias) * (1.M) otherwise.
constexpr float minifloat_value(minifloat f, std::uint32_t c) noexcept {
  const minifloat_spec s = spec_of(f);
  const bool negative = (c & sign_bit_of(f)) != 0;
  if (minifloat_is_nan(f, c))
    return negative ? -std::numeric_limits<float>::quiet_NaN() : std::numeric_limits<float>::quiet_NaN();
  if (minifloat_is_inf(f, c))
    return negative ? -std::numeric_limits<float>::infinity() : std::numeric_limits<float>::infinity();
  const std::uint32_t mag = c & (sign_bit_of(f) - 1u);
  const std::uint32_t e = mag >> s.mantissa_bits;
  const std::uint32_t m = mag & ((1u << s.mantissa_bits) - 1u);
  const int ms = static_cast<int>(s.mantissa_bits);
  const float v =
      e == 0 ? static_cast<float>(m) * pow2_normal(1 - s.bias - ms)
             : static_cast<float>((1u << s.mantissa_bits) + m) * pow2_normal(static_cast<int>(e) - s.bias - ms);
  return negative ? -v : v;
}

//! The values of every code of format \p f (256 for FP8; the 16 FP4 codes, repeated).
template <minifloat F>
constexpr std::array<float, 256> make_minifloat_table() noexcept {
  std::array<float, 256> t{};
  for (std::uint32_t c = 0; c < 256; ++c) t[c] = minifloat_value(F, c & (2 * sign_bit_of(F) - 1u));
  return t;
}

//! Decoding tables, one float per code.
template <minifloat F>
inline constexpr std::array<float, 256> minifloat_table = make_minifloat_table<F>();

//! The value of code \p c of format \p F (a table lookup; exact).
template <minifloat F>
GRAVAC_KERNEL_INLINE float decode_minifloat(std::uint32_t c) noexcept {
  return minifloat_table<F>[c & 0xffu];
}

//! The magnitude code (sign clear) of |x| * 2^-shift in format \p F, where \p a is the bit
//! pattern of |x|, a finite float or +infinity (not a NaN). Rounded to nearest even, or with
//! \p Stochastic by the 32 random bits \p r: the value rounds up with probability equal to
//! its distance from the code below in units of the code step (to 2^-32 of a step when the
//! step is more than 2^32 float units, and never for values below 2^-39 of a step). Then
//! saturated to the largest finite code. Exact: the quotient is never formed in float.
//! Integer operations only.
template <minifloat F, bool Stochastic>
GRAVAC_KERNEL_INLINE std::uint32_t encode_magnitude(std::uint32_t a, int shift, std::uint32_t r) noexcept {
  constexpr minifloat_spec s = spec_of(F);
  constexpr int mb = static_cast<int>(s.mantissa_bits);
  constexpr int emin = 1 - s.bias;  // the exponent of the smallest normal value
  // |x| = M * 2^e0, M an integer below 2^24 (the hidden bit added for normal floats).
  const std::uint32_t fe = a >> 23;
  const std::uint32_t M = (a & 0x7fffffu) | (fe != 0 ? 0x800000u : 0u);
  const int e0 = static_cast<int>(fe != 0 ? fe : 1u) - 150;
  const int fl = e0 + static_cast<int>(std::bit_width(M)) - 1 - shift;  // floor(log2 |x| 2^-shift)
  const int top = fl > emin ? fl : emin;                                // the binade (subnormals share emin's)
  // The code's significand N counts steps of 2^(top - mb): M shifted right by sh, rounded.
  const int sh = top - mb - (e0 - shift);
  std::uint64_t n;
  if (sh <= 0) {
    n = static_cast<std::uint64_t>(M) << (-sh);  // exact (-sh <= mb: M has few bits then)
  } else if (sh >= 64) {
    n = 0;
  } else if constexpr (Stochastic) {
    n = (static_cast<std::uint64_t>(M) + ((static_cast<std::uint64_t>(r) << 32) >> (64 - sh))) >> sh;
  } else {
    const std::uint64_t q = static_cast<std::uint64_t>(M) >> sh;
    const std::uint64_t rem = static_cast<std::uint64_t>(M) & ((std::uint64_t{1} << sh) - 1u);
    const std::uint64_t half = std::uint64_t{1} << (sh - 1);
    n = q + static_cast<std::uint64_t>(rem > half || (rem == half && (q & 1u) != 0));
  }
  // A rounding up to 2^(mb+1) carries into the exponent field by itself.
  const std::uint64_t code = (static_cast<std::uint64_t>(top - emin) << mb) + n;
  const std::uint64_t sat = code < s.max_code ? code : s.max_code;
  return M == 0 ? 0u : static_cast<std::uint32_t>(sat);
}

//! The code of \p x * 2^-shift in format \p F, rounded to nearest even and saturated (an
//! infinity too); a NaN becomes the format's NaN (+0 for E2M1, which has none).
template <minifloat F>
inline std::uint32_t encode_minifloat(float x, int shift = 0) noexcept {
  const std::uint32_t b = float_bits(x);
  const std::uint32_t a = b & 0x7fffffffu;
  const std::uint32_t sign = (b >> 31) != 0 ? sign_bit_of(F) : 0u;
  if (a > 0x7f800000u) return F == minifloat::e2m1 ? 0u : (sign | (sign_bit_of(F) - 1u));
  return sign | encode_magnitude<F, false>(a, shift, 0);
}

//! The code of \p x * 2^-shift in format \p F rounded stochastically by the random bits
//! \p r (encode_magnitude) and saturated; a NaN as encode_minifloat.
template <minifloat F>
inline std::uint32_t encode_minifloat_stochastic(float x, std::uint32_t r, int shift = 0) noexcept {
  const std::uint32_t b = float_bits(x);
  const std::uint32_t a = b & 0x7fffffffu;
  const std::uint32_t sign = (b >> 31) != 0 ? sign_bit_of(F) : 0u;
  if (a > 0x7f800000u) return F == minifloat::e2m1 ? 0u : (sign | (sign_bit_of(F) - 1u));
  return sign | encode_magnitude<F, true>(a, shift, r);
}

//! The E8M0 code that is NaN.
inline constexpr std::uint32_t e8m0_nan = 0xffu;
//! The smallest and largest exponents an E8M0 scale holds (codes 0 and 254).
inline constexpr int e8m0_min_exponent = -127;
//! The largest exponent an E8M0 scale holds (code 254).
inline constexpr int e8m0_max_exponent = 127;

//! The value of E8M0 code \p c: 2^(c - 127) (2^-127 is a subnormal float, exact), NaN for 0xFF.
constexpr float e8m0_value(std::uint32_t c) noexcept {
  c &= 0xffu;
  if (c == e8m0_nan) return std::numeric_limits<float>::quiet_NaN();
  return c == 0 ? std::bit_cast<float>(0x00400000u) : std::bit_cast<float>(c << 23);
}

//! The E8M0 code of 2^\p k, \p k clamped to [-127, 127].
constexpr std::uint32_t e8m0_code(int k) noexcept {
  k = k < e8m0_min_exponent ? e8m0_min_exponent : k > e8m0_max_exponent ? e8m0_max_exponent : k;
  return static_cast<std::uint32_t>(k + 127);
}

//! floor(log2 v) of the positive float whose bits are \p a (finite, non-zero).
GRAVAC_KERNEL_INLINE int floor_log2_bits(std::uint32_t a) noexcept {
  const std::uint32_t fe = a >> 23;
  return fe != 0 ? static_cast<int>(fe) - 127 : static_cast<int>(std::bit_width(a & 0x7fffffu)) - 150;
}

//! The MX shared exponent of a block whose largest finite |v| has bits \p amax (0 for a
//! block of zeros): floor(log2 amax) - emax_elem of format \p F, the specification's
//! reference choice, clamped to E8M0's range (the block's values then underflow, which the
//! residual keeps). A block of zeros takes the smallest scale, 2^-127 (the specification
//! leaves it open: any scale codes zeros).
template <minifloat F>
GRAVAC_KERNEL_INLINE int mx_shared_exponent(std::uint32_t amax) noexcept {
  if (amax == 0) return e8m0_min_exponent;
  const int k = floor_log2_bits(amax) - spec_of(F).emax;
  return k < e8m0_min_exponent ? e8m0_min_exponent : k > e8m0_max_exponent ? e8m0_max_exponent : k;
}

}  // namespace gravac::detail
