#pragma once
//! \file
//! \brief The trainer's screening of u = g + e for NaN and infinity on device memory
//! (on_non_finite): detail::non_finite_ops<cuda_space>, the specialization of the core's
//! trait (gravac/concepts/detail/non_finite_ops.hpp), and its kernels. Each operation runs on the
//! stream of the compressor it is given (the bucket's), so it is ordered before that
//! compressor reads g.

#include "gravac/cuda/detail/nvcc_flags.hpp"
// (first, and apart from the includes below: a missing compiler option is one readable error)

#include <cstddef>
#include <cstdint>
#include <vector>

#include "gravac/concepts/detail/non_finite_ops.hpp"
#include "gravac/core/layout.hpp"
#include "gravac/core/memory.hpp"
#include "gravac/cuda/cuda_error.hpp"
#include "gravac/cuda/detail/launch.hpp"
#include "gravac/cuda/detail/launch_config.hpp"
#include "gravac/cuda/device_buffer.hpp"
#include "gravac/cuda/stream.hpp"

namespace gravac::detail {

//! Flag bit of a layer whose u = g + e holds NaN or infinity somewhere.
inline constexpr std::uint32_t non_finite_u = 1;
//! Flag bit of a layer where g or e itself holds NaN or infinity somewhere (without it, a
//! bad layer's u overflowed from finite g and e).
inline constexpr std::uint32_t non_finite_input = 2;

//! Layers first + y (y from blockIdx.y, striding by gridDim.y) of the \p layers given by
//! \p offset (layers + 1 entries): flags[y] gets the bits above. Only a thread that finds
//! a bad value writes (atomicOr), so a finite gradient costs one read of g (and e).
static __global__ void __launch_bounds__(packet_threads)
    flag_non_finite_layers(const float* __restrict__ g, const float* __restrict__ e, bool residual_zero,
                           const unsigned long long* __restrict__ offset, std::uint32_t first, std::uint32_t layers,
                           std::uint32_t* __restrict__ flags) {
  const unsigned long long stride = static_cast<unsigned long long>(gridDim.x) * blockDim.x;
  for (std::uint32_t y = blockIdx.y; y < layers; y += gridDim.y) {
    const unsigned long long begin = offset[first + y], end = offset[first + y + 1];
    std::uint32_t bits = 0;
    for (unsigned long long j = begin + blockIdx.x * static_cast<unsigned long long>(blockDim.x) + threadIdx.x; j < end;
         j += stride) {
      const float gj = g[j], ej = e[j];
      if (!isfinite(residual_zero ? gj : gj + ej)) bits |= non_finite_u;
      if (!isfinite(gj) || !isfinite(ej)) bits |= non_finite_input;
    }
    if (bits) atomicOr(flags + y, bits);
  }
}

//! zero_values: g[j] = 0 wherever u = g + e is not finite, over n values (grid-stride).
static __global__ void __launch_bounds__(packet_threads)
    zero_non_finite_values(float* __restrict__ g, const float* __restrict__ e, bool residual_zero,
                           unsigned long long n) {
  const unsigned long long stride = static_cast<unsigned long long>(gridDim.x) * blockDim.x;
  for (unsigned long long j = blockIdx.x * static_cast<unsigned long long>(blockDim.x) + threadIdx.x; j < n;
       j += stride)
    if (!isfinite(residual_zero ? g[j] : g[j] + e[j])) g[j] = 0.0f;
}

//! The CUDA specialization: the same three operations as the host's, as kernels on the
//! stream of the compressor passed in (a compressor without stream() uses the per-thread
//! default stream). The layout's offsets go to the device on the first scan (the layout
//! never changes); each scan is one kernel, one copy of its per-layer flags back and one
//! wait for the stream, because the trainer decides on the host.
template <>
struct non_finite_ops<cuda_space> {
  template <class C>
  non_finite_scan first_non_finite(const C& c, const layout& lay, std::size_t first, std::size_t last, const float* g,
                                   const float* e, bool residual_zero, bool want_overflow) {
    if (first >= last) return {};
    const stream_ref s = stream_of(c);
    prepare(lay, s);
    const std::size_t n = last - first;
    GRAVAC_TRY_CUDA(cudaMemsetAsync(flags_.data(), 0, n * sizeof(std::uint32_t), s.get()));
    detail::launch(&flag_non_finite_layers, launch_config::per_layer(n), packet_threads, s.get(), g, e, residual_zero,
                   offset_.data(), static_cast<std::uint32_t>(first), static_cast<std::uint32_t>(n), flags_.data());
    GRAVAC_TRY_CUDA(
        cudaMemcpyAsync(host_flags_.data(), flags_.data(), n * sizeof(std::uint32_t), cudaMemcpyDeviceToHost, s.get()));
    s.synchronize();
    for (std::size_t i = 0; i < n; ++i) {
      const std::uint32_t bits = host_flags_[i];
      if (!(bits & non_finite_u)) continue;
      return {static_cast<long>(first + i), want_overflow && !(bits & non_finite_input)};
    }
    return {};
  }

  template <class C>
  void zero_non_finite(const C& c, float* g, const float* e, std::size_t n, bool residual_zero) {
    if (n == 0) return;
    const stream_ref s = stream_of(c);
    if (sms_ == 0) sms_ = launch_config::current_device().sms();
    const launch_config cfg(sms_);
    detail::launch(&zero_non_finite_values, cfg.grid_stride(n, packet_threads), packet_threads, s.get(), g, e,
                   residual_zero, n);
  }

  //! Sizes the scan's buffers for \p lay on compressor \p c's stream before any step: the
  //! first scan would otherwise allocate its pinned flags in a step (cudaMallocHost, which
  //! synchronizes the device). The trainer calls it at construction.
  template <class C>
  void prepare(const C& c, const layout& lay) {
    prepare(lay, stream_of(c));
  }

  // Waits for the stream: g is zeroed when a skipped step returns, or before it throws.
  template <class C>
  void zero_all(const C& c, float* g, std::size_t n) {
    if (n == 0) return;
    const stream_ref s = stream_of(c);
    GRAVAC_TRY_CUDA(cudaMemsetAsync(g, 0, n * sizeof(float), s.get()));
    s.synchronize();
  }

 private:
  template <class C>
  static stream_ref stream_of(const C& c) {
    if constexpr (requires { c.stream(); })
      return c.stream();
    else
      return {};
  }

  // The offsets of every layer (and the end) on the device, and room for one flag a layer
  // (once: the layout never changes).
  void prepare(const layout& lay, stream_ref s) {
    if (offset_.size() == lay.size() + 1) return;
    std::vector<unsigned long long> off(lay.size() + 1);
    for (std::size_t i = 0; i < lay.size(); ++i) off[i] = lay[i].offset;
    off[lay.size()] = lay.numel();
    offset_ = device_buffer<unsigned long long>(off.size(), s);
    flags_ = device_buffer<std::uint32_t>(lay.size(), s);
    host_flags_.resize(lay.size());
    GRAVAC_TRY_CUDA(cudaMemcpyAsync(offset_.data(), off.data(), off.size() * sizeof(unsigned long long),
                                    cudaMemcpyHostToDevice, s.get()));
    s.synchronize();  // off is pageable and goes out of scope
  }

  device_buffer<unsigned long long> offset_;
  device_buffer<std::uint32_t> flags_;
  pinned_buffer<std::uint32_t> host_flags_;
  int sms_ = 0;  // multiprocessors of the device, read on the first zeroing
};

}  // namespace gravac::detail
