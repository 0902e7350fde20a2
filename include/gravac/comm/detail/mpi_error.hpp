#pragma once
//! \file
//! \brief MPI error strings and the world rank, for the messages of gravac::error.

// gravac uses the C API only; the deprecated C++ bindings add nothing but warnings.
#ifndef OMPI_SKIP_MPICXX
#define OMPI_SKIP_MPICXX 1
#endif
#include <mpi.h>

#include <climits>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <span>
#include <string>
#include <vector>

#include "gravac/core/error.hpp"

namespace gravac::detail {

//! Text of an MPI error code.
inline std::string mpi_error_string(int code) {
  char buf[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(code, buf, &len) != MPI_SUCCESS) return "unknown MPI error";
  return std::string(buf, static_cast<std::size_t>(len));
}
//! This process's rank in MPI_COMM_WORLD, or -1 before MPI_Init.
inline int mpi_world_rank() noexcept {
  int init = 0, r = -1;
  if (MPI_Initialized(&init) == MPI_SUCCESS && init) MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}

}  // namespace gravac::detail
