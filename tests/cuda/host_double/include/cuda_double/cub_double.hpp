#pragma once
// The CUB part of the host test double: what gravac's CUB wrappers
// (gravac/cuda/detail/cub_primitives.hpp) call in the host build, and the helpers of the
// double's block primitives (cub/block/block_reduce.cuh, cub/block/block_scan.cuh).
// Strict where CUB is lenient: CUB's documented results, and nothing it leaves undefined.
//
// The block primitives use threadIdx, blockDim and __syncthreads() of the kernel engine
// (cuda_double/kernel.hpp, part of the prelude every host-build translation unit starts with).

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>

#include "cuda_double/core.hpp"

namespace cuda_double {

namespace cub_detail {

//! What a block primitive returns where CUB documents no result (BlockReduce's aggregate in
//! every thread but thread 0): a quiet NaN for floating types, the 0xDEADBEEF pattern
//! (0xDEADBEEFDEADBEEF for 64 bits, truncated for narrower types) for integers, so that a
//! caller that reads it gets a value no test expects.
template <class T>
constexpr T poison() noexcept {
  static_assert(std::is_arithmetic_v<T>, "the CUB double's block primitives take arithmetic types only");
  if constexpr (std::is_floating_point_v<T>)
    return std::numeric_limits<T>::quiet_NaN();
  else if constexpr (std::is_same_v<T, bool>)
    return true;
  else
    return static_cast<T>(0xDEADBEEFDEADBEEFull);
}

//! The calling thread's index in a block of BLOCK_DIM_X x BLOCK_DIM_Y x BLOCK_DIM_Z threads
//! (row-major: threadIdx.x + threadIdx.y * blockDim.x + threadIdx.z * blockDim.x *
//! blockDim.y, as CUB numbers them). CUB's block primitives are only defined when the block
//! has exactly the shape their template arguments name: any other block is a defect here.
template <int BLOCK_DIM_X, int BLOCK_DIM_Y, int BLOCK_DIM_Z>
int block_linear_tid(const char* primitive) {
  const dim3 b = blockDim;
  if (b.x != static_cast<unsigned>(BLOCK_DIM_X) || b.y != static_cast<unsigned>(BLOCK_DIM_Y) ||
      b.z != static_cast<unsigned>(BLOCK_DIM_Z))
    fail(std::string(primitive) + " for a block of " + std::to_string(BLOCK_DIM_X) + "x" + std::to_string(BLOCK_DIM_Y) +
         "x" + std::to_string(BLOCK_DIM_Z) + " threads used in a block of " + std::to_string(b.x) + "x" +
         std::to_string(b.y) + "x" + std::to_string(b.z));
  const uint3 t = threadIdx;
  return static_cast<int>(t.x + t.y * b.x + t.z * b.x * b.y);
}

//! The temporary storage select_indices_if asks for n items: the double's own size, not
//! CUB's, but like CUB's it grows with n (16 bytes of tile status per 128 items and 32 of
//! padding, rounded up to 256 bytes, and 255 bytes of alignment slack), so that storage
//! sized for a smaller n is refused as CUB refuses it.
constexpr std::size_t select_temp_bytes(std::int64_t n) noexcept {
  const auto tiles = static_cast<std::size_t>((n + 127) / 128);
  return ((16 * (tiles + 32) + 255) / 256) * 256 + 255;
}

//! The compaction queued by select_indices_if: every index in increasing order, the
//! predicate, the writer for each selected one, then the count.
template <class Pred, class Writer>
class select_indices_op final : public stream_op {
 public:
  select_indices_op(void* temp, std::int64_t n, Pred pred, Writer writer, unsigned long long* count)
      : temp_(temp), n_(n), pred_(std::move(pred)), writer_(std::move(writer)), count_(count) {}

  bool poll() override {
    // CUB keeps its tile states in the temporary storage: the double scribbles over the
    // size it asked for, so storage shared with other work in flight, or smaller than
    // claimed (a fault at the allocation's guard page), shows.
    std::memset(temp_, 0xA5, select_temp_bytes(n_));
    std::ptrdiff_t j = 0;
    for (std::int64_t i = 0; i < n_; ++i) {
      const auto index = static_cast<std::uint32_t>(i);
      if (pred_(index)) {
        writer_(j, index);
        ++j;
      }
    }
    *count_ = static_cast<unsigned long long>(j);
    return true;
  }
  [[nodiscard]] std::string what() const override {
    return "cub::DeviceSelect::If over " + std::to_string(n_) + " indices";
  }

 private:
  void* temp_;
  std::int64_t n_;
  Pred pred_;
  Writer writer_;
  unsigned long long* count_;
};

}  // namespace cub_detail

//! The double of cub::DeviceSelect::If(temp, temp_bytes, counting_iterator<uint32_t>(0),
//! make_tabulate_output_iterator(writer), count, n, pred, s), with CUB's documented results:
//!
//! - \p temp null: sets \p temp_bytes (nonzero, growing with \p n) and returns; nothing is
//!   queued and \p count is not used.
//! - \p temp not null: cudaErrorInvalidValue when \p temp_bytes is below what the sizing call
//!   for this \p n returns (CUB's result); otherwise queues on \p s the compaction, which
//!   calls writer(j, i) for the j-th index i in 0 .. n-1 that pred(i) selects, in increasing
//!   i, and then writes the number selected to *\p count (0 when \p n is 0, as CUB does).
//!
//! Defects (fail()): temp or count that a kernel cannot reach (not device or pinned memory). A negative \p n is refused
//! with cudaErrorInvalidValue. The sticky error, when there is one, is returned by both calls.
template <class Pred, class Writer>
cudaError_t select_indices_if(void* temp, std::size_t& temp_bytes, std::int64_t n, Pred pred, Writer writer,
                              unsigned long long* count, cudaStream_t s) {
  if (const cudaError_t e = sticky_error(); e != cudaSuccess) return e;
  if (n < 0) return cudaErrorInvalidValue;
  const std::size_t need = cub_detail::select_temp_bytes(n);
  if (temp == nullptr) {
    temp_bytes = need;
    return cudaSuccess;
  }
  if (temp_bytes < need) return cudaErrorInvalidValue;
  // Device-accessible: device memory, or pinned host memory (which kernels reach too).
  const auto device_accessible = [](const void* p) {
    cudaPointerAttributes a;
    return p != nullptr && cudaPointerGetAttributes(&a, p) == cudaSuccess &&
           (a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeHost);
  };
  if (!device_accessible(temp))
    fail(
        "cub::DeviceSelect::If: the temporary storage is not device memory (the second call needs the storage "
        "the first one sized)");
  if (!device_accessible(count)) fail("cub::DeviceSelect::If: the selected count's address is not device memory");
  return enqueue(s, std::make_unique<cub_detail::select_indices_op<Pred, Writer>>(temp, n, std::move(pred),
                                                                                  std::move(writer), count));
}

}  // namespace cuda_double
