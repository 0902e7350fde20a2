#pragma once
//! \file threshold_kernels.hpp
//! \brief The estimate of threshold_cuda, the device twin of threshold::estimate(): a
//! 4096-bin count histogram of |u| (the magnitude_histogram bins: exponent and 4 mantissa
//! bits) over the whole layer or over the same seeded sample runs, then the same boundary.
//! From the whole layer the low threshold is the boundary bin's lower edge; from a sample
//! it is the exact order statistic the host takes (the ceil(hits + 4 sqrt(hits) + 4)-th
//! largest finite sampled key), found by two more digits of a radix select over the
//! sample (estimate_refine). The low threshold key it writes is bit for bit the host's, so
//! the selection that follows is the host's too.

#include "gravac/cuda/detail/nvcc_flags.hpp"
// (first, and apart from the includes below: a missing compiler option is one readable error)

#include <cstdint>

#include "gravac/cuda/detail/cub_primitives.hpp"
#include "gravac/cuda/detail/select_kernels.hpp"

namespace gravac::detail {

//! Bits of the key dropped to form an estimate bin (magnitude_histogram::shift).
inline constexpr int estimate_shift = 19;
//! Bins of the estimate histogram (magnitude_histogram::bins).
inline constexpr int estimate_bins = 1 << (31 - estimate_shift);
//! The first bin of infinity and NaN (magnitude_histogram::first_non_finite_bin).
inline constexpr std::uint32_t estimate_first_non_finite_bin = non_finite_key >> estimate_shift;
//! The key that collects nothing (detail::no_guess).
inline constexpr std::uint32_t estimate_none = 0xffffffffu;

//! What the host derived for one layer's estimate (data-independent, as threshold::estimate).
struct estimate_request {
  unsigned long long n = 0;            //!< layer size
  unsigned long long k = 0;            //!< kept_count(n, fraction)
  int sampled = 0;                     //!< 0: histogram of the whole layer
  unsigned long long runs = 0;         //!< sampled: strata, one run each
  unsigned long long run = 0;          //!< sampled: run length
  unsigned long long stratum = 0;      //!< sampled: stratum size
  unsigned long long room = 1;         //!< sampled: stratum - run + 1
  unsigned long long seed = 0;         //!< sampled: mix_seed(seed, step, layer id)
  unsigned long long target_ceil = 0;  //!< sampled: ceil(hits + 4 sqrt(hits) + 4), the rank of the low threshold
};

//! Bits of the key below the estimate's second digit: the radix select over the sample
//! refines the boundary bin (key bits 30..19) by bits 18..9, then by bits 8..0.
inline constexpr int estimate_digit_shift = 9;

//! A sampled estimate's radix select between its kernels (device memory).
struct estimate_state {
  std::uint32_t blocks_done;  //!< last-block-done counter of the running estimate_refine
  std::uint32_t active;       //!< the sample's order statistic is still to be refined
  std::uint32_t prefix;       //!< the high bits of the wanted key determined so far
  std::uint32_t rank;         //!< its 1-based rank among the sampled finite keys that match the prefix
};

//! splitmix64's (n+1)-th output from \p seed (detail::splitmix64_nth).
__device__ __forceinline__ std::uint64_t splitmix64_nth_device(std::uint64_t seed, std::uint64_t n) {
  std::uint64_t z = seed + (n + 1) * 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

//! key(g + e) of the \p i-th value of the estimate: of the layer, or of the sample (run s
//! starts at s * stratum + splitmix64 draw s % room, as the host).
__device__ __forceinline__ std::uint32_t estimate_key(const float* __restrict__ g, const float* __restrict__ e,
                                                      const estimate_request& rq, unsigned long long i) {
  unsigned long long at = i;
  if (rq.sampled) {
    const unsigned long long s = i / rq.run;
    at = s * rq.stratum + splitmix64_nth_device(rq.seed, s) % rq.room + (i - s * rq.run);
  }
  return device_magnitude_key(__fadd_rn(g[at], e[at]));
}

//! Counts key(g + e) into \p hist (estimate_bins zeroed counters) over the whole layer or
//! over the sample, over the blocks of \p grid.
__device__ inline void estimate_histogram_body(const float* __restrict__ g, const float* __restrict__ e,
                                               const estimate_request& rq, std::uint32_t* __restrict__ hist,
                                               const pass_grid& grid) {
  __shared__ std::uint32_t sh[estimate_bins];
  for (int i = static_cast<int>(threadIdx.x); i < estimate_bins; i += select_threads) sh[i] = 0;
  __syncthreads();
  const unsigned long long total = rq.sampled ? rq.runs * rq.run : rq.n;
  const unsigned long long stride = grid.blocks * select_threads;
  for (unsigned long long i = grid.block * static_cast<unsigned long long>(select_threads) + threadIdx.x; i < total;
       i += stride)
    atomicAdd(&sh[estimate_key(g, e, rq, i) >> estimate_shift], 1u);
  __syncthreads();
  for (int i = static_cast<int>(threadIdx.x); i < estimate_bins; i += select_threads)
    if (sh[i]) atomicAdd(&hist[i], sh[i]);
}

//! estimate_histogram_body over the whole grid.
static __global__ void __launch_bounds__(select_threads)
    estimate_histogram(const float* __restrict__ g, const float* __restrict__ e, estimate_request rq,
                       std::uint32_t* __restrict__ hist) {
  estimate_histogram_body(g, e, rq, hist, whole_grid());
}

//! One block: the boundary bin of the histogram (threshold::estimate's last lines); zeroes
//! \p hist for the next pass. The whole layer's: its lower edge is the low threshold key,
//! into \p guess. The sample's: the rank of the low threshold inside that bin into \p st,
//! for estimate_refine (which writes \p guess). None: estimate_none into \p guess.
__device__ inline void estimate_threshold_body(std::uint32_t* __restrict__ hist, const estimate_request& rq,
                                               estimate_state* __restrict__ st, std::uint32_t* __restrict__ guess) {
  __shared__ std::uint32_t sh[estimate_bins];
  std::uint32_t mine = 0;
  for (int i = static_cast<int>(threadIdx.x); i < estimate_bins; i += select_threads) {
    // Infinity and NaN are not candidates: the host's boundary search starts below them.
    sh[i] = static_cast<std::uint32_t>(i) < estimate_first_non_finite_bin ? hist[i] : 0u;
    mine += sh[i];
    hist[i] = 0;
  }
  using reduce_t = block_reduce<std::uint32_t, select_threads>;
  __shared__ typename reduce_t::TempStorage red;
  __shared__ std::uint32_t finite_sh;
  const std::uint32_t finite = reduce_t(red).Sum(mine);
  if (threadIdx.x == 0) finite_sh = finite;
  __syncthreads();
  const std::uint32_t fin = finite_sh;
  const unsigned long long want_raw = rq.sampled ? rq.target_ceil : rq.k;
  const bool none = rq.k == 0 || fin == 0 || want_raw == 0;
  const auto want = static_cast<std::uint32_t>(want_raw < fin ? want_raw : fin);
  const boundary b = find_device_boundary(sh, estimate_bins, none ? 0u : want);  // block-wide
  if (threadIdx.x != 0) return;
  st->active = 0;
  if (none) {
    *guess = estimate_none;
    return;
  }
  if (!rq.sampled) {
    *guess = b.bin << estimate_shift;
    return;
  }
  // The want-th largest finite sampled key (the host's nth_element) lies in bin b.
  st->active = 1;
  st->prefix = b.bin;
  st->rank = want - b.above;
}

//! estimate_threshold_body in one block.
static __global__ void __launch_bounds__(select_threads)
    estimate_threshold(std::uint32_t* __restrict__ hist, estimate_request rq, estimate_state* __restrict__ st,
                       std::uint32_t* __restrict__ guess) {
  estimate_threshold_body(hist, rq, st, guess);
}

//! A sampled estimate's radix select, one digit (bits 18..9 with \p shift
//! estimate_digit_shift, then bits 8..0 with \p shift 0): the histogram of the digit over
//! the sampled keys that match the prefix; the last block extends the prefix, and after the
//! last digit writes the key (the exact order statistic) into \p guess.
__device__ inline void estimate_refine_body(const float* __restrict__ g, const float* __restrict__ e,
                                            const estimate_request& rq, std::uint32_t* __restrict__ hist,
                                            estimate_state* __restrict__ st, int shift,
                                            std::uint32_t* __restrict__ guess, const pass_grid& grid) {
  if (!st->active) return;
  constexpr int max_digit_bins = 1 << (estimate_shift - estimate_digit_shift);
  __shared__ std::uint32_t sh[max_digit_bins];
  const int high = shift == 0 ? estimate_digit_shift : estimate_shift;
  const int bins = 1 << (high - shift);
  for (int i = static_cast<int>(threadIdx.x); i < bins; i += select_threads) sh[i] = 0;
  __syncthreads();
  const std::uint32_t prefix = st->prefix;
  const unsigned long long total = rq.runs * rq.run;
  const unsigned long long stride = grid.blocks * select_threads;
  for (unsigned long long i = grid.block * static_cast<unsigned long long>(select_threads) + threadIdx.x; i < total;
       i += stride) {
    const std::uint32_t key = estimate_key(g, e, rq, i);
    if ((key >> high) == prefix) atomicAdd(&sh[(key >> shift) & static_cast<std::uint32_t>(bins - 1)], 1u);
  }
  __syncthreads();
  for (int i = static_cast<int>(threadIdx.x); i < bins; i += select_threads)
    if (sh[i]) atomicAdd(&hist[i], sh[i]);
  if (!last_block_of(&st->blocks_done, grid.blocks)) return;
  for (int i = static_cast<int>(threadIdx.x); i < bins; i += select_threads) {
    sh[i] = hist[i];
    hist[i] = 0;  // ready for the next pass
  }
  __syncthreads();
  const boundary b = find_device_boundary(sh, bins, st->rank);
  if (threadIdx.x != 0) return;
  st->prefix = (prefix << (high - shift)) | b.bin;
  st->rank -= b.above;
  if (shift == 0) {
    *guess = st->prefix;
    st->active = 0;
  }
}

//! estimate_refine_body over the whole grid.
static __global__ void __launch_bounds__(select_threads)
    estimate_refine(const float* __restrict__ g, const float* __restrict__ e, estimate_request rq,
                    std::uint32_t* __restrict__ hist, estimate_state* __restrict__ st, int shift,
                    std::uint32_t* __restrict__ guess) {
  estimate_refine_body(g, e, rq, hist, st, shift, guess, whole_grid());
}

}  // namespace gravac::detail
