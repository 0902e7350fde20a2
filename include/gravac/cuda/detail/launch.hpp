#pragma once
//! \file launch.hpp
//! \brief gravac::detail::launch: every kernel of gravac is launched through it, so that
//! the one place that knows which build it is in is here (and in cub_primitives.hpp). Part
//! of target gravac::cuda.
//!
//! - nvcc: the chevron launch `kernel<<<grid, block, 0, stream>>>(args...)`, then
//!   GRAVAC_CHECK_CUDA_LAUNCH() (a configuration error is thrown at once, as every call
//!   site did before the helper).
//! - the host test build (GRAVAC_CUDA_HOST_DOUBLE, tests/cuda/host_double): the kernel is
//!   queued on the test double's stream by ::cuda_double::launch, then the same check.
//!
//! No dynamic shared memory: every gravac kernel declares its shared memory statically, so
//! the shared-bytes argument is always 0. A kernel template is passed as a specialization
//! (`&k<true>`); every argument of the kernel is passed (a function pointer carries no
//! default arguments).

#include "gravac/cuda/detail/nvcc_flags.hpp"
// (first, and apart from the includes below: a missing compiler option is one readable error)

#include <cstddef>
#include <utility>

#include "gravac/cuda/cuda_error.hpp"

#if defined(GRAVAC_CUDA_HOST_DOUBLE)
#include <cuda_double/kernel.hpp>
#endif

namespace gravac::detail {

//! Launches \p kernel on \p stream with \p grid blocks of \p block threads and no dynamic
//! shared memory, then checks the launch (GRAVAC_CHECK_CUDA_LAUNCH(): throws
//! gravac::error(backend_failure, backend::cuda) on a configuration error). \p args are
//! converted to the kernel's parameters as a chevron launch converts them.
template <class... P, class... A>
void launch(void (*kernel)(P...), dim3 grid, dim3 block, cudaStream_t stream, A&&... args) {
  static_assert(sizeof...(P) == sizeof...(A), "gravac::detail::launch: pass every kernel argument");
#if defined(GRAVAC_CUDA_HOST_DOUBLE)
  ::cuda_double::launch(kernel, grid, block, std::size_t{0}, stream, std::forward<A>(args)...);
#else
  // clang-format splits the chevrons of a .hpp into "> > >", which is no launch.
  // clang-format off
  kernel<<<grid, block, 0, stream>>>(std::forward<A>(args)...);
  // clang-format on
#endif
  GRAVAC_CHECK_CUDA_LAUNCH();
}

}  // namespace gravac::detail
