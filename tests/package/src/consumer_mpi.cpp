// A consumer of gravac::mpi: one trainer step on the MPI ranks (run with mpiexec -n 2).
#include <mpi.h>

#include <cstdio>
#include <gravac/comm/mpi_communicator.hpp>

#include "consumer_check.hpp"

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int bad = 0;
  {
    gravac::mpi_communicator comm;
    bad = consumer::run_step(comm);
    MPI_Allreduce(MPI_IN_PLACE, &bad, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    if (comm.rank() == 0) std::printf("consumer_mpi on %d ranks: %s\n", comm.size(), bad == 0 ? "ok" : "FAILED");
  }
  MPI_Finalize();
  return bad == 0 ? 0 : 1;
}
