// The Catch2 main of the NCCL tests (run under mpiexec, one rank per GPU): MPI_Init, then
// every rank exits with 77 (CTest: "Skipped") when it sees no CUDA device or when there
// are more ranks than GPUs.
#ifndef OMPI_SKIP_MPICXX
#define OMPI_SKIP_MPICXX 1
#endif
#include <cuda_runtime.h>
#include <mpi.h>

#include <cstdio>

#include "catch_session.hpp"
#include "sticky_error_listener.hpp"

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, size = 1, n = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  const cudaError_t s = cudaGetDeviceCount(&n);
  // Every rank must agree on skipping, or the others would wait in a collective.
  int have = (s == cudaSuccess && n > 0) ? n : 0, fewest = 0;
  MPI_Allreduce(&have, &fewest, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  if (fewest == 0) {
    if (rank == 0) std::printf("SKIPPED: no CUDA device visible\n");
    MPI_Finalize();
    return 77;
  }
  cudaSetDevice(rank % have);
  const int rc = gravac_test::run_catch_session(argc, argv);
  int worst = 0;
  MPI_Allreduce(&rc, &worst, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  MPI_Finalize();
  return worst == 0 ? 0 : 1;
}
