#pragma once
//! \file
//! \brief The stream-ordered clears and copies of the device compressors' per-step state:
//! each one is a single call on the compressor's stream with its size taken from the
//! buffers, so no call site restates an element size.

#include "gravac/cuda/detail/nvcc_flags.hpp"
// (first, and apart from the includes below: a missing compiler option is one readable error)

#include <cstddef>

#include "gravac/cuda/device_buffer.hpp"

namespace gravac::detail {

//! Sets every element of each of \p buffers to zero, asynchronously on \p s.
template <class... T>
void clear_async(cudaStream_t s, device_buffer<T>&... buffers) {
  (
      [&] {
        if (!buffers.empty()) GRAVAC_TRY_CUDA(cudaMemsetAsync(buffers.data(), 0, buffers.size() * sizeof(T), s));
      }(),
      ...);
}

//! Copies the first \p n elements of device buffer \p from into pinned \p to (all of \p to
//! by default), asynchronously on \p s: the host reads them after synchronizing \p s.
template <class T>
void copy_to_host_async(cudaStream_t s, pinned_buffer<T>& to, const device_buffer<T>& from, std::size_t n) {
  if (n) GRAVAC_TRY_CUDA(cudaMemcpyAsync(to.data(), from.data(), n * sizeof(T), cudaMemcpyDeviceToHost, s));
}
//! Copies all of pinned \p to's elements from device buffer \p from (see above).
template <class T>
void copy_to_host_async(cudaStream_t s, pinned_buffer<T>& to, const device_buffer<T>& from) {
  copy_to_host_async(s, to, from, to.size());
}

}  // namespace gravac::detail
