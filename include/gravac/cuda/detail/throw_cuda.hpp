#pragma once
//! \file
//! \brief The function behind GRAVAC_TRY_CUDA: a failed CUDA call as gravac::error.

#include "gravac/cuda/detail/nvcc_flags.hpp"
// (first, and apart from the includes below: a missing compiler option is one readable error)

#include <cuda_runtime.h>

#include <string>

#include "gravac/core/error.hpp"

namespace gravac::detail {

//! Throws gravac::error for a failed CUDA call; the pending error is cleared first so the
//! next call does not report it again (sticky errors stay, as CUDA defines).
[[noreturn]] inline void throw_cuda(cudaError_t code, const char* call, int rank = -1) {
  (void)cudaGetLastError();
  throw error(status::backend_failure,
              std::string(call) + ": " + cudaGetErrorName(code) + " (" + cudaGetErrorString(code) + ")", rank,
              backend::cuda, static_cast<int>(code));
}

}  // namespace gravac::detail
