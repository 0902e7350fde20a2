// The Catch2 main of the multi-rank tests: every rank runs the same cases between
// MPI_Init and MPI_Finalize, and the test fails when any rank fails.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include "gravac/comm/mpi_communicator.hpp"

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  Catch::Session session;
  int rc = session.applyCommandLine(argc, argv);
  if (rc == 0) rc = session.run();
  int worst = 0;
  MPI_Allreduce(&rc, &worst, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  MPI_Finalize();
  return worst == 0 ? 0 : 1;
}
