// The Catch2 main of the multi-rank tests: every rank runs the same cases between
// MPI_Init_thread and MPI_Finalize, and the test fails when any rank fails. MPI is asked
// for MPI_THREAD_SERIALIZED (the asynchronous step's communication thread calls it), or
// for MPI_THREAD_SINGLE when GRAVAC_TEST_MPI_THREAD_SINGLE is set (the refusal test).
#include <cstdlib>

#include "catch_session.hpp"
#include "gravac/comm/mpi_communicator.hpp"

int main(int argc, char** argv) {
  const bool single = std::getenv("GRAVAC_TEST_MPI_THREAD_SINGLE") != nullptr;
  int provided = 0;
  MPI_Init_thread(&argc, &argv, single ? MPI_THREAD_SINGLE : MPI_THREAD_SERIALIZED, &provided);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  const int rc = gravac_test::run_catch_session(argc, argv);
  int worst = 0;
  MPI_Allreduce(&rc, &worst, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  MPI_Finalize();
  return worst == 0 ? 0 : 1;
}
