#pragma once
//! \file
//! \brief detail::host_transfer<cuda_space>: the checkpoint's copies of device memory to and
//! from the host. Both are ordered on the compressor's stream (after the queued step that
//! wrote the values, before the next one) and wait for their copy, so the host side may be
//! read or released as soon as they return. They run between steps, never in one.

#include "gravac/cuda/detail/nvcc_flags.hpp"
// (first, and apart from the includes below: a missing compiler option is one readable error)

#include <cstddef>

#include "gravac/concepts/detail/host_transfer.hpp"
#include "gravac/core/memory.hpp"
#include "gravac/cuda/cuda_error.hpp"

namespace gravac::detail {

//! Device memory: copies on the compressor's stream, waited for.
template <>
struct host_transfer<cuda_space, false> {
  //! Copies \p n device floats at \p from to the host's \p to, after the work queued on
  //! \p c's stream, and waits.
  template <class C>
  static void to_host(const C& c, const float* from, float* to, std::size_t n) {
    copy(c, from, to, n, cudaMemcpyDeviceToHost);
  }
  //! Copies \p n host floats at \p from into device memory \p to on \p c's stream, and waits.
  template <class C>
  static void from_host(const C& c, const float* from, float* to, std::size_t n) {
    copy(c, from, to, n, cudaMemcpyHostToDevice);
  }

 private:
  template <class C>
  static void copy(const C& c, const float* from, float* to, std::size_t n, cudaMemcpyKind kind) {
    if (!n) return;
    GRAVAC_TRY_CUDA(cudaMemcpyAsync(to, from, n * sizeof(float), kind, c.stream().get()));
    c.stream().synchronize();
  }
};

}  // namespace gravac::detail
