#pragma once
//! \file
//! \brief Ending an MPI job from a destructor or a terminate handler, where throwing is not possible.

#include <mpi.h>

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>
#include <utility>

namespace gravac {

//! Exit status run_or_abort (and an abandoned asynchronous step) hands to MPI_Abort by default.
inline constexpr int mpi_abort_code = 3;

}  // namespace gravac

namespace gravac::detail {

//! Prints "gravac: rank R of N failed: what" to stderr (one write, so lines of several
//! ranks do not interleave) and aborts the job. Never returns.
[[noreturn]] inline void abort_job(MPI_Comm comm, const char* what, int code) noexcept {
  // What the rank wrote before (a test framework's report of the check that failed) goes
  // out first: where the launcher gives stdout a pipe it is fully buffered, and MPI_Abort
  // ends the process without flushing it.
  std::fflush(stdout);
  int rank = -1, size = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  std::string line;
  try {
    line = "gravac: rank " + std::to_string(rank) + " of " + std::to_string(size) + " failed: " + what +
           " (aborting the MPI job)\n";
  } catch (...) {
    line = "gravac: a rank failed (aborting the MPI job)\n";
  }
  std::fwrite(line.data(), 1, line.size(), stderr);
  std::fflush(stderr);
  MPI_Abort(comm, code);
  std::abort();  // MPI_Abort does not return; this is for engines that do
}

}  // namespace gravac::detail
