#pragma once
//! \file mpi_guard.hpp
//! \brief Turns an exception on one MPI rank into the end of the whole job, with a message
//! that names the rank, instead of a hang (target gravac::mpi).
//!
//! MPI cannot survive a rank that leaves: when one rank throws and returns from main, the
//! other ranks block forever in their next collective. Wrap each rank's work in
//! run_or_abort: an exception escaping it is printed with the rank and the job is ended
//! with MPI_Abort, which Open MPI's launcher turns into every rank's exit.
//!
//! \code
//! int main(int argc, char** argv) {
//!   MPI_Init(&argc, &argv);
//!   gravac::run_or_abort(MPI_COMM_WORLD, [&] { train(); });
//!   MPI_Finalize();
//! }
//! \endcode

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>
#include <utility>

#include "gravac/comm/detail/mpi_abort.hpp"
#include "gravac/comm/mpi_communicator.hpp"
#include "gravac/core/error.hpp"

namespace gravac {

//! Runs \p body on this rank. If it throws, prints the exception with the rank and ends the
//! whole MPI job with MPI_Abort(comm, \p code) so that no other rank hangs waiting for this
//! one. Returns what \p body returns otherwise.
template <class Body>
decltype(auto) run_or_abort(MPI_Comm comm, Body&& body, int code = mpi_abort_code) noexcept {
  try {
    return std::forward<Body>(body)();
  } catch (const std::exception& e) {
    detail::abort_job(comm, e.what(), code);
  } catch (...) {
    detail::abort_job(comm, "unknown exception", code);
  }
}

//! run_or_abort over a gravac communicator's MPI communicator.
template <class Body>
decltype(auto) run_or_abort(mpi_communicator& comm, Body&& body, int code = mpi_abort_code) noexcept {
  return run_or_abort(comm.native(), std::forward<Body>(body), code);
}

}  // namespace gravac
