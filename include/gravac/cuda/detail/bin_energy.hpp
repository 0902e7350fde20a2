#pragma once
//! \file
//! \brief The energy (sum of u^2) of a magnitude-histogram bin in fixed point. Every value
//! of a first-digit bin (key >> 20) shares its exponent, so u^2 is a 48-bit integer times a
//! power of two the bin fixes: integer atomics sum it exactly, in any order, where float
//! atomics would round in the order the threads happen to run. The units are the host
//! histogram's (magnitude_histogram.hpp, energy_units), so the energies equal the host's.

#include "gravac/cuda/detail/nvcc_flags.hpp"
// (first, and apart from the includes below: a missing compiler option is one readable error)

#include <cstdint>

#include "gravac/stats/magnitude_histogram.hpp"

namespace gravac::detail {

// energy_shift: the host's (gravac/stats/magnitude_histogram.hpp), whose units these are.

//! 2^k as a double, for -1022 <= k <= 1023 (a normal double: built from its bits).
__device__ __forceinline__ double exact_pow2(int k) {
  return __longlong_as_double(static_cast<long long>(k + 1023) << 52);
}

//! u^2 in the fixed-point units of its bin, for the magnitude key of a finite float u:
//! u = M * 2^(max(E, 1) - 150) with M the 24-bit significand (subnormals: the fraction).
__device__ __forceinline__ unsigned long long energy_units(std::uint32_t key) {
  const std::uint32_t e = key >> 23, m = key & 0x7fffffu;
  const unsigned long long sig = e ? (m | 0x800000u) : m;
  return (sig * sig) >> energy_shift;
}

//! The energy of first-digit bin \p bin whose fixed-point sum is \p units.
__device__ __forceinline__ double bin_energy(unsigned long long units, std::uint32_t bin) {
  const int e = static_cast<int>(bin >> 3);
  return __dmul_rn(__ull2double_rn(units), exact_pow2(energy_shift + 2 * ((e ? e : 1) - 150)));
}

}  // namespace gravac::detail
