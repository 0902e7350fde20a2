#pragma once
//! \file
//! \brief detail::host_transfer: copies between a memory space and host memory, for what
//! must pass through the host (the checkpoint's residual). Host spaces copy directly; a
//! device backend specializes it for its space (cuda/detail/host_transfer_cuda.hpp for
//! cuda_space, which device_buffer.hpp includes), ordering the copies on the compressor's
//! stream.

#include <algorithm>
#include <cstddef>

namespace gravac::detail {

//! Copies between memory space \p Space and the host (the primary template is never
//! defined: a space the host cannot read needs its backend's specialization).
template <class Space, bool HostAccessible = Space::host_accessible>
struct host_transfer;

//! Host memory: plain copies.
template <class Space>
struct host_transfer<Space, true> {
  //! Copies \p n floats at \p from (in \p Space) to the host's \p to.
  template <class C>
  static void to_host(const C&, const float* from, float* to, std::size_t n) {
    std::copy_n(from, n, to);
  }
  //! Copies \p n host floats at \p from into \p to (in \p Space).
  template <class C>
  static void from_host(const C&, const float* from, float* to, std::size_t n) {
    std::copy_n(from, n, to);
  }
};

}  // namespace gravac::detail
