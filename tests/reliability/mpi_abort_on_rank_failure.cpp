// Run under mpiexec with 4 ranks by the test mpi_abort_on_rank_failure, which passes only
// when this program FAILS: rank 2 throws inside gravac::run_or_abort after one good
// training step, while ranks 0, 1 and 3 enter the next step and wait in a collective that
// rank 2 will never join. Without the guard this hangs until the CTest timeout; with it
// the job ends at once, non-zero, with "gravac: rank 2 of 4 failed: ..." on stderr.
#include <cstdio>
#include <stdexcept>

#include "gravac/comm/mpi_guard.hpp"
#include "gravac/gravac.hpp"

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  gravac::mpi_communicator comm;
  gravac::run_or_abort(comm, [&] {
    gravac::layout lay;
    lay.add("w", {64, 16}, gravac::layer_kind::dense);
    lay.add("b", {64}, gravac::layer_kind::bias_or_norm);
    gravac::trainer<gravac::topk, gravac::allgather, gravac::fixed_policy> t(comm, lay,
                                                                             {.policy = {.kept_fraction = 0.1}});
    std::vector<float> g(lay.numel());
    for (int step = 0; step < 1000; ++step) {
      for (std::size_t i = 0; i < g.size(); ++i)
        g[i] = static_cast<float>((i * 7 + step * 13 + comm.rank()) % 29) - 14.0f;
      if (step == 1 && comm.rank() == 2) throw std::runtime_error("injected failure on rank 2");
      t.step(g);
    }
  });
  // Only reached if no rank failed, which this test treats as a failure.
  std::printf("rank %d finished without failure\n", comm.rank());
  MPI_Finalize();
  return 0;
}
