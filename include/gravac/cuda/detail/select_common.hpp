#pragma once
//! \file
//! \brief What every pass of the device radix select shares: its constants, the per-layer select state and statistics,
//! the key of a magnitude, warp-aggregated appends, the last-block test and the block-wide boundary search.

#include "gravac/cuda/detail/nvcc_flags.hpp"
// (first, and apart from the includes below: a missing compiler option is one readable error)

#include <cstdint>

#include "gravac/cuda/detail/cub_primitives.hpp"
#include "gravac/cuda/detail/launch_config.hpp"
#include "gravac/cuda/detail/segment_cursor.hpp"

namespace gravac::detail {

//! Bits of the first digit (bits 30..20 of the key).
inline constexpr int first_digit_bits = 11;
//! Bits of the second and third digits (19..10 and 9..0).
inline constexpr int refine_digit_bits = 10;
//! Bins of the largest histogram.
inline constexpr int max_bins = 1 << first_digit_bits;
//! Most gain candidates computed in the fused pass.
inline constexpr int max_gain_candidates = 32;
//! How far below the previous threshold the candidate buffer starts (in key units: two
//! first-digit bins, a quarter octave of |u|).
inline constexpr std::uint32_t candidate_margin = 2u << 20;
//! Keys at or above this are infinity or NaN.
inline constexpr std::uint32_t non_finite_key = 0x7f800000u;

//! The radix-select state of one layer in one step (device memory, reset every layer).
struct select_state {
  std::uint32_t blocks_done;     //!< last-block-done counter of the running kernel
  std::uint32_t done;            //!< the threshold T is determined
  std::uint32_t prefix;          //!< the high bits of T determined so far
  std::uint32_t remaining;       //!< values still to take among those that match the prefix
  std::uint32_t threshold;       //!< T: keep key > T, and key == T as the tie rule says
  std::uint32_t take_all_ties;   //!< every key == T is kept
  std::uint32_t tie_needed;      //!< the tie pass must find tie_index
  std::uint32_t tie_index;       //!< keep key == T only at indices <= tie_index
  std::uint32_t cand_count;      //!< keys appended to the candidate buffer (may exceed its capacity)
  std::uint32_t cand_valid;      //!< the candidate buffer holds every key that matches the prefix
  std::uint32_t collect;         //!< collect_pass must gather the boundary bin
  std::uint32_t boundary_count;  //!< values in the first-digit boundary bin
  unsigned long long selected;   //!< written by the compaction: must equal k
  std::uint32_t non_finite;      //!< a NaN or infinity was seen in u
  std::uint32_t too_few_finite;  //!< fewer finite values than k: every finite value is sent
  std::uint32_t count;           //!< values this layer sends (k, or the finite count when fewer)
  std::uint32_t gathered;        //!< e was zeroed at the sent indices (restore_pass undoes it)
  std::uint32_t all_ties;        //!< threshold mode: every key equal to the k-th largest is sent
  //! Top-k: the first gain bin above the sending threshold's (exact_gain_from; gain_bins when
  //! nothing is sent), for the curves that wait for the selection (gain_request::defer).
  std::uint32_t gain_from;
};

//! Statistics accumulated on the device for one layer.
struct layer_sums {
  double grad_sq;   //!< ||g||^2
  double input_sq;  //!< ||u||^2
  double kept_sq;   //!< ||sent||^2
};

//! The blocks a pass strides over: the whole grid (one launch per layer), or one layer's
//! share of a grid that covers many layers (the job tables of fused_jobs_pass and
//! select_jobs).
struct pass_grid {
  unsigned long long block;   //!< this block's index among them
  unsigned long long blocks;  //!< how many there are
  unsigned long long first;   //!< the first of them in the grid (their statistics slots start there)
  std::uint32_t* sums_done;   //!< counts them for the statistics (add_in_block_order; may be null without)
};

//! The whole grid as one pass_grid, counted for the statistics by \p sums_done.
__device__ __forceinline__ pass_grid whole_grid(std::uint32_t* sums_done = nullptr) {
  return {blockIdx.x, gridDim.x, 0, sums_done};
}

//! Kernel parameters of the gain curve (the candidate k's of this layer). A layer the host
//! samples (stride above 1: gain_sampling.hpp) has its sampled blocks histogrammed apart, in
//! sample_hist and sample_sq (max_bins each, zero before and after the pass).
struct gain_request {
  int count = 0;                                   //!< number of candidates
  unsigned long long k[max_gain_candidates] = {};  //!< k of each candidate for this layer
  std::uint32_t stride = 1;                        //!< one block of the layer in this many is sampled
  std::uint32_t phase = 0;                         //!< which one (below stride)
  std::uint32_t* sample_hist = nullptr;            //!< the sample's counts per bin (stride above 1)
  unsigned long long* sample_sq = nullptr;         //!< the sample's energies per bin (stride above 1)
  //! The curve waits for another selection's threshold (whole-buffer top-k): the pass leaves
  //! its histogram, energies and sample in place for deferred_gain_curve.
  bool defer = false;
};

//! The sortable key of a float magnitude: its bits with the sign cleared.
__device__ __forceinline__ std::uint32_t device_magnitude_key(float u) { return __float_as_uint(u) & 0x7fffffffu; }

//! Appends \p key to \p buf when \p pred holds, one atomic per warp (warp-aggregated).
__device__ __forceinline__ void warp_append(bool pred, std::uint32_t key, std::uint32_t* buf, std::uint32_t cap,
                                            std::uint32_t* count) {
  const unsigned active = __activemask();
  const unsigned want = __ballot_sync(active, pred);
  if (!want) return;
  const int lane = static_cast<int>(threadIdx.x & 31u);
  const int leader = __ffs(want) - 1;
  std::uint32_t base = 0;
  if (lane == leader) base = atomicAdd(count, static_cast<std::uint32_t>(__popc(want)));
  base = __shfl_sync(active, base, leader);
  if (pred) {
    const std::uint32_t pos = base + static_cast<std::uint32_t>(__popc(want & ((1u << lane) - 1u)));
    if (pos < cap) buf[pos] = key;
  }
}

//! True in every thread of the block that finishes last among the \p blocks blocks that
//! count on \p blocks_done (after all their global writes are visible), false in the
//! others. Resets the counter for the next kernel.
__device__ __forceinline__ bool last_block_of(std::uint32_t* blocks_done, unsigned long long blocks) {
  __shared__ bool is_last;
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence();
    const std::uint32_t ticket = atomicAdd(blocks_done, 1u);
    is_last = ticket == blocks - 1;
    // Reset atomically: the other blocks' tickets are atomics that nothing orders before a
    // plain store here (a race under CUDA's memory model, reported by the race detector).
    if (is_last) atomicExch(blocks_done, 0u);
  }
  __syncthreads();
  if (is_last) __threadfence();
  return is_last;
}

//! last_block_of over the whole grid: true in the block of the grid that finishes last.
__device__ __forceinline__ bool last_block(std::uint32_t* blocks_done) { return last_block_of(blocks_done, gridDim.x); }

//! Finds, in a histogram of \p bins counts (shared memory), the bin that holds the
//! \p want-th largest key: `bin`, the count strictly above it and its own count.
//! Block-wide (all threads call it); the result is in the returned shared struct.
struct boundary {
  std::uint32_t bin;    //!< the boundary bin
  std::uint32_t above;  //!< values in higher bins
  std::uint32_t count;  //!< values in the boundary bin
};
__device__ inline boundary find_device_boundary(const std::uint32_t* hist, int bins, std::uint32_t want) {
  using scan_t = block_scan<std::uint32_t, select_threads>;
  __shared__ typename scan_t::TempStorage tmp;
  __shared__ boundary result;
  const int per = (bins + select_threads - 1) / select_threads;
  __syncthreads();  // a previous call's result may still be read
  // Thread t owns bins counted from the top: [top - t*per, top - (t+1)*per).
  std::uint32_t mine = 0;
  for (int j = 0; j < per; ++j) {
    const int b = bins - 1 - (static_cast<int>(threadIdx.x) * per + j);
    if (b >= 0) mine += hist[b];
  }
  std::uint32_t before = 0;
  scan_t(tmp).ExclusiveSum(mine, before);
  if (threadIdx.x == 0) result = {0, 0, 0};
  __syncthreads();
  if (want > 0 && before < want && before + mine >= want) {
    std::uint32_t acc = before;
    for (int j = 0; j < per; ++j) {
      const int b = bins - 1 - (static_cast<int>(threadIdx.x) * per + j);
      if (b < 0) break;
      if (acc + hist[b] >= want) {
        result = {static_cast<std::uint32_t>(b), acc, hist[b]};
        break;
      }
      acc += hist[b];
    }
  }
  __syncthreads();
  return result;
}

}  // namespace gravac::detail
