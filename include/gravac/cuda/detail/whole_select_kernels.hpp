#pragma once
//! \file whole_select_kernels.hpp
//! \brief topk_cuda over the whole buffer (topk_cuda_options::whole_buffer): one exact
//! top-k over the concatenation of the compressed layers, as gravac::topk with whole_buffer.
//!
//! Each compressed layer's fused pass (k = 0: statistics, gain curve, u into e) also copies
//! its u into a concatenation buffer, in layout order; the radix select of
//! select_kernels.hpp then runs on that buffer as on one layer of M values (ties go to the
//! lower position in it: layers in layout order, each in index order, as the host's), and
//! the ordered compaction writes the selected positions into a list. Each layer then takes
//! its part of the sorted list (two binary searches), its segment is placed, and
//! gather_whole_pass writes its indices and values and zeroes e there. A layer whose gain
//! curve is sampled (over 2^19 values) takes its exact bins above the global threshold's, so
//! its pass leaves its bins for deferred_gain_curve, after the selection's first pass.

#include "gravac/cuda/detail/nvcc_flags.hpp"
// (first, and apart from the includes below: a missing compiler option is one readable error)

#include <cstddef>
#include <cstdint>

#include "gravac/cuda/detail/cub_primitives.hpp"
#include "gravac/cuda/detail/gain_bins.hpp"
#include "gravac/cuda/detail/gain_sample.hpp"
#include "gravac/cuda/detail/segment_cursor.hpp"
#include "gravac/cuda/detail/select_kernels.hpp"
#include "gravac/cuda/detail/square_sums.hpp"

namespace gravac::detail {

//! The gain curve of a layer whose fused pass deferred it (gain_request::defer): the
//! sample's bins below the whole selection's threshold's bin (\p whole's gain_from), its
//! exact \p hist and \p hist_sq above, added into \p out; then every bin zeroed for the next
//! step. One block.
static __global__ void __launch_bounds__(select_threads)
    deferred_gain_curve(std::uint32_t* hist, unsigned long long* hist_sq, gain_request gains, const select_state* whole,
                        double* out) {
  const unsigned long long total = curve_bins_from_sample(hist, hist_sq, gains, whole->gain_from);
  add_curve_of_bins(gains.sample_hist, gains.sample_sq, total, gains, out);
  __syncthreads();
  for (int i = static_cast<int>(threadIdx.x); i < max_bins; i += select_threads) {
    hist[i] = 0;
    hist_sq[i] = 0;
    gains.sample_hist[i] = 0;
    gains.sample_sq[i] = 0;
  }
}

//! The compaction's output of the whole-buffer selection: position j of the sorted list,
//! never past the count (a defence: the selection yields exactly the count).
struct whole_index_writer {
  std::uint32_t* list;     //!< the selected positions in the concatenation
  const select_state* st;  //!< the whole-buffer selection (its count)
  __device__ __forceinline__ void operator()(std::int64_t j, std::uint32_t position) const {
    if (j >= 0 && static_cast<unsigned long long>(j) < st->count) list[j] = position;
  }
};

//! First position in sorted \p a[0 .. n) not below \p x.
__device__ __forceinline__ unsigned long long lower_bound_u32(const std::uint32_t* a, unsigned long long n,
                                                              unsigned long long x) {
  unsigned long long lo = 0, hi = n;
  while (lo < hi) {
    const unsigned long long mid = lo + (hi - lo) / 2;
    if (a[mid] < x)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo;
}

//! One layer's part of the whole-buffer selection: the positions in [start, start + numel)
//! of the concatenation are list[first .. first + count); sets st->count and *first. One thread.
static __global__ void split_whole_selection(const std::uint32_t* __restrict__ list,
                                             const select_state* __restrict__ whole, unsigned long long start,
                                             unsigned long long numel, select_state* __restrict__ st,
                                             std::uint32_t* __restrict__ first) {
  if (blockIdx.x != 0 || threadIdx.x != 0) return;
  // Only the entries the compaction wrote (a short compaction is caught by gather_whole_pass).
  const unsigned long long n = whole->selected < whole->count ? whole->selected : whole->count;
  const unsigned long long lo = lower_bound_u32(list, n, start);
  const unsigned long long hi = lower_bound_u32(list, n, start + numel);
  st->count = static_cast<std::uint32_t>(hi - lo);
  *first = static_cast<std::uint32_t>(lo);
}

//! The threshold of the whole-buffer selection, remembered for the next step (0 is none).
static __global__ void remember_whole_threshold(const select_state* __restrict__ whole,
                                                std::uint32_t* __restrict__ prev_threshold) {
  if (blockIdx.x != 0 || threadIdx.x != 0) return;
  if (whole->done == 1) *prev_threshold = whole->threshold == 0 ? 1u : whole->threshold;
}

//! gather_pass for one layer of the whole-buffer selection: its indices (position - start)
//! and values into its placed segment, e = 0 there, the kept energy. When the compaction
//! did not select exactly the count, nothing is written and \p failure is set.
static __global__ void __launch_bounds__(select_threads)
    gather_whole_pass(std::byte* __restrict__ packet, const segment_slot* __restrict__ slot, float* __restrict__ e,
                      const std::uint32_t* __restrict__ list, const std::uint32_t* __restrict__ first,
                      std::uint32_t start, select_state* __restrict__ st, const select_state* __restrict__ whole,
                      layer_sums* __restrict__ sums, std::uint32_t* __restrict__ failure, block_slots slots) {
  const std::size_t k = st->count;
  const bool ok = slot->placed && slot->count == k && whole->selected == whole->count;
  auto* idx = reinterpret_cast<std::uint32_t*>(packet + slot->payload_at);
  auto* values = reinterpret_cast<float*>(packet + slot->payload_at + pad8(k * sizeof(std::uint32_t)));
  const std::uint32_t* mine = list + *first;
  // The kept energy: the values sent, in packet order, in the host's tree (square_sums.hpp).
  double* const out[1] = {&sums->kept_sq};
  square_sums_pass<1>(
      ok ? k : 0, whole_grid(slots.blocks_done), slots, out,
      [&](std::size_t j, bool in, float(&v)[1]) {
        if (!in) return;
        const std::uint32_t i = mine[j] - start;
        v[0] = e[i];
        idx[j] = i;
        values[j] = v[0];
        e[i] = 0.0f;
      },
      [&](std::size_t j, float(&v)[1]) { v[0] = values[j]; });
  if (threadIdx.x == 0) {
    if (blockIdx.x == 0) {
      if (!ok)
        atomicExch(failure, 1u);
      else
        st->gathered = 1;
    }
  }
}

}  // namespace gravac::detail
