#pragma once
//! \file
//! \brief Pass 1 of the device radix select: the fused error-feedback pass (u = g + e, statistics, first-digit
//! histogram, candidates, first boundary, gain curve).

#include "gravac/cuda/detail/nvcc_flags.hpp"
// (first, and apart from the includes below: a missing compiler option is one readable error)

#include <cstdint>

#include "gravac/cuda/detail/bin_energy.hpp"
#include "gravac/cuda/detail/cub_primitives.hpp"
#include "gravac/cuda/detail/gain_bins.hpp"
#include "gravac/cuda/detail/gain_sample.hpp"
#include "gravac/cuda/detail/ordered_sums.hpp"
#include "gravac/cuda/detail/select_common.hpp"
#include "gravac/cuda/detail/square_sums.hpp"

namespace gravac::detail {

//! Pass 1 (fused): u = g + e, e = u, statistics, first-digit histogram, candidates at or
//! above the previous threshold, and (last block) the first boundary and the gain curve.
//!
//! Threshold mode (threshold_cuda): \p prev_threshold holds the estimated low threshold t
//! itself (non_finite_key or more: none). The candidates are every finite key >= t; when
//! there are at most k of them they are the selection, else the k-th largest key T is
//! resolved as for top-k and every key >= T is sent (ties included).
//!
//! Whole-buffer top-k: with \p copy, u is also written to copy[i] (each layer's u into the
//! concatenation of the compressed layers); with \p g null, u is e as it stands (read only:
//! the selection over that concatenation).
//!
//! The statistics repeat bit for bit whatever order the blocks run in: the norms are the
//! host's (the tree of square_sums.hpp, through \p slots; none with \p sums null), the bins' energies in
//! fixed point (bin_energy.hpp), whose integer sums no order can change. Each candidate's
//! kept energy is added to gain_out[c] by the last block.
//!
//! Returns true in the block that finished last among \p grid's (the others return early).
__device__ inline bool fused_pass_body(const float* __restrict__ g, float* __restrict__ e, std::size_t n,
                                       std::uint32_t k, select_state* __restrict__ st,
                                       const std::uint32_t* __restrict__ prev_threshold,
                                       std::uint32_t* __restrict__ hist, unsigned long long* __restrict__ hist_sq,
                                       std::uint32_t* __restrict__ cand, std::uint32_t cap,
                                       layer_sums* __restrict__ sums, const gain_request& gains,
                                       double* __restrict__ gain_out, bool threshold_mode, float* __restrict__ copy,
                                       block_slots slots, pass_grid grid) {
  __shared__ std::uint32_t sh_hist[max_bins];
  __shared__ unsigned long long sh_sq[max_bins];
  const bool want_sq = gains.count > 0;
  // The histogram serves the selection and the gain curve: a pass with neither (k = 0, no
  // candidates: u and the norms only) skips its atomics.
  const bool want_hist = k > 0 || want_sq || threshold_mode;
  for (int i = static_cast<int>(threadIdx.x); i < max_bins; i += select_threads) {
    sh_hist[i] = 0;
    if (want_sq) sh_sq[i] = 0;
  }
  __syncthreads();
  const std::uint32_t prev = *prev_threshold;  // top-k: 0 is no previous threshold
  const bool use_prev = threshold_mode ? prev < non_finite_key : prev != 0u;
  const std::uint32_t low = threshold_mode ? prev : (prev > candidate_margin ? prev - candidate_margin : 0u);
  bool bad = false;
  // The positions in the order of the norms' tree (square_sums.hpp); a warp's lanes stay
  // converged for the warp-aggregated append.
  double* const out[2] = {sums ? &sums->grad_sq : nullptr, sums ? &sums->input_sq : nullptr};
  square_sums_pass<2>(
      n, grid, slots, out,
      [&](std::size_t i, bool in, float(&v)[2]) {
        std::uint32_t key = 0;
        bool finite = false;
        if (in) {
          const float gv = g ? g[i] : 0.0f;
          const float u = g ? gv + e[i] : e[i];
          if (g) e[i] = u;
          if (copy) copy[i] = u;
          v[0] = gv;
          v[1] = u;
          key = device_magnitude_key(u);
          finite = key < non_finite_key;
          bad |= !finite;
          if (finite && want_hist) {  // NaN and infinity are never selected: they stay in the residual
            atomicAdd(&sh_hist[key >> 20], 1u);
            if (want_sq) atomicAdd(&sh_sq[key >> 20], energy_units(key));
          }
        }
        if (use_prev) warp_append(finite && key >= low, key, cand, cap, &st->cand_count);
      },
      [&](std::size_t i, float(&v)[2]) {  // g, and u where this pass left it
        v[0] = g ? g[i] : 0.0f;
        v[1] = e[i];
      });
  if (__syncthreads_or(bad) && threadIdx.x == 0) atomicOr(&st->non_finite, 1u);  // any number of blocks
  for (int i = static_cast<int>(threadIdx.x); i < max_bins; i += select_threads) {
    if (sh_hist[i]) {
      atomicAdd(&hist[i], sh_hist[i]);
      if (want_sq) atomicAdd(&hist_sq[i], sh_sq[i]);
    }
  }
  const bool sampled = want_sq && gains.stride > 1;  // a large layer's curve: gain_sample.hpp
  if (sampled) add_gain_sample(e, n, grid, gains, sh_hist, sh_sq);
  if (!last_block_of(&st->blocks_done, grid.blocks)) return false;

  // The last block: the histogram is complete.
  std::uint32_t mine = 0;
  for (int i = static_cast<int>(threadIdx.x); i < max_bins; i += select_threads) {
    sh_hist[i] = hist[i];
    mine += sh_hist[i];
    if (!gains.defer) hist[i] = 0;  // ready for the next pass (a deferred curve reads it first)
  }
  // The finite count (the histogram holds finite keys only): k and the gain candidates'
  // k are at most that, as in gravac::topk and add_gain_curve.
  using count_reduce_t = block_reduce<std::uint32_t, select_threads>;
  __shared__ typename count_reduce_t::TempStorage count_red;
  __shared__ std::uint32_t finite_total;
  const std::uint32_t total = count_reduce_t(count_red).Sum(mine);
  if (threadIdx.x == 0) finite_total = total;
  __syncthreads();
  // Gain curve: for each candidate k, the energy of the bins above its boundary (in the
  // aligned tree) plus the boundary bin's model: the host's add_gain_curve (gain_bins.hpp).
  // Its bins: the exact histogram, or for a sampled layer the sample's below the step's
  // sending threshold's bin and the exact ones above (gain_sample.hpp).
  // A deferred curve (gains.defer) is deferred_gain_curve's, once the threshold is known.
  if (sampled && !gains.defer) {
    const std::uint32_t from =
        exact_curve_from(sh_hist, finite_total, k, threshold_mode, use_prev, prev, st->cand_count);
    add_curve_of_bins(gains.sample_hist, gains.sample_sq, curve_bins_from_sample(sh_hist, hist_sq, gains, from), gains,
                      gain_out);
  } else if (!gains.defer) {
    add_curve_of_bins(sh_hist, hist_sq, finite_total, gains, gain_out);
  }
  if (want_sq && !gains.defer) {
    __syncthreads();
    for (int i = static_cast<int>(threadIdx.x); i < max_bins; i += select_threads) {
      hist_sq[i] = 0;
      if (sampled) {
        gains.sample_hist[i] = 0;
        gains.sample_sq[i] = 0;
      }
    }
  }
  if (threshold_mode) {
    const std::uint32_t hits = st->cand_count;  // finite keys >= t (counted beyond the buffer too)
    if (k == 0 || !use_prev || hits == 0) {
      if (threadIdx.x == 0) {
        st->done = 2;  // nothing at or above the estimate
        st->count = 0;
      }
      return true;
    }
    if (hits <= k) {  // the estimate erred high or was right: send every key >= t
      if (threadIdx.x == 0) {
        st->done = 1;
        st->threshold = prev;
        st->take_all_ties = 1;
        st->count = hits;
      }
      return true;
    }
    if (threadIdx.x == 0) st->all_ties = 1;  // more than k: raise t to the k-th largest
  }
  if (k == 0 || finite_total == 0) {
    if (threadIdx.x == 0) {
      st->done = 2;  // nothing to select
      st->count = 0;
      st->too_few_finite = k > 0;
      st->gain_from = gain_bins;
    }
    return true;
  }
  if (finite_total <= k) {
    const std::uint32_t lowest = find_device_boundary(sh_hist, max_bins, finite_total).bin;  // the least sent's
    // Every finite value is sent (k is the finite count, as gravac::topk): keys >= 0 that
    // are finite, which the compaction's predicate takes with threshold 0 and all ties.
    if (threadIdx.x == 0) {
      st->done = 1;
      st->threshold = 0;
      st->take_all_ties = 1;
      st->count = finite_total;
      st->too_few_finite = finite_total < k;
      st->gain_from = lowest + 1;
    }
    return true;
  }
  const boundary b = find_device_boundary(sh_hist, max_bins, k);
  if (threadIdx.x != 0) return true;
  st->count = k;
  st->gain_from = b.bin + 1;
  if (b.count == 0) {  // cannot happen (k < finite_total); nothing is selected, compress() fails
    st->done = 2;
    return true;
  }
  st->prefix = b.bin;
  st->remaining = k - b.above;
  st->boundary_count = b.count;
  if (b.count == st->remaining) {  // early exit: the whole boundary bin is kept
    st->done = 1;
    st->threshold = b.bin << 20;
    st->take_all_ties = 1;
    return true;
  }
  const bool hit = use_prev && low <= (b.bin << 20) && st->cand_count <= cap;
  if (hit) {
    st->cand_valid = 1;
  } else if (b.count <= cap) {
    st->collect = 1;
    st->cand_count = 0;
  } else {
    st->cand_count = 0;  // refine over the whole input
  }
  return true;
}

//! Pass 1 over one layer (the whole grid): fused_pass_body. No default arguments: it is
//! launched through detail::launch (a function pointer), so every launch passes
//! threshold_mode (false for top-k) and copy (null: none).
static __global__ void __launch_bounds__(select_threads)
    select_fused_pass(const float* __restrict__ g, float* __restrict__ e, std::size_t n, std::uint32_t k,
                      select_state* __restrict__ st, const std::uint32_t* __restrict__ prev_threshold,
                      std::uint32_t* __restrict__ hist, unsigned long long* __restrict__ hist_sq,
                      std::uint32_t* __restrict__ cand, std::uint32_t cap, layer_sums* __restrict__ sums,
                      gain_request gains, double* __restrict__ gain_out, bool threshold_mode, float* __restrict__ copy,
                      block_slots slots) {
  (void)fused_pass_body(g, e, n, k, st, prev_threshold, hist, hist_sq, cand, cap, sums, gains, gain_out, threshold_mode,
                        copy, slots, whole_grid(slots.blocks_done));
}

}  // namespace gravac::detail
