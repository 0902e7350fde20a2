#pragma once
//! \file cub_primitives.hpp
//! \brief The CUB primitives gravac's kernels use, as thin wrappers: the one place (with
//! detail/launch.hpp) that knows which build it is in. Part of target gravac::cuda.
//!
//! - nvcc: the real CUB (and thrust's iterators for the compaction).
//! - the host test build (GRAVAC_CUDA_HOST_DOUBLE): the test double's CUB
//!   (tests/cuda/host_double/include/cub/..., the same class names, and
//!   cuda_double::select_indices_if for the compaction), with CUB's documented results.

#include "gravac/cuda/detail/nvcc_flags.hpp"
// (first, and apart from the includes below: a missing compiler option is one readable error)

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>

#if defined(GRAVAC_CUDA_HOST_DOUBLE)
#include <cuda_double/cub_double.hpp>
#else
#include <thrust/iterator/counting_iterator.h>
#include <thrust/iterator/tabulate_output_iterator.h>

#include <cub/device/device_select.cuh>
#endif

namespace gravac::detail {

//! cub::BlockReduce over a block of \p Threads threads (x only). Sum()'s result is valid in
//! thread 0 only; a __syncthreads() is needed before its TempStorage is used again.
template <class T, int Threads>
using block_reduce = cub::BlockReduce<T, Threads>;

//! cub::BlockScan over a block of \p Threads threads (x only). The aggregate of
//! ExclusiveSum(x, out, aggregate) is valid in every thread; a __syncthreads() is needed
//! before its TempStorage is used again.
template <class T, int Threads>
using block_scan = cub::BlockScan<T, Threads>;

//! The stream compaction of the indices 0 .. n-1 that \p pred selects: cub::DeviceSelect::If
//! over thrust::counting_iterator<std::uint32_t>(0) into a tabulate output iterator, with
//! CUB's two-phase contract.
//!
//! - \p temp null: sets \p temp_bytes to the temporary storage the compaction of \p n
//!   items needs and does nothing else (\p count may be null).
//! - otherwise (\p temp: device memory of \p temp_bytes bytes, at least what the sizing call
//!   for this n returned): queues on \p s the compaction, which calls writer(j, i) (j a
//!   std::int64_t) for the j-th selected index i, i increasing, and writes the number
//!   selected to *\p count (0 when n is 0).
//!
//! \p pred: `bool operator()(std::uint32_t i) const` and \p writer:
//! `void operator()(std::int64_t j, std::uint32_t i) const`, both __device__. Returns the
//! CUDA error of the call (cudaErrorInvalidValue when \p temp_bytes is too small).
template <class Pred, class Writer>
cudaError_t select_indices_if(void* temp, std::size_t& temp_bytes, std::int64_t n, Pred pred, Writer writer,
                              unsigned long long* count, cudaStream_t s) {
#if defined(GRAVAC_CUDA_HOST_DOUBLE)
  return ::cuda_double::select_indices_if(temp, temp_bytes, n, pred, writer, count, s);
#else
  return cub::DeviceSelect::If(temp, temp_bytes, thrust::counting_iterator<std::uint32_t>(0),
                               thrust::make_tabulate_output_iterator(writer), count, n, pred, s);
#endif
}

}  // namespace gravac::detail
