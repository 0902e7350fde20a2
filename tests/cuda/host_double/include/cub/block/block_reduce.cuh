#pragma once
// The host test double's cub::BlockReduce: only what gravac uses (Sum(T)), with CUB's
// documented results and nothing CUB leaves undefined made to look defined.
//
// - Sum(x): every thread writes x into its slot of the TempStorage, __syncthreads(), then
//   thread 0 adds the slots in thread order (linear thread index 0, 1, .., BLOCK_THREADS-1,
//   left to right, starting from slot 0) and returns that; CUB documents the aggregate in
//   thread 0 only, so every other thread returns a poisoned value
//   (cuda_double::cub_detail::poison: NaN for floating types, 0xDEADBEEF.. for integers).
// - No barrier after the read: CUB requires the caller to __syncthreads() before the
//   TempStorage is used again, and a caller that does not is caught (a thread that moves on
//   and writes its slot for the next reduction before thread 0 has read this one changes
//   thread 0's sum; the kernel engine runs a block's threads in a seeded random order).
// - The block must have the shape the template arguments name (a defect otherwise).
// The ALGORITHM argument is accepted and ignored: the double has the one order above.

#include "cuda_double/cub_double.hpp"

namespace cub {

enum BlockReduceAlgorithm {
  BLOCK_REDUCE_RAKING_COMMUTATIVE_ONLY,
  BLOCK_REDUCE_RAKING,
  BLOCK_REDUCE_WARP_REDUCTIONS,
};

template <class T, int BLOCK_DIM_X, BlockReduceAlgorithm ALGORITHM = BLOCK_REDUCE_WARP_REDUCTIONS, int BLOCK_DIM_Y = 1,
          int BLOCK_DIM_Z = 1, int LEGACY_PTX_ARCH = 0>
class BlockReduce {
  static constexpr int BLOCK_THREADS = BLOCK_DIM_X * BLOCK_DIM_Y * BLOCK_DIM_Z;
  static_assert(BLOCK_THREADS > 0, "cub::BlockReduce: the block has no threads");

 public:
  //! The shared memory of one reduction: a slot per thread. Trivial (a __shared__ variable).
  struct TempStorage {
    T slots[BLOCK_THREADS];
  };

  explicit BlockReduce(TempStorage& temp_storage)
      : temp_(temp_storage),
        tid_(::cuda_double::cub_detail::block_linear_tid<BLOCK_DIM_X, BLOCK_DIM_Y, BLOCK_DIM_Z>("cub::BlockReduce")) {}

  //! The sum of every thread's \p input, in thread 0 (added in thread order 0 .. N-1); a
  //! poisoned value in every other thread.
  T Sum(T input) {
    temp_.slots[tid_] = input;
    __syncthreads();
    if (tid_ != 0) return ::cuda_double::cub_detail::poison<T>();
    T sum = temp_.slots[0];
    for (int i = 1; i < BLOCK_THREADS; ++i) sum = sum + temp_.slots[i];
    return sum;
  }

 private:
  TempStorage& temp_;
  int tid_;
};

}  // namespace cub
