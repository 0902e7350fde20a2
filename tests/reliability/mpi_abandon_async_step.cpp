// Run under mpiexec with 4 ranks by the test mpi_abandon_async_step, which passes only when
// this program FAILS: in its second asynchronous step, rank 1 throws in the middle of
// "backward" (after its first buckets have started) while the others finish and wait in
// the collectives of buckets rank 1 will never send. Rank 1's trainer is destroyed while
// its communication thread may be inside a collective; it abandons the step (MPI_Abort
// naming rank 1) instead of joining a thread that can never return, so the job ends at
// once, non-zero, with "rank 1 abandoned an asynchronous step" on stderr.
#include <cstdio>
#include <span>
#include <stdexcept>
#include <vector>

#include "gravac/comm/mpi_guard.hpp"
#include "gravac/gravac.hpp"

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_SERIALIZED, &provided);
  gravac::mpi_communicator comm;
  gravac::run_or_abort(comm, [&] {
    gravac::layout lay;
    for (int i = 0; i < 6; ++i) lay.add("w" + std::to_string(i), {64, 16}, gravac::layer_kind::dense);
    std::vector<float> g(lay.numel());  // before the trainer: it must outlive the step
    gravac::trainer<gravac::topk, gravac::allgather, gravac::fixed_policy> t(
        comm, lay, {.policy = {.kept_fraction = 0.1}, .bucket_bytes = gravac::bucket_per_layer});
    for (int step = 0; step < 1000; ++step) {
      for (std::size_t i = 0; i < g.size(); ++i)
        g[i] = static_cast<float>((i * 7 + step * 13 + comm.rank()) % 29) - 14.0f;
      t.begin_step(std::span<float>(g));
      for (std::size_t l = lay.size(); l-- > 0;) {
        if (step == 1 && comm.rank() == 1 && l == 2) {
          // A failed check's report, as a test framework writes it (stdout, not flushed).
          std::printf("rank 1 reports: injected failure in backward\n");
          throw std::runtime_error("injected failure in backward on rank 1");
        }
        t.ready(l);
      }
      t.finish();
    }
  });
  std::printf("rank %d finished without failure\n", comm.rank());
  MPI_Finalize();
  return 0;
}
