#pragma once
//! \file
//! \brief The function behind GRAVAC_TRY_NCCL: a failed NCCL call as gravac::error.

#include "gravac/cuda/detail/nvcc_flags.hpp"
// (first, and apart from the includes below: a missing compiler option is one readable error)

#include <nccl.h>

#include <string>

#include "gravac/core/error.hpp"

namespace gravac::detail {

//! Throws gravac::error for a failed NCCL call.
[[noreturn]] inline void throw_nccl(ncclResult_t code, const char* call, int rank) {
  throw error(status::backend_failure, std::string(call) + ": " + ncclGetErrorString(code), rank, backend::nccl,
              static_cast<int>(code));
}

}  // namespace gravac::detail
