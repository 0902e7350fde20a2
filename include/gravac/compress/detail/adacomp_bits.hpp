#pragma once
//! \file
//! \brief Bit tricks of AdaComp's packing: byte-to-bit-position tables and an exact sum of float exponents.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <iterator>
#include <limits>
#include <span>
#include <string>
#include <vector>

#include "gravac/compress/detail/float_bits.hpp"
#include "gravac/compress/detail/quantize_kernels.hpp"
#include "gravac/compress/layered.hpp"
#include "gravac/concepts/concepts.hpp"
#include "gravac/packet/detail/bit_codes.hpp"
#include "gravac/packet/packet_bound.hpp"

namespace gravac::detail {

//! Positions of the set bits of every byte value, and their count: compacting eight
//! flags is then one table row, with no branch.
struct bit_position_table {
  std::uint8_t at[256][8];  //!< at[m][0..count[m]): the set bits of m, ascending
  std::uint8_t count[256];  //!< number of set bits of m
};

//! Builds the table (at compile time).
constexpr bit_position_table make_bit_position_table() noexcept {
  bit_position_table t{};
  for (unsigned m = 0; m < 256; ++m) {
    unsigned c = 0;
    for (unsigned k = 0; k < 8; ++k)
      if ((m >> k) & 1u) t.at[m][c++] = static_cast<std::uint8_t>(k);
    t.count[m] = static_cast<std::uint8_t>(c);
  }
  return t;
}

//! The table, once per program.
inline constexpr bit_position_table byte_bit_positions = make_bit_position_table();

//! An order-free sum of non-negative finite floats, the same on the host and the device:
//! each value's significand is added to the integer of its binary exponent (exact, so the
//! order of the additions does not matter and the device can add with atomics), and the
//! integers are combined in double from the smallest exponent up (a fixed order). Each
//! integer is below 2^56 for up to 2^32 values. cuda/detail/adacomp_kernels.hpp computes
//! the same sum with the same double operations, bit for bit.
struct exponent_sum {
  std::uint64_t at[256];  //!< at[e]: sum of the significands of the values of biased exponent e (1 for subnormals)

  //! Empty.
  exponent_sum() noexcept { clear(); }
  //! Empties the sum.
  void clear() noexcept { std::fill(std::begin(at), std::end(at), std::uint64_t{0}); }
  //! Adds the float of bits \p bits (non-negative, finite).
  void add(std::uint32_t bits) noexcept {
    const std::uint32_t e = bits >> 23, m = bits & 0x7fffffu;
    at[e ? e : 1] += e ? (m | 0x800000u) : m;
  }
  //! The sum: at[e] * 2^(e - 150) for e = 1 .. 254, added in that order in double (each
  //! product is exact: a power of two times an integer of at most 56 bits).
  [[nodiscard]] double value() const noexcept {
    double s = 0;
    for (int e = 1; e < 255; ++e) s += static_cast<double>(at[e]) * std::ldexp(1.0, e - 150);
    return s;
  }
};

}  // namespace gravac::detail
