// Run under mpiexec with 4 ranks by the test mpi_collective_timeout, which passes only when
// this program FAILS: with mpi_options::collective_timeout at 2 s, every rank makes one good
// training step; then rank 2 hangs (alive, sleeping 60 s, as a deadlocked or stopped rank
// would) while ranks 0, 1 and 3 enter the next step's collective. Without the timeout they
// wait until rank 2 wakes; with it, each of them gives up after 2 s and the first to do so
// prints "gravac: rank R of 4 failed: <collective> did not complete within 2 s ..." and ends
// its process, upon which mpiexec ends the job, long before rank 2 would wake (the test's
// deadline is 20 s).
#include <chrono>
#include <cstdio>
#include <thread>
#include <vector>

#include "gravac/comm/mpi_communicator.hpp"
#include "gravac/gravac.hpp"

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  gravac::mpi_communicator comm({.collective_timeout = std::chrono::seconds(2)});
  gravac::layout lay;
  lay.add("w", {64, 16}, gravac::layer_kind::dense);
  lay.add("b", {64}, gravac::layer_kind::bias_or_norm);
  gravac::trainer<gravac::topk, gravac::allgather, gravac::fixed_policy> t(comm, lay,
                                                                           {.policy = {.kept_fraction = 0.1}});
  std::vector<float> g(lay.numel());
  for (int step = 0; step < 3; ++step) {
    for (std::size_t i = 0; i < g.size(); ++i)
      g[i] = static_cast<float>((static_cast<int>(i) * 7 + step * 13 + comm.rank()) % 29) - 14.0f;
    if (step == 1) {
      // The moment the healthy ranks enter the collective, for measuring how long the job takes to end.
      const double now = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
      std::printf("rank %d enters step 1 at %.3f\n", comm.rank(), now);
      std::fflush(stdout);
      if (comm.rank() == 2) std::this_thread::sleep_for(std::chrono::seconds(60));
    }
    t.step(g);
  }
  // Only reached if no rank timed out, which this test treats as a failure.
  std::printf("rank %d finished without failure\n", comm.rank());
  MPI_Finalize();
  return 0;
}
