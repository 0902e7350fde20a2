#pragma once
//! \file
//! \brief Sums of squares on the device in the one order the host uses too
//! (core/detail/square_sum.hpp): 256-value leaves in eight float lanes, then an aligned
//! binary tree over the leaves. The bits depend on the values only: not on the grid, the
//! order the blocks run in, or the GPU's multiprocessor count, and they equal the host
//! compressors'.
//!
//! A pass visits its positions through square_sums_pass: a tile is 32 leaves, one per eight
//! threads of a 256-thread block (thread t: leaf t / 8, lane t % 8, positions 8j + lane);
//! block b of a group takes an aligned run of G tiles, G a power of two, so each block's sum
//! is a subtree; the group's last block adds the blocks' sums in the tree's order.

#include "gravac/cuda/detail/nvcc_flags.hpp"
// (first, and apart from the includes below: a missing compiler option is one readable error)

#include <cstddef>
#include <cstdint>

#include "gravac/core/detail/square_sum.hpp"
#include "gravac/cuda/detail/launch_config.hpp"
#include "gravac/cuda/detail/ordered_sums.hpp"
#include "gravac/cuda/detail/select_common.hpp"

namespace gravac::detail {

//! Leaves per tile: one per eight threads of a select_threads block.
inline constexpr int square_tile_leaves = select_threads / static_cast<int>(square_sum_lanes);
//! Values per tile (what a block visits per round; grids are sized by it).
inline constexpr int square_tile = square_tile_leaves * static_cast<int>(square_sum_leaf);
static_assert(square_tile_leaves == 32, "a tile's leaves are one warp's lanes in the tile tree");

//! The aligned tree over a stream of tile sums in one thread (pairwise_sum's binary counter).
//! Trivial, for shared memory: the owner sets count to zero first.
template <int N>
struct device_pairwise {
  double level[N][48];
  unsigned long long count;

  __device__ void push(double (&v)[N]) {
    int l = 0;
    for (unsigned long long c = count; c & 1ull; c >>= 1, ++l)
      for (int q = 0; q < N; ++q) v[q] = __dadd_rn(level[q][l], v[q]);
    for (int q = 0; q < N; ++q) level[q][l] = v[q];
    ++count;
  }
  //! The root over what was pushed (zero when nothing was): the partial trees from the
  //! smallest up, each the left part of what follows.
  __device__ void total(double (&out)[N]) const {
    bool any = false;
    for (int q = 0; q < N; ++q) out[q] = 0;
    for (int l = 0; l < 48; ++l) {
      if (((count >> l) & 1ull) == 0) continue;
      for (int q = 0; q < N; ++q) out[q] = any ? __dadd_rn(level[q][l], out[q]) : level[q][l];
      any = true;
    }
  }
};

//! Tiles each block of a group of \p blocks takes over \p n values: the smallest power of
//! two that covers them all.
__device__ __forceinline__ unsigned long long tiles_per_block(std::size_t n, unsigned long long blocks) {
  const unsigned long long tiles = (n + square_tile - 1) / square_tile;
  const unsigned long long per = (tiles + blocks - 1) / blocks;
  unsigned long long g = 1;
  while (g < per) g <<= 1;
  return g;
}

//! Adds the \p count block sums of a group at \p from (slot v of block b at
//! from[v * capacity + b]; overwritten) in the aligned tree, by the whole block; the roots
//! end in from[v * capacity].
template <int N>
__device__ void add_slots_in_tree(double* from, unsigned long long capacity, unsigned long long count,
                                  double* const (&out)[N]) {
  for (unsigned long long w = 1; w < count; w <<= 1) {
    for (unsigned long long j = threadIdx.x * 2 * w; j + w < count; j += 2ull * w * select_threads)
      for (int q = 0; q < N; ++q)
        if (out[q]) {
          double* s = from + q * capacity;
          s[j] = __dadd_rn(__ldcg(s + j), __ldcg(s + j + w));
        }
    __syncthreads();
  }
}

//! Visits the \p n positions of the blocks of \p grid in the tiles' order (see the file's
//! note) and adds the sums of squares of the values the visitor yields into \p out (a null
//! pointer: that sum is not kept; all null: none is, and no slot or counter is touched).
//! Every thread calls \p visit(pos, in, vals) for each of its 32 positions of a tile, in
//! order, with `in` false past n (warp-wide operations inside stay converged); when `in`,
//! vals[q] is the value whose square sum q counts. A leaf whose lanes overflowed or
//! underflowed (square_sum.hpp, leaf_needs_double) is summed again in double in index order,
//! from \p reload(pos, vals), which reads the same values back from where the block's
//! threads left them (no warp operation; rare, so one thread a leaf).
//! Blocks of the group with no tile add zero. Slots and the counter are those of
//! add_in_block_order (\p grid.sums_done counts the group's blocks; slots from grid.first).
template <int N, class Visit, class Reload>
__device__ void square_sums_pass(std::size_t n, const pass_grid& grid, block_slots slots, double* const (&out)[N],
                                 Visit&& visit, Reload&& reload) {
  static_assert(N >= 1 && N <= max_ordered_sums);
  __shared__ float lanes[N][select_threads];
  __shared__ double tail[N][square_sum_lanes];
  __shared__ bool nonzero[N][select_threads];  // a thread's values of sum q were not all zero
  const unsigned lane = threadIdx.x % square_sum_lanes;
  const unsigned leaf = threadIdx.x / square_sum_lanes;
  const unsigned long long per = tiles_per_block(n, grid.blocks);
  const unsigned long long tiles = (n + square_tile - 1) / square_tile;
  const unsigned long long t0 = grid.block * per;
  const unsigned long long t1 = t0 + per < tiles ? t0 + per : tiles;
  __shared__ device_pairwise<N> block_tree;  // thread 0's (in shared memory: no local array per thread)
  if (threadIdx.x == 0) block_tree.count = 0;
  for (unsigned long long t = t0; t < t1; ++t) {
    const std::size_t leaf_at = t * square_tile + leaf * square_sum_leaf;
    const std::size_t leaf_n = leaf_at >= n ? 0 : (n - leaf_at < square_sum_leaf ? n - leaf_at : square_sum_leaf);
    const std::size_t lane_n = leaf_n / square_sum_lanes * square_sum_lanes;  // the rest is the tail
    float acc[N];
    bool nz[N];
    for (int q = 0; q < N; ++q) {
      acc[q] = 0.0f;
      nz[q] = false;
    }
    for (unsigned j = 0; j < square_sum_leaf / square_sum_lanes; ++j) {
      const std::size_t r = j * square_sum_lanes + lane;
      float v[N];
      for (int q = 0; q < N; ++q) v[q] = 0.0f;
      const bool in = r < leaf_n;
      visit(leaf_at + r, in, v);
      if (in)
        for (int q = 0; q < N; ++q) nz[q] = nz[q] || v[q] != 0.0f;
      if (r < lane_n) {
        for (int q = 0; q < N; ++q) acc[q] = __fadd_rn(acc[q], __fmul_rn(v[q], v[q]));
      } else if (in) {  // the one value of this lane in the layer's short last group
        for (int q = 0; q < N; ++q) tail[q][lane] = __dmul_rn(v[q], v[q]);
      }
    }
    for (int q = 0; q < N; ++q) {
      lanes[q][threadIdx.x] = acc[q];
      nonzero[q][threadIdx.x] = nz[q];
    }
    __syncthreads();
    if (threadIdx.x < 32) {  // warp 0: lane i sums leaf i, then the tile's tree
      const std::size_t at = t * square_tile + threadIdx.x * square_sum_leaf;
      const std::size_t m = at >= n ? 0 : (n - at < square_sum_leaf ? n - at : square_sum_leaf);
      const std::size_t full = m / square_sum_lanes * square_sum_lanes;
      double s[N];
      for (int q = 0; q < N; ++q) {
        const float* l8 = &lanes[q][threadIdx.x * square_sum_lanes];
        float a[4];
        for (int i = 0; i < 4; ++i) a[i] = __fadd_rn(l8[i], l8[i + 4]);
        s[q] = __dadd_rn(__dadd_rn(a[0], a[1]), __dadd_rn(a[2], a[3]));
        for (std::size_t i = full; i < m; ++i) s[q] = __dadd_rn(s[q], tail[q][i - full]);
      }
      // A lane overflowed or underflowed, or a value is not finite: the leaf in double
      // (square_sum.hpp, leaf_needs_double).
      bool redo[N], again = false;
      for (int q = 0; q < N; ++q) {
        bool any = false;
        for (int l = 0; l < static_cast<int>(square_sum_lanes); ++l)
          any = any || nonzero[q][threadIdx.x * square_sum_lanes + l];
        redo[q] = !isfinite(s[q]) || (s[q] < tiny_leaf_sum && any);
        again = again || redo[q];
      }
      if (again) {
        double d[N];
        for (int q = 0; q < N; ++q) d[q] = 0;
        for (std::size_t i = 0; i < m; ++i) {
          float v[N];
          reload(at + i, v);
          for (int q = 0; q < N; ++q) d[q] = __dadd_rn(d[q], __dmul_rn(v[q], v[q]));
        }
        for (int q = 0; q < N; ++q)
          if (redo[q]) s[q] = d[q];
      }
      for (unsigned w = 1; w < 32; w <<= 1)
        for (int q = 0; q < N; ++q) {
          const double right = __shfl_down_sync(0xffffffffu, s[q], w);
          if ((threadIdx.x & (2 * w - 1)) == 0) s[q] = __dadd_rn(s[q], right);
        }
      if (threadIdx.x == 0) block_tree.push(s);
    }
    __syncthreads();  // lanes and tail are rewritten by the next tile
  }
  bool want = false;
  for (int q = 0; q < N; ++q) want = want || out[q] != nullptr;
  if (!want) return;
  double mine[N] = {};
  if (threadIdx.x == 0) block_tree.total(mine);
  if (grid.blocks == 1) {
    if (threadIdx.x == 0)
      for (int q = 0; q < N; ++q)
        if (out[q]) *out[q] = __dadd_rn(*out[q], mine[q]);
    return;
  }
  if (threadIdx.x == 0)
    for (int q = 0; q < N; ++q) slots.slots[q * slots.capacity + grid.first + grid.block] = mine[q];
  if (!last_block_of(grid.sums_done, grid.blocks)) return;
  add_slots_in_tree<N>(slots.slots + grid.first, slots.capacity, grid.blocks, out);
  if (threadIdx.x == 0)
    for (int q = 0; q < N; ++q)
      if (out[q]) *out[q] = __dadd_rn(*out[q], __ldcg(slots.slots + q * slots.capacity + grid.first));
}

}  // namespace gravac::detail
