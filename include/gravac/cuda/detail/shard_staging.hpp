#pragma once
//! \file
//! \brief detail::shard_device_staging<cuda_space>: compressed_allreduce's staging of shards
//! in device memory. A shard of the flat gradient is one contiguous piece per layer, so
//! gathering it into the shard-major buffer (and scattering it back) is one device-to-device
//! copy per non-empty piece, ordered on the compressor's stream like the kernels around it:
//! no kernel of its own and no host round trip. The server residual's copies to and from
//! the host (the checkpoint) are synchronous: they run between steps.

#include "gravac/cuda/detail/nvcc_flags.hpp"
// (first, and apart from the includes below: a missing compiler option is one readable error)

#include <cstddef>

#include "gravac/collective/detail/shard_plan.hpp"
#include "gravac/collective/detail/space_ops.hpp"
#include "gravac/core/memory.hpp"
#include "gravac/cuda/cuda_error.hpp"
#include "gravac/cuda/device_buffer.hpp"

namespace gravac::detail {

//! The device form of shard_host_staging (same members; \p C is a device compressor, whose
//! stream orders every copy).
template <>
struct shard_device_staging<cuda_space> {
  //! Sizes \p b (floats or packet bytes) to \p n elements, allocating on the compressor's stream (so the copies and
  //! kernels on that stream are ordered after the allocation); contents are rewritten before use.
  template <class C, class T>
  static void resize(const C& c, device_buffer<T>& b, std::size_t n) {
    b.set_stream(c.stream());
    b.resize(n);
  }
  //! Copies shard \p j of the flat \p from into the contiguous \p to, one copy per layer piece.
  template <class C>
  static void gather(const C& c, const shard_plan& plan, std::size_t j, const float* from, float* to) {
    const layout& lay = plan.shard_layout(j);
    for (std::size_t i = 0; i < lay.size(); ++i) copy(c, from + plan.source(j, i), to + lay[i].offset, lay[i].numel);
  }
  //! Copies the contiguous shard \p j in \p from back into the flat \p to.
  template <class C>
  static void scatter(const C& c, const shard_plan& plan, std::size_t j, const float* from, float* to) {
    const layout& lay = plan.shard_layout(j);
    for (std::size_t i = 0; i < lay.size(); ++i) copy(c, from + lay[i].offset, to + plan.source(j, i), lay[i].numel);
  }
  //! Copies \p n device floats on the compressor's stream.
  template <class C>
  static void copy(const C& c, const float* from, float* to, std::size_t n) {
    if (n) GRAVAC_TRY_CUDA(cudaMemcpyAsync(to, from, n * sizeof(float), cudaMemcpyDeviceToDevice, c.stream().get()));
  }
  //! Copies \p n device floats to the host (the checkpoint's save). The step that wrote them
  //! waited for its stream before returning, so a synchronous copy reads the finished values.
  static void to_host(const float* from, float* to, std::size_t n) {
    if (n) GRAVAC_TRY_CUDA(cudaMemcpy(to, from, n * sizeof(float), cudaMemcpyDeviceToHost));
  }
  //! Copies \p n host floats into device memory (a loaded checkpoint) on the compressor's
  //! stream, where \p to was allocated, and waits: \p from may go when this returns.
  template <class C>
  static void from_host(const C& c, const float* from, float* to, std::size_t n) {
    host_transfer<cuda_space>::from_host(c, from, to, n);
  }
};

}  // namespace gravac::detail
