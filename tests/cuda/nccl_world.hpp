#pragma once
// The MPI world the NCCL tests build their communicators from (nccl_test_main.cpp calls
// MPI_Init before the tests and MPI_Finalize after them).

#include "gravac/comm/mpi_communicator.hpp"

namespace gravac::test {

//! This process's mpi_communicator over MPI_COMM_WORLD, made on first use and shared by
//! every test case.
inline mpi_communicator& world() {
  static mpi_communicator m;
  return m;
}

}  // namespace gravac::test
