#pragma once
// The host test double's cub::BlockScan: only what gravac uses (ExclusiveSum(x, out) and
// ExclusiveSum(x, out, aggregate)), with CUB's documented results.
//
// - Every thread writes its input into its slot of the TempStorage, __syncthreads(), then
//   each thread reads: out = the sum of the slots of threads 0 .. t-1 in thread order (T(0)
//   in thread 0, as CUB's ExclusiveSum gives), and the aggregate, valid in every thread as
//   CUB documents, = the sum of all the slots in thread order 0 .. N-1 (the same value in
//   every thread).
// - No barrier after the reads: CUB requires the caller to __syncthreads() before the
//   TempStorage is used again, and a caller that does not is caught (a thread that moves on
//   and writes its slot for the next scan before a slower thread has read this one changes
//   that thread's result; the kernel engine runs a block's threads in a seeded random order).
// - The block must have the shape the template arguments name (a defect otherwise).
// The ALGORITHM argument is accepted and ignored.

#include "cuda_double/cub_double.hpp"

namespace cub {

enum BlockScanAlgorithm {
  BLOCK_SCAN_RAKING,
  BLOCK_SCAN_RAKING_MEMOIZE,
  BLOCK_SCAN_WARP_SCANS,
};

template <class T, int BLOCK_DIM_X, BlockScanAlgorithm ALGORITHM = BLOCK_SCAN_RAKING, int BLOCK_DIM_Y = 1,
          int BLOCK_DIM_Z = 1, int LEGACY_PTX_ARCH = 0>
class BlockScan {
  static constexpr int BLOCK_THREADS = BLOCK_DIM_X * BLOCK_DIM_Y * BLOCK_DIM_Z;
  static_assert(BLOCK_THREADS > 0, "cub::BlockScan: the block has no threads");

 public:
  //! The shared memory of one scan: a slot per thread. Trivial (a __shared__ variable).
  struct TempStorage {
    T slots[BLOCK_THREADS];
  };

  explicit BlockScan(TempStorage& temp_storage)
      : temp_(temp_storage),
        tid_(::cuda_double::cub_detail::block_linear_tid<BLOCK_DIM_X, BLOCK_DIM_Y, BLOCK_DIM_Z>("cub::BlockScan")) {}

  //! \p output = the sum of the inputs of the threads before this one (T(0) in thread 0).
  void ExclusiveSum(T input, T& output) {
    publish(input);
    output = prefix();
  }

  //! As ExclusiveSum(input, output), and \p block_aggregate = the sum of every input (in
  //! every thread).
  void ExclusiveSum(T input, T& output, T& block_aggregate) {
    publish(input);
    const T before = prefix();
    T all = before;
    for (int i = tid_; i < BLOCK_THREADS; ++i) all = all + temp_.slots[i];
    output = before;
    block_aggregate = all;
  }

 private:
  void publish(T input) {
    temp_.slots[tid_] = input;
    __syncthreads();
  }
  // The slots of threads 0 .. tid-1, added left to right.
  T prefix() const {
    T sum = T(0);
    for (int i = 0; i < tid_; ++i) sum = sum + temp_.slots[i];
    return sum;
  }

  TempStorage& temp_;
  int tid_;
};

}  // namespace cub
