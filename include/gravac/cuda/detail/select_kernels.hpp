#pragma once
//! \file select_kernels.hpp
//! \brief The fused error-feedback exact top-k: a radix select over the float bits of |u|.
//!
//! For one layer of n values and k to keep (see topk_cuda.hpp for the sequence):
//! 1. fused_pass: u = g + e, e = u, statistics, an 11-bit histogram of key(u) =
//!    bits(|u|) (bits 30..20) in shared memory, and a candidate buffer of the keys at or
//!    above the previous step's threshold widened by a margin. Its last block finds the
//!    boundary bin; when that bin holds exactly the remainder, the threshold is known
//!    (early exit).
//! 2. collect_pass: only when the previous threshold missed (first step, or a jump):
//!    one read of e collects the boundary bin's keys.
//! 3. refine_pass (twice, 10-bit digits): histograms of the next digit over the candidate
//!    buffer (the whole input only when the boundary bin overflows the buffer).
//! 4. tie_pass: only when the exact threshold key T has more copies than the remainder:
//!    finds the index of the last tie to keep, so ties go to the lower index.
//! 5. an ordered stream compaction (cub::DeviceSelect) writes the selected indices in
//!    ascending order straight into the packet, and gather_pass writes the values and
//!    zeroes e there (the residual update).
//! The selection equals the CPU top-k's bit for bit: |u| ordered by its float bits is the
//! order of |u|. Infinities and NaNs are never selected (as gravac::topk): they stay in the
//! residual, and a layer with fewer finite values than k sends all of its finite values
//! (k is then the finite count, as gravac::topk does). The segment is placed on the device
//! (segment_cursor.hpp) once the count is known, so such a layer never shifts the others.

#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>

#include <cstdint>

#include "gravac/cuda/detail/segment_cursor.hpp"

namespace gravac::detail {

//! Threads per block of every selection kernel.
inline constexpr int select_threads = 256;
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
//! Values per thread and round of the fused pass.
inline constexpr int fused_items = 4;
//! Elements per chunk of the ordered tie search.
inline constexpr int tie_items = 16;

//! The radix-select state of one layer in one step (device memory, reset every layer).
struct select_state {
  std::uint32_t blocks_done;   //!< last-block-done counter of the running kernel
  std::uint32_t done;          //!< the threshold T is determined
  std::uint32_t prefix;        //!< the high bits of T determined so far
  std::uint32_t remaining;     //!< values still to take among those that match the prefix
  std::uint32_t threshold;     //!< T: keep key > T, and key == T as the tie rule says
  std::uint32_t take_all_ties; //!< every key == T is kept
  std::uint32_t tie_needed;    //!< the tie pass must find tie_index
  std::uint32_t tie_index;     //!< keep key == T only at indices <= tie_index
  std::uint32_t cand_count;    //!< keys appended to the candidate buffer (may exceed its capacity)
  std::uint32_t cand_valid;    //!< the candidate buffer holds every key that matches the prefix
  std::uint32_t collect;       //!< collect_pass must gather the boundary bin
  std::uint32_t boundary_count;  //!< values in the first-digit boundary bin
  unsigned long long selected;   //!< written by the compaction: must equal k
  std::uint32_t non_finite;    //!< a NaN or infinity was seen in u
  std::uint32_t too_few_finite;  //!< fewer finite values than k: every finite value is sent
  std::uint32_t count;         //!< values this layer sends (k, or the finite count when fewer)
  std::uint32_t gathered;      //!< e was zeroed at the sent indices (restore_pass undoes it)
  std::uint32_t all_ties;      //!< threshold mode: every key equal to the k-th largest is sent
};

//! Statistics accumulated on the device for one layer.
struct layer_sums {
  double grad_sq;   //!< ||g||^2
  double input_sq;  //!< ||u||^2
  double kept_sq;   //!< ||sent||^2
};

//! Kernel parameters of the gain curve (the candidate k's of this layer).
struct gain_request {
  int count = 0;                                      //!< number of candidates
  unsigned long long k[max_gain_candidates] = {};     //!< k of each candidate for this layer
};

//! The sortable key of a float magnitude: its bits with the sign cleared.
__device__ __forceinline__ std::uint32_t device_magnitude_key(float u) {
  return __float_as_uint(u) & 0x7fffffffu;
}

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

//! True in exactly one thread of the grid: the thread 0 of the block that finishes last
//! (after all blocks' global writes are visible). Resets the counter for the next kernel.
__device__ __forceinline__ bool last_block(std::uint32_t* blocks_done) {
  __shared__ bool is_last;
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence();
    const std::uint32_t ticket = atomicAdd(blocks_done, 1u);
    is_last = ticket == gridDim.x - 1;
    if (is_last) *blocks_done = 0;
  }
  __syncthreads();
  if (is_last) __threadfence();
  return is_last;
}

//! Finds, in a histogram of \p bins counts (shared memory), the bin that holds the
//! \p want-th largest key: `bin`, the count strictly above it and its own count.
//! Block-wide (all threads call it); the result is in the returned shared struct.
struct boundary {
  std::uint32_t bin;    //!< the boundary bin
  std::uint32_t above;  //!< values in higher bins
  std::uint32_t count;  //!< values in the boundary bin
};
__device__ inline boundary find_device_boundary(const std::uint32_t* hist, int bins, std::uint32_t want) {
  using scan_t = cub::BlockScan<std::uint32_t, select_threads>;
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
static __global__ void __launch_bounds__(select_threads)
fused_pass(const float* __restrict__ g, float* __restrict__ e, std::size_t n, std::uint32_t k,
           select_state* __restrict__ st, const std::uint32_t* __restrict__ prev_threshold,
           std::uint32_t* __restrict__ hist, double* __restrict__ hist_sq, std::uint32_t* __restrict__ cand,
           std::uint32_t cap, layer_sums* __restrict__ sums, gain_request gains, double* __restrict__ gain_out,
           bool threshold_mode = false, float* __restrict__ copy = nullptr) {
  __shared__ std::uint32_t sh_hist[max_bins];
  __shared__ float sh_sq[max_bins];
  const bool want_sq = gains.count > 0;
  for (int i = static_cast<int>(threadIdx.x); i < max_bins; i += select_threads) {
    sh_hist[i] = 0;
    if (want_sq) sh_sq[i] = 0.0f;
  }
  __syncthreads();
  const std::uint32_t prev = *prev_threshold;  // top-k: 0 is no previous threshold
  const bool use_prev = threshold_mode ? prev < non_finite_key : prev != 0u;
  const std::uint32_t low = threshold_mode ? prev : (prev > candidate_margin ? prev - candidate_margin : 0u);
  double gsq = 0, usq = 0;
  bool bad = false;
  // Each thread handles fused_items values per round (loads first, for memory-level
  // parallelism); a warp's lanes stay converged for the warp-aggregated append.
  const std::size_t tile = static_cast<std::size_t>(select_threads) * fused_items;
  for (std::size_t base = blockIdx.x * tile + threadIdx.x; base - threadIdx.x < n; base += gridDim.x * tile) {
    float gv[fused_items], ev[fused_items];
#pragma unroll
    for (int j = 0; j < fused_items; ++j) {
      const std::size_t i = base + static_cast<std::size_t>(j) * select_threads;
      gv[j] = g && i < n ? g[i] : 0.0f;
      ev[j] = i < n ? e[i] : 0.0f;
    }
#pragma unroll
    for (int j = 0; j < fused_items; ++j) {
      const std::size_t i = base + static_cast<std::size_t>(j) * select_threads;
      const bool in = i < n;
      const float u = g ? gv[j] + ev[j] : ev[j];
      std::uint32_t key = 0;
      bool finite = false;
      if (in) {
        if (g) e[i] = u;
        if (copy) copy[i] = u;
        gsq += static_cast<double>(gv[j]) * gv[j];
        usq += static_cast<double>(u) * u;
        key = device_magnitude_key(u);
        finite = key < non_finite_key;
        bad |= !finite;
        if (finite) {  // NaN and infinity are never selected: they stay in the residual
          atomicAdd(&sh_hist[key >> 20], 1u);
          if (want_sq) atomicAdd(&sh_sq[key >> 20], u * u);
        }
      }
      if (use_prev) warp_append(finite && key >= low, key, cand, cap, &st->cand_count);
    }
  }
  using reduce_t = cub::BlockReduce<double, select_threads>;
  __shared__ typename reduce_t::TempStorage red;
  const double bg = reduce_t(red).Sum(gsq);
  __syncthreads();
  const double bu = reduce_t(red).Sum(usq);
  if (threadIdx.x == 0) {
    atomicAdd(&sums->grad_sq, bg);
    atomicAdd(&sums->input_sq, bu);
  }
  if (__syncthreads_or(bad) && threadIdx.x == 0) st->non_finite = 1;
  for (int i = static_cast<int>(threadIdx.x); i < max_bins; i += select_threads) {
    if (sh_hist[i]) {
      atomicAdd(&hist[i], sh_hist[i]);
      if (want_sq) atomicAdd(&hist_sq[i], static_cast<double>(sh_sq[i]));
    }
  }
  if (!last_block(&st->blocks_done)) return;

  // The last block: the histogram is complete.
  std::uint32_t mine = 0;
  for (int i = static_cast<int>(threadIdx.x); i < max_bins; i += select_threads) {
    sh_hist[i] = hist[i];
    mine += sh_hist[i];
    hist[i] = 0;  // ready for the next pass
  }
  // The finite count (the histogram holds finite keys only): k and the gain candidates'
  // k are at most that, as in gravac::topk and add_gain_curve.
  using count_reduce_t = cub::BlockReduce<std::uint32_t, select_threads>;
  __shared__ typename count_reduce_t::TempStorage count_red;
  __shared__ std::uint32_t finite_total;
  const std::uint32_t total = count_reduce_t(count_red).Sum(mine);
  if (threadIdx.x == 0) finite_total = total;
  __syncthreads();
  // Gain curve: for each candidate k, the energy of the bins above its boundary plus the
  // boundary bin's energy in proportion to the values taken from it.
  for (int c = 0; c < gains.count; ++c) {
    const auto kc = static_cast<std::uint32_t>(gains.k[c] < finite_total ? gains.k[c] : finite_total);
    const boundary bc = find_device_boundary(sh_hist, max_bins, kc);
    double part = 0;
    if (kc > 0)
      for (int b = static_cast<int>(bc.bin) + 1 + static_cast<int>(threadIdx.x); b < max_bins; b += select_threads)
        part += hist_sq[b];
    __syncthreads();
    const double above = reduce_t(red).Sum(part);
    if (threadIdx.x == 0 && kc > 0) {
      double s = above;
      if (bc.count) s += hist_sq[bc.bin] * (static_cast<double>(kc - bc.above) / bc.count);
      gain_out[c] += s;
    }
    __syncthreads();
  }
  if (want_sq) {
    __syncthreads();
    for (int i = static_cast<int>(threadIdx.x); i < max_bins; i += select_threads) hist_sq[i] = 0;
  }
  if (threshold_mode) {
    const std::uint32_t hits = st->cand_count;  // finite keys >= t (counted beyond the buffer too)
    if (k == 0 || !use_prev || hits == 0) {
      if (threadIdx.x == 0) {
        st->done = 2;  // nothing at or above the estimate
        st->count = 0;
      }
      return;
    }
    if (hits <= k) {  // the estimate erred high or was right: send every key >= t
      if (threadIdx.x == 0) {
        st->done = 1;
        st->threshold = prev;
        st->take_all_ties = 1;
        st->count = hits;
      }
      return;
    }
    if (threadIdx.x == 0) st->all_ties = 1;  // more than k: raise t to the k-th largest
  }
  if (k == 0 || finite_total == 0) {
    if (threadIdx.x == 0) {
      st->done = 2;  // nothing to select
      st->count = 0;
      st->too_few_finite = k > 0;
    }
    return;
  }
  if (finite_total <= k) {
    // Every finite value is sent (k is the finite count, as gravac::topk): keys >= 0 that
    // are finite, which the compaction's predicate takes with threshold 0 and all ties.
    if (threadIdx.x == 0) {
      st->done = 1;
      st->threshold = 0;
      st->take_all_ties = 1;
      st->count = finite_total;
      st->too_few_finite = finite_total < k;
    }
    return;
  }
  const boundary b = find_device_boundary(sh_hist, max_bins, k);
  if (threadIdx.x != 0) return;
  st->count = k;
  if (b.count == 0) {  // cannot happen (k < finite_total); nothing is selected, compress() fails
    st->done = 2;
    return;
  }
  st->prefix = b.bin;
  st->remaining = k - b.above;
  st->boundary_count = b.count;
  if (b.count == st->remaining) {  // early exit: the whole boundary bin is kept
    st->done = 1;
    st->threshold = b.bin << 20;
    st->take_all_ties = 1;
    return;
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
}

//! Pass 2 (only on a miss): collects the keys of the first-digit boundary bin.
static __global__ void __launch_bounds__(select_threads)
collect_pass(const float* __restrict__ e, std::size_t n, select_state* __restrict__ st,
             std::uint32_t* __restrict__ cand, std::uint32_t cap) {
  if (st->done || !st->collect) return;
  const std::uint32_t bin = st->prefix;
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * select_threads;
  const std::size_t n_round = (n + 31u) & ~std::size_t{31};
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(select_threads) + threadIdx.x; i < n_round; i += stride) {
    const bool in = i < n;
    const std::uint32_t key = in ? device_magnitude_key(e[i]) : 0u;
    warp_append(in && (key >> 20) == bin, key, cand, cap, &st->cand_count);
  }
  if (last_block(&st->blocks_done)) st->cand_valid = 1;
}

//! Passes 3 and 4: histogram of the digit at \p shift (10 bits) of the keys whose bits
//! above it equal the prefix, over the candidate buffer (or the whole input); the last
//! block extends the prefix and decides whether the tie pass is needed.
static __global__ void __launch_bounds__(select_threads)
refine_pass(const float* __restrict__ e, std::size_t n, select_state* __restrict__ st,
            const std::uint32_t* __restrict__ cand, std::uint32_t cap, std::uint32_t* __restrict__ hist, int shift) {
  if (st->done) return;
  constexpr int bins = 1 << refine_digit_bits;
  __shared__ std::uint32_t sh_hist[bins];
  for (int i = static_cast<int>(threadIdx.x); i < bins; i += select_threads) sh_hist[i] = 0;
  __syncthreads();
  const std::uint32_t prefix = st->prefix;
  const int high = shift + refine_digit_bits;
  const bool from_cand = st->cand_valid != 0;
  const std::size_t m = from_cand ? (st->cand_count < cap ? st->cand_count : cap) : n;
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * select_threads;
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(select_threads) + threadIdx.x; i < m; i += stride) {
    const std::uint32_t key = from_cand ? cand[i] : device_magnitude_key(e[i]);
    if ((key >> high) == prefix) atomicAdd(&sh_hist[(key >> shift) & (bins - 1u)], 1u);
  }
  __syncthreads();
  for (int i = static_cast<int>(threadIdx.x); i < bins; i += select_threads)
    if (sh_hist[i]) atomicAdd(&hist[i], sh_hist[i]);
  if (!last_block(&st->blocks_done)) return;
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
  } else if (shift == 0) {  // T is exact and has more copies than we may take
    st->done = 1;
    st->threshold = new_prefix;
    st->take_all_ties = 0;
    st->tie_needed = 1;
  }
}

//! Pass 5 (only with surplus ties at T): the index of the remaining-th key == T in index
//! order. Each chunk of select_threads * tie_items values is counted; the last block
//! finds the chunk holding that tie and scans it in order.
static __global__ void __launch_bounds__(select_threads)
tie_pass(const float* __restrict__ e, std::size_t n, select_state* __restrict__ st,
         std::uint32_t* __restrict__ chunk_counts) {
  if (!st->tie_needed) return;
  constexpr std::size_t chunk = static_cast<std::size_t>(select_threads) * tie_items;
  const std::uint32_t t = st->threshold;
  const std::size_t chunks = (n + chunk - 1) / chunk;
  using reduce_t = cub::BlockReduce<std::uint32_t, select_threads>;
  using scan_t = cub::BlockScan<std::uint32_t, select_threads>;
  __shared__ typename reduce_t::TempStorage red;
  __shared__ typename scan_t::TempStorage scan;
  for (std::size_t c = blockIdx.x; c < chunks; c += gridDim.x) {
    std::uint32_t cnt = 0;
    const std::size_t end = (c + 1) * chunk < n ? (c + 1) * chunk : n;
    for (std::size_t i = c * chunk + threadIdx.x; i < end; i += select_threads)
      cnt += device_magnitude_key(e[i]) == t;
    const std::uint32_t total = reduce_t(red).Sum(cnt);
    if (threadIdx.x == 0) chunk_counts[c] = total;
    __syncthreads();
  }
  if (!last_block(&st->blocks_done)) return;
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

//! The predicate of the ordered compaction: index i is selected.
struct selected_by_threshold {
  const float* u;            //!< u (held in e after the fused pass)
  const select_state* st;    //!< the resolved threshold
  __device__ __forceinline__ bool operator()(std::uint32_t i) const {
    const std::uint32_t key = device_magnitude_key(u[i]);
    const std::uint32_t t = st->threshold;
    return st->done == 1 && key < non_finite_key &&
           (key > t || (key == t && (st->take_all_ties || i <= st->tie_index)));
  }
};

//! The compaction's output: writes the j-th selected index into the layer's placed
//! segment, never past its count (a defence: the selection yields exactly the count, and
//! gather_pass checks it).
struct bounded_index_writer {
  std::byte* packet;         //!< the packet
  const segment_slot* slot;  //!< the layer's placed segment (payload offset and count)
  __device__ __forceinline__ void operator()(std::int64_t j, std::uint32_t index) const {
    if (j >= 0 && static_cast<unsigned long long>(j) < slot->count)
      reinterpret_cast<std::uint32_t*>(packet + slot->payload_at)[j] = index;
  }
};

//! Pass 6: values of the selected indices into the packet, e = 0 there (the residual
//! update), the kept energy, and the threshold remembered for the next step. When the
//! compaction did not select exactly the count (a defect), nothing is zeroed and
//! \p failure is set: compress() then restores every layer and throws.
static __global__ void __launch_bounds__(select_threads)
gather_pass(std::byte* __restrict__ packet, const segment_slot* __restrict__ slot, float* __restrict__ e,
            select_state* __restrict__ st, std::uint32_t* __restrict__ prev_threshold, layer_sums* __restrict__ sums,
            std::uint32_t* __restrict__ failure) {
  double ksq = 0;
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * select_threads;
  const std::size_t k = st->count;
  const bool ok = slot->placed && slot->count == k && st->selected == k;
  const auto* idx = reinterpret_cast<const std::uint32_t*>(packet + slot->payload_at);
  auto* values = reinterpret_cast<float*>(packet + slot->payload_at + pad8(k * sizeof(std::uint32_t)));
  if (ok) {
    for (std::size_t j = blockIdx.x * static_cast<std::size_t>(select_threads) + threadIdx.x; j < k; j += stride) {
      const std::uint32_t i = idx[j];
      const float v = e[i];
      values[j] = v;
      e[i] = 0.0f;
      ksq += static_cast<double>(v) * v;
    }
  }
  using reduce_t = cub::BlockReduce<double, select_threads>;
  __shared__ typename reduce_t::TempStorage red;
  const double s = reduce_t(red).Sum(ksq);
  if (threadIdx.x == 0) {
    if (s != 0.0) atomicAdd(&sums->kept_sq, s);
    if (blockIdx.x == 0) {
      if (!ok) atomicExch(failure, 1u);
      else st->gathered = 1;
      // 0 means "none"; a layer that sent nothing keeps its previous threshold.
      if (st->done == 1) *prev_threshold = st->threshold == 0 ? 1u : st->threshold;
    }
  }
}

//! u = g + e written raw into the layer's placed segment, e = 0, statistics (a layer sent
//! dense).
static __global__ void __launch_bounds__(select_threads)
raw_pass(const float* __restrict__ g, float* __restrict__ e, std::byte* __restrict__ packet,
         const segment_slot* __restrict__ slot, std::size_t n, layer_sums* __restrict__ sums,
         select_state* __restrict__ st, bool u_in_e) {
  float* out = reinterpret_cast<float*>(packet + slot->payload_at);
  double gsq = 0, usq = 0;
  bool bad = false;
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * select_threads;
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(select_threads) + threadIdx.x; i < n; i += stride) {
    const float gi = g[i];
    const float u = u_in_e ? e[i] : gi + e[i];  // u_in_e: the fused pass already wrote u
    out[i] = u;
    e[i] = 0.0f;
    gsq += static_cast<double>(gi) * gi;
    usq += static_cast<double>(u) * u;
    bad |= !isfinite(u);
  }
  using reduce_t = cub::BlockReduce<double, select_threads>;
  __shared__ typename reduce_t::TempStorage red;
  const double bg = reduce_t(red).Sum(gsq);
  __syncthreads();
  const double bu = reduce_t(red).Sum(usq);
  if (threadIdx.x == 0) {
    atomicAdd(&sums->grad_sq, bg);
    atomicAdd(&sums->input_sq, bu);
    atomicAdd(&sums->kept_sq, bu);
  }
  if (__syncthreads_or(bad) && threadIdx.x == 0) st->non_finite = 1;
  if (blockIdx.x == 0 && threadIdx.x == 0) {
    st->count = static_cast<std::uint32_t>(n);
    st->gathered = 1;
  }
}

//! Undoes the residual update of every layer that was gathered: e = the value sent, at
//! each sent index (e there is 0, so this restores u exactly). Raw layers restore every
//! element. Slot y of the grid takes layers y, y + gridDim.y, ... Used only when compress()
//! fails after some layers were updated, so that e = u = g + e_old: nothing sent, nothing lost.
static __global__ void __launch_bounds__(select_threads)
restore_pass(const std::byte* __restrict__ packet, const segment_slot* __restrict__ slots,
             const select_state* __restrict__ states, const std::uint64_t* __restrict__ offsets,
             std::uint32_t layers, float* __restrict__ e) {
  for (std::uint32_t l = blockIdx.y; l < layers; l += gridDim.y) {
    if (!states[l].gathered || !slots[l].placed) continue;
    const std::size_t k = slots[l].count;
    float* el = e + offsets[l];
    const std::byte* payload = packet + slots[l].payload_at;
    const std::size_t stride = static_cast<std::size_t>(gridDim.x) * select_threads;
    const std::size_t first = blockIdx.x * static_cast<std::size_t>(select_threads) + threadIdx.x;
    if (slots[l].raw) {
      const auto* v = reinterpret_cast<const float*>(payload);
      for (std::size_t j = first; j < k; j += stride) el[j] = v[j];
    } else {
      const auto* idx = reinterpret_cast<const std::uint32_t*>(payload);
      const auto* v = reinterpret_cast<const float*>(payload + pad8(k * sizeof(std::uint32_t)));
      for (std::size_t j = first; j < k; j += stride) el[idx[j]] = v[j];
    }
  }
}

}  // namespace gravac::detail
