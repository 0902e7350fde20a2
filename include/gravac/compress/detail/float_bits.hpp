#pragma once
//! \file float_bits.hpp
//! \brief Float <-> bit-pattern moves for the vectorized kernels. memcpy, not std::bit_cast:
//! GCC 12 does not vectorize loops that contain __builtin_bit_cast of a loaded value.

#include <cstdint>
#include <cstring>

namespace gravac::detail {

//! The bits of \p x.
inline std::uint32_t float_bits(float x) noexcept {
  std::uint32_t b;
  std::memcpy(&b, &x, sizeof b);
  return b;
}

//! The float whose bits are \p b.
inline float bits_float(std::uint32_t b) noexcept {
  float x;
  std::memcpy(&x, &b, sizeof x);
  return x;
}

}  // namespace gravac::detail
