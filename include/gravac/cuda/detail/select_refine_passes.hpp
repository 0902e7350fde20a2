#pragma once
//! \file
//! \brief Passes 2 to 5 of the device radix select: collecting the boundary bin after a miss, refining the threshold
//! digit by digit, and resolving ties to the lower index.

#include "gravac/cuda/detail/nvcc_flags.hpp"
// (first, and apart from the includes below: a missing compiler option is one readable error)

#include <cstdint>

#include "gravac/cuda/detail/cub_primitives.hpp"
#include "gravac/cuda/detail/select_common.hpp"

namespace gravac::detail {

//! Pass 2 (only on a miss): collects the keys of the first-digit boundary bin, over the
//! blocks of \p grid (the whole grid, or one layer's share of a grid over many).
__device__ inline void collect_body(const float* __restrict__ e, std::size_t n, select_state* __restrict__ st,
                                    std::uint32_t* __restrict__ cand, std::uint32_t cap, const pass_grid& grid) {
  if (st->done || !st->collect) return;
  const std::uint32_t bin = st->prefix;
  const std::size_t stride = static_cast<std::size_t>(grid.blocks) * select_threads;
  const std::size_t n_round = (n + 31u) & ~std::size_t{31};
  for (std::size_t i = grid.block * static_cast<std::size_t>(select_threads) + threadIdx.x; i < n_round; i += stride) {
    const bool in = i < n;
    const std::uint32_t key = in ? device_magnitude_key(e[i]) : 0u;
    warp_append(in && (key >> 20) == bin, key, cand, cap, &st->cand_count);
  }
  // One thread writes the flag: every thread of the last block writing it is a race (of
  // equal values, but a race all the same under CUDA's memory model).
  if (last_block_of(&st->blocks_done, grid.blocks) && threadIdx.x == 0) st->cand_valid = 1;
}

//! Pass 2 over one layer (the whole grid): collect_body.
static __global__ void __launch_bounds__(select_threads)
    collect_pass(const float* __restrict__ e, std::size_t n, select_state* __restrict__ st,
                 std::uint32_t* __restrict__ cand, std::uint32_t cap) {
  collect_body(e, n, st, cand, cap, whole_grid());
}

//! Passes 3 and 4: histogram of the digit at \p shift (10 bits) of the keys whose bits
//! above it equal the prefix, over the candidate buffer (or the whole input); the last
//! block of \p grid extends the prefix and decides whether the tie pass is needed.
__device__ inline void refine_body(const float* __restrict__ e, std::size_t n, select_state* __restrict__ st,
                                   const std::uint32_t* __restrict__ cand, std::uint32_t cap,
                                   std::uint32_t* __restrict__ hist, int shift, const pass_grid& grid) {
  if (st->done) return;
  constexpr int bins = 1 << refine_digit_bits;
  __shared__ std::uint32_t sh_hist[bins];
  for (int i = static_cast<int>(threadIdx.x); i < bins; i += select_threads) sh_hist[i] = 0;
  __syncthreads();
  const std::uint32_t prefix = st->prefix;
  const int high = shift + refine_digit_bits;
  const bool from_cand = st->cand_valid != 0;
  const std::size_t m = from_cand ? (st->cand_count < cap ? st->cand_count : cap) : n;
  const std::size_t stride = static_cast<std::size_t>(grid.blocks) * select_threads;
  for (std::size_t i = grid.block * static_cast<std::size_t>(select_threads) + threadIdx.x; i < m; i += stride) {
    const std::uint32_t key = from_cand ? cand[i] : device_magnitude_key(e[i]);
    if ((key >> high) == prefix) atomicAdd(&sh_hist[(key >> shift) & (bins - 1u)], 1u);
  }
  __syncthreads();
  for (int i = static_cast<int>(threadIdx.x); i < bins; i += select_threads)
    if (sh_hist[i]) atomicAdd(&hist[i], sh_hist[i]);
  if (!last_block_of(&st->blocks_done, grid.blocks)) return;
  for (int i = static_cast<int>(threadIdx.x); i < bins; i += select_threads) {
    sh_hist[i] = hist[i];
    hist[i] = 0;
  }
  __syncthreads();
  const boundary b = find_device_boundary(sh_hist, bins, st->remaining);
  if (threadIdx.x != 0) return;
  const std::uint32_t new_prefix = (prefix << refine_digit_bits) | b.bin;
  st->prefix = new_prefix;
  st->remaining -= b.above;
  if (b.count == st->remaining) {
    st->done = 1;
    st->threshold = new_prefix << shift;
    st->take_all_ties = 1;
  } else if (shift == 0 && st->all_ties) {  // threshold mode: every key == T goes too
    st->done = 1;
    st->threshold = new_prefix;
    st->take_all_ties = 1;
    st->count = st->count - st->remaining + b.count;  // (keys > T) + (keys == T)
  } else if (shift == 0) {                            // T is exact and has more copies than we may take
    st->done = 1;
    st->threshold = new_prefix;
    st->take_all_ties = 0;
    st->tie_needed = 1;
  }
}

//! Passes 3 and 4 over one layer (the whole grid): refine_body.
static __global__ void __launch_bounds__(select_threads)
    refine_pass(const float* __restrict__ e, std::size_t n, select_state* __restrict__ st,
                const std::uint32_t* __restrict__ cand, std::uint32_t cap, std::uint32_t* __restrict__ hist,
                int shift) {
  refine_body(e, n, st, cand, cap, hist, shift, whole_grid());
}

//! Pass 5 (only with surplus ties at T): the index of the remaining-th key == T in index
//! order. Each chunk of select_threads * tie_items values is counted; the last block
//! of \p grid finds the chunk holding that tie and scans it in order.
__device__ inline void tie_body(const float* __restrict__ e, std::size_t n, select_state* __restrict__ st,
                                std::uint32_t* __restrict__ chunk_counts, const pass_grid& grid) {
  if (!st->tie_needed) return;
  constexpr std::size_t chunk = static_cast<std::size_t>(select_threads) * tie_items;
  const std::uint32_t t = st->threshold;
  const std::size_t chunks = (n + chunk - 1) / chunk;
  using reduce_t = block_reduce<std::uint32_t, select_threads>;
  using scan_t = block_scan<std::uint32_t, select_threads>;
  __shared__ typename reduce_t::TempStorage red;
  __shared__ typename scan_t::TempStorage scan;
  for (std::size_t c = grid.block; c < chunks; c += grid.blocks) {
    std::uint32_t cnt = 0;
    const std::size_t end = (c + 1) * chunk < n ? (c + 1) * chunk : n;
    for (std::size_t i = c * chunk + threadIdx.x; i < end; i += select_threads) cnt += device_magnitude_key(e[i]) == t;
    const std::uint32_t total = reduce_t(red).Sum(cnt);
    if (threadIdx.x == 0) chunk_counts[c] = total;
    __syncthreads();
  }
  if (!last_block_of(&st->blocks_done, grid.blocks)) return;
  // Find the chunk holding the remaining-th tie (chunks in order, select_threads at a time).
  __shared__ std::uint32_t target_chunk, target_rank;
  const std::uint32_t want = st->remaining;
  std::uint32_t base = 0;
  if (threadIdx.x == 0) target_chunk = 0xffffffffu;
  __syncthreads();
  for (std::size_t c0 = 0; c0 < chunks; c0 += select_threads) {
    const std::size_t c = c0 + threadIdx.x;
    const std::uint32_t mine = c < chunks ? chunk_counts[c] : 0u;
    std::uint32_t before = 0, total = 0;
    scan_t(scan).ExclusiveSum(mine, before, total);
    if (base + before < want && base + before + mine >= want) {
      target_chunk = static_cast<std::uint32_t>(c);
      target_rank = want - (base + before);  // 1-based rank inside the chunk
    }
    base += total;
    __syncthreads();
    if (target_chunk != 0xffffffffu) break;
  }
  if (target_chunk == 0xffffffffu) return;  // cannot happen: the histogram counted them
  // Scan the chunk in order: thread j owns tie_items consecutive values.
  const std::size_t start = static_cast<std::size_t>(target_chunk) * chunk + threadIdx.x * tie_items;
  std::uint32_t mine = 0;
  for (int j = 0; j < tie_items; ++j) mine += (start + j < n) && device_magnitude_key(e[start + j]) == t;
  std::uint32_t before = 0;
  scan_t(scan).ExclusiveSum(mine, before);
  if (before < target_rank && before + mine >= target_rank) {
    std::uint32_t seen = before;
    for (int j = 0; j < tie_items; ++j) {
      if (start + j < n && device_magnitude_key(e[start + j]) == t && ++seen == target_rank) {
        st->tie_index = static_cast<std::uint32_t>(start + j);
        break;
      }
    }
  }
}

//! Pass 5 over one layer (the whole grid): tie_body.
static __global__ void __launch_bounds__(select_threads)
    tie_pass(const float* __restrict__ e, std::size_t n, select_state* __restrict__ st,
             std::uint32_t* __restrict__ chunk_counts) {
  tie_body(e, n, st, chunk_counts, whole_grid());
}

}  // namespace gravac::detail
