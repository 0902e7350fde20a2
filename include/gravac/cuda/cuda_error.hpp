#pragma once
//! \file cuda_error.hpp
//! \brief GRAVAC_TRY_CUDA: every CUDA runtime call goes through it, so a failure becomes a
//! gravac::error(backend_failure, backend::cuda) carrying the call, the CUDA error text
//! and code. Part of target gravac::cuda.

#include "gravac/cuda/detail/nvcc_flags.hpp"
// (first, and apart from the includes below: a missing compiler option is one readable error)

#include <cuda_runtime.h>

#include <string>

#include "gravac/cuda/detail/throw_cuda.hpp"

//! Calls a CUDA runtime function and throws gravac::error(backend_failure, backend::cuda)
//! with the call's text and the CUDA error when it does not return cudaSuccess.
#define GRAVAC_TRY_CUDA(call)                                                                         \
  do {                                                                                                \
    const cudaError_t gravac_cuda_status_ = (call);                                                   \
    if (gravac_cuda_status_ != cudaSuccess) ::gravac::detail::throw_cuda(gravac_cuda_status_, #call); \
  } while (0)

//! Calls a CUDA function where throwing is not allowed (destructors); a failure is dropped
//! and the pending error cleared.
#define GRAVAC_TRY_CUDA_NO_THROW(call)                   \
  do {                                                   \
    if ((call) != cudaSuccess) (void)cudaGetLastError(); \
  } while (0)

//! Checks the launch of the kernel just issued (configuration errors are reported at once).
#define GRAVAC_CHECK_CUDA_LAUNCH() GRAVAC_TRY_CUDA(cudaGetLastError())
