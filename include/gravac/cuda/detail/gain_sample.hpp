#pragma once
//! \file
//! \brief The gain curve's sample of a large layer on the device, as the host's fused pass
//! takes it (gravac/compress/detail/gain_sampling.hpp): the blocks of fused_block values
//! whose index is the phase modulo the stride, each value weighted by the stride; and the
//! bins the curve then reads, the sample's below the step's sending threshold's bin and the
//! exact ones above (the host's complete_sampled_gain). Integer counts and fixed-point
//! energies, so the curve equals the host's bit for bit.

#include "gravac/cuda/detail/nvcc_flags.hpp"
// (first, and apart from the includes below: a missing compiler option is one readable error)

#include <cstddef>
#include <cstdint>

#include "gravac/compress/detail/gain_sampling.hpp"
#include "gravac/cuda/detail/cub_primitives.hpp"
#include "gravac/cuda/detail/select_common.hpp"
#include "gravac/cuda/detail/square_sums.hpp"

namespace gravac::detail {

static_assert(square_sum_leaf == fused_block && select_threads == static_cast<int>(fused_block),
              "a leaf of the sums' tree is a block of the host's sample, one value per thread");

//! Adds the sampled blocks among this block's positions of \p grid (square_sums_pass's
//! tiles) to gains.sample_hist and gains.sample_sq, reading u back from \p u, where this
//! block's threads left it. The shared bins \p sh_hist and \p sh_sq are reused: each thread
//! must have flushed its bins (those of its index modulo select_threads). Block-wide.
__device__ inline void add_gain_sample(const float* u, std::size_t n, const pass_grid& grid, const gain_request& gains,
                                       std::uint32_t* sh_hist, unsigned long long* sh_sq) {
  // Each thread zeroes the bins it flushed itself (the flush's stride): no barrier before.
  for (int i = static_cast<int>(threadIdx.x); i < max_bins; i += select_threads) {
    sh_hist[i] = 0;
    sh_sq[i] = 0;
  }
  __syncthreads();
  const unsigned long long per = tiles_per_block(n, grid.blocks);
  const unsigned long long tiles = (n + square_tile - 1) / square_tile;
  const unsigned long long t0 = grid.block * per;
  const unsigned long long t1 = t0 + per < tiles ? t0 + per : tiles;
  const unsigned long long end = t1 * square_tile_leaves;
  const unsigned long long begin = t0 * square_tile_leaves;
  // The first block of the sample at or after this block's first leaf.
  for (unsigned long long leaf = begin + (gains.phase + gains.stride - begin % gains.stride) % gains.stride; leaf < end;
       leaf += gains.stride) {
    const std::size_t i = leaf * square_sum_leaf + threadIdx.x;
    if (i >= n) break;
    const std::uint32_t key = device_magnitude_key(u[i]);
    if (key < non_finite_key) {  // the curve counts finite values only
      atomicAdd(&sh_hist[key >> gain_bin_shift], 1u);
      atomicAdd(&sh_sq[key >> gain_bin_shift], energy_units(key));
    }
  }
  __syncthreads();
  for (int i = static_cast<int>(threadIdx.x); i < max_bins; i += select_threads) {
    if (sh_hist[i]) {
      atomicAdd(&gains.sample_hist[i], sh_hist[i]);
      atomicAdd(&gains.sample_sq[i], sh_sq[i]);
    }
  }
}

//! In the last block, once every block's sample is in: rewrites gains.sample_hist and
//! gains.sample_sq as the bins the curve reads, each bin from \p exact_from on taken from the
//! exact \p count and \p units, each below from the sample times the stride. Returns their
//! total count (valid in every thread). Block-wide.
__device__ inline unsigned long long curve_bins_from_sample(const std::uint32_t* count, const unsigned long long* units,
                                                            const gain_request& gains, std::uint32_t exact_from) {
  using total_reduce_t = block_reduce<unsigned long long, select_threads>;
  __shared__ typename total_reduce_t::TempStorage red;
  __shared__ unsigned long long total;
  unsigned long long mine = 0;
  for (int i = static_cast<int>(threadIdx.x); i < max_bins; i += select_threads) {
    const bool exact = static_cast<std::uint32_t>(i) >= exact_from;
    const std::uint32_t c = exact ? count[i] : gains.stride * __ldcg(gains.sample_hist + i);
    gains.sample_sq[i] = exact ? __ldcg(units + i) : gains.stride * __ldcg(gains.sample_sq + i);
    gains.sample_hist[i] = c;
    mine += c;
  }
  const unsigned long long sum = total_reduce_t(red).Sum(mine);
  if (threadIdx.x == 0) total = sum;
  __syncthreads();
  return total;
}

//! The first bin of a sampled curve taken exactly (exact_gain_from of the step's sending
//! threshold): top-k's k-th largest finite key, threshold selection's estimate \p estimate
//! when at most k of the \p hits at or above it, else their k-th largest; none when nothing
//! is sent. \p count is the exact histogram of the \p finite finite values. Block-wide.
__device__ inline std::uint32_t exact_curve_from(const std::uint32_t* count, std::uint32_t finite, std::uint32_t k,
                                                 bool threshold_mode, bool has_estimate, std::uint32_t estimate,
                                                 std::uint32_t hits) {
  if (threshold_mode) {
    if (k == 0 || !has_estimate) return gain_bins;
    if (hits <= k) return exact_gain_from(estimate);
  }
  const std::uint32_t kb = k < finite ? k : finite;
  if (kb == 0) return gain_bins;
  return find_device_boundary(count, max_bins, kb).bin + 1;
}

}  // namespace gravac::detail
