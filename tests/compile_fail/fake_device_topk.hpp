#pragma once
// Unit-test mock for the compile-fail tests: a top-k that only declares device memory, so
// that compositions with device compressors can be checked without a CUDA compiler. Its
// device entry points are never run (the compositions must not compile).
#include "gravac/gravac.hpp"

struct fake_device_topk : gravac::topk {
  using memory_space = gravac::cuda_space;
  using topk::topk;
  std::size_t compress(gravac::grad_view<gravac::cuda_space>, gravac::grad_view<gravac::cuda_space>,
                       const gravac::step_params&, std::span<std::byte>, gravac::compress_stats&) {
    return 0;
  }
  void decompress_add(std::span<const std::byte>, gravac::grad_view<gravac::cuda_space>, float) const {}
};
static_assert(gravac::Compressor<fake_device_topk>);
