#pragma once
//! \file
//! \brief The gain curve of a layer on the device, with the host's operations in the host's
//! order (gravac/stats/gain_curve.hpp, add_gain_curve): the energy of the bins above the
//! boundary added in the aligned binary tree over all bins, and the boundary bin's model
//! (partial_bin_energy). The bins are the first-digit bins of the selection's histogram,
//! their energies the fixed-point sums of bin_energy.hpp: both equal the host's, so the
//! curve does.

#include "gravac/cuda/detail/nvcc_flags.hpp"
// (first, and apart from the includes below: a missing compiler option is one readable error)

#include <cstdint>

#include "gravac/cuda/detail/bin_energy.hpp"
#include "gravac/cuda/detail/select_common.hpp"
#include "gravac/stats/gain_curve.hpp"

namespace gravac::detail {

static_assert(max_bins == static_cast<int>(gain_bins) && first_digit_bits == 31 - static_cast<int>(gain_bin_shift),
              "the selection's first digit is the gain bin");
static_assert(max_bins == 8 * select_threads, "eight bins per thread");

//! The energy of the bins above \p bin (their fixed-point sums \p units, one per bin) in the
//! aligned binary tree over all max_bins bins, the others counting zero. Block-wide: every
//! thread calls it; the result is valid in thread 0.
__device__ inline double energy_above_in_tree(const unsigned long long* units, std::uint32_t bin) {
  __shared__ double warp_sum[select_threads / 32];
  __syncthreads();  // a previous call's warp_sum may still be read
  double v[8];
  for (int j = 0; j < 8; ++j) {
    const auto b = static_cast<std::uint32_t>(threadIdx.x) * 8u + static_cast<std::uint32_t>(j);
    v[j] = b > bin ? bin_energy(__ldcg(units + b), b) : 0.0;
  }
  double s = __dadd_rn(__dadd_rn(__dadd_rn(v[0], v[1]), __dadd_rn(v[2], v[3])),
                       __dadd_rn(__dadd_rn(v[4], v[5]), __dadd_rn(v[6], v[7])));
  const unsigned lane = threadIdx.x % 32;
  for (unsigned w = 1; w < 32; w <<= 1) {
    const double right = __shfl_down_sync(0xffffffffu, s, w);
    if ((lane & (2 * w - 1)) == 0) s = __dadd_rn(s, right);
  }
  if (lane == 0) warp_sum[threadIdx.x / 32] = s;
  __syncthreads();
  if (threadIdx.x != 0) return 0.0;
  static_assert(select_threads / 32 == 8);
  return __dadd_rn(__dadd_rn(__dadd_rn(warp_sum[0], warp_sum[1]), __dadd_rn(warp_sum[2], warp_sum[3])),
                   __dadd_rn(__dadd_rn(warp_sum[4], warp_sum[5]), __dadd_rn(warp_sum[6], warp_sum[7])));
}

//! partial_bin_energy (gain_curve.hpp) on the device: the energy of the top \p m of the
//! \p c values of bin \p b whose energy is \p s, each operation rounded as the host's.
__device__ inline double device_partial_bin_energy(std::uint32_t b, unsigned long long m, unsigned long long c,
                                                   double s) {
  if (m == 0 || c == 0) return 0.0;
  if (m >= c) return s;
  const double lo = __uint_as_float(b << gain_bin_shift);
  const double hi = b + 1 >= first_non_finite_gain_bin
                        ? static_cast<double>(3.40282346638528859812e+38f)
                        : static_cast<double>(__uint_as_float((b + 1) << gain_bin_shift));
  const double q = __ddiv_rn(__ull2double_rn(m), __ull2double_rn(c));
  const double a = __dsub_rn(hi, __dmul_rn(q, __dsub_rn(hi, lo)));
  const auto mean_sq = [](double x, double y) {
    return __ddiv_rn(__dadd_rn(__dadd_rn(__dmul_rn(x, x), __dmul_rn(x, y)), __dmul_rn(y, y)), 3.0);
  };
  return __ddiv_rn(__dmul_rn(__dmul_rn(s, q), mean_sq(a, hi)), mean_sq(lo, hi));
}

//! Adds to \p out[c] the kept energy of each of \p gains' candidates over the bins \p count
//! and \p units (whose counts total \p total): the k-th largest's bin, the energy of the bins
//! above it in the aligned tree, and the boundary bin's model; the host's add_gain_curve.
//! Block-wide; \p out is written by thread 0.
__device__ inline void add_curve_of_bins(const std::uint32_t* count, const unsigned long long* units,
                                         unsigned long long total, const gain_request& gains, double* out) {
  for (int c = 0; c < gains.count; ++c) {
    const auto kc = static_cast<std::uint32_t>(gains.k[c] < total ? gains.k[c] : total);
    if (kc == 0) continue;  // the same in every thread
    const boundary bc = find_device_boundary(count, max_bins, kc);
    const double above = energy_above_in_tree(units, bc.bin);
    if (threadIdx.x == 0)
      out[c] += __dadd_rn(
          above, device_partial_bin_energy(bc.bin, kc - bc.above, bc.count, bin_energy(units[bc.bin], bc.bin)));
    __syncthreads();
  }
}

}  // namespace gravac::detail
