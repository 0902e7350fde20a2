#pragma once
//! \file
//! \brief Statistics that repeat bit for bit on the device: each block's partial sums go to
//! the block's own slot, and the last block of the group adds the slots in block order. A
//! floating-point atomic per block would add them in the order the blocks happen to finish,
//! so the same step could give different norms, and different policy decisions, run to run.

#include "gravac/cuda/detail/nvcc_flags.hpp"
// (first, and apart from the includes below: a missing compiler option is one readable error)

#include <cstddef>
#include <cstdint>

#include "gravac/cuda/detail/cub_primitives.hpp"
#include "gravac/cuda/detail/launch_config.hpp"
#include "gravac/cuda/detail/select_common.hpp"
#include "gravac/cuda/device_buffer.hpp"

namespace gravac::detail {

//! Most statistics one kernel sums per group (||g||^2, ||u||^2, the kept energy).
inline constexpr int max_ordered_sums = 3;

//! Device memory for the per-block partials of one kernel at a time (the kernels of a
//! compressor run in stream order, so one set serves them all).
struct block_slots {
  double* slots = nullptr;               //!< max_ordered_sums * capacity: sum v of block b at v * capacity + b
  unsigned long long capacity = 0;       //!< blocks a grid may have
  std::uint32_t* blocks_done = nullptr;  //!< counts the blocks of a whole-grid group (zero between kernels)
};

//! Owns the block_slots of a compressor.
class block_slots_buffer {
 public:
  block_slots_buffer() = default;
  //! Slots for grids of up to \p blocks blocks, allocated on stream \p s.
  block_slots_buffer(unsigned long long blocks, stream_ref s)
      : blocks_(blocks), buf_(static_cast<std::size_t>(max_ordered_sums * blocks), s), done_(1, s) {}
  //! What the kernels take.
  [[nodiscard]] block_slots view() noexcept { return {buf_.data(), blocks_, done_.data()}; }

 private:
  unsigned long long blocks_ = 0;
  device_buffer<double> buf_;
  device_buffer<std::uint32_t> done_;  // zero-filled
};

//! Adds the \p N sums \p mine (valid in thread 0) of each block of a group into \p out (a
//! null pointer: that sum is not kept), in block order: the group is the \p count blocks from \p first of the grid, and
//! \p blocks_done (zero on entry, left zero) counts them. Every thread of every block of the
//! group calls it. A group of one block adds directly. The last block's threads each add a
//! fixed stride of slots in order, then a block reduction (a fixed tree) joins them: the
//! result depends on the group's partials only, never on which block finished when.
template <int Threads, int N>
__device__ void add_in_block_order(const double (&mine)[N], block_slots slots, std::uint32_t* blocks_done,
                                   unsigned long long first, unsigned long long count, double* const (&out)[N]) {
  static_assert(N >= 1 && N <= max_ordered_sums);
  if (count == 1) {
    if (threadIdx.x == 0)
      for (int v = 0; v < N; ++v)
        if (out[v]) *out[v] = __dadd_rn(*out[v], mine[v]);
    return;
  }
  const unsigned long long b = blockIdx.x - first;
  if (threadIdx.x == 0)
    for (int v = 0; v < N; ++v) slots.slots[v * slots.capacity + first + b] = mine[v];
  if (!last_block_of(blocks_done, count)) return;
  using reduce_t = block_reduce<double, Threads>;
  __shared__ typename reduce_t::TempStorage red;
  for (int v = 0; v < N; ++v) {
    if (!out[v]) continue;  // the same in every thread
    const double* from = slots.slots + v * slots.capacity + first;
    double part = 0;
    for (unsigned long long j = threadIdx.x; j < count; j += Threads) part = __dadd_rn(part, __ldcg(from + j));
    const double total = reduce_t(red).Sum(part);
    if (threadIdx.x == 0) *out[v] = __dadd_rn(*out[v], total);
    __syncthreads();  // red is reused
  }
}

//! add_in_block_order over the whole grid, counted by the slots' own counter.
template <int Threads, int N>
__device__ void add_in_block_order(const double (&mine)[N], block_slots slots, double* const (&out)[N]) {
  add_in_block_order<Threads, N>(mine, slots, slots.blocks_done, 0, gridDim.x, out);
}

}  // namespace gravac::detail
