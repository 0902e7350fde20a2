// Runs under mpiexec with 4 ranks: determinism across processes. For a representative set
// of configurations, the hash of every rank's outputs, decisions and residual
// (tests/support/determinism_checks.hpp) is
//   (a) the same in two runs in this process (with another training in between), and
//   (b) for the allgather collective, the same as that of the same training on 4 thread
//       ranks: allgather sums the gathered contributions in rank order on every engine.
// (b) does not hold for the collectives built on Allreduce (allreduce_compatible,
// dense_allreduce): MPI's Allreduce sums in an order of the implementation's choosing
// (recursive doubling, rings, ...), while the thread engine sums in rank order, so the
// last bits may differ between the engines. MPI does not even promise the same order run
// after run; in practice it is fixed for one launch layout, which (a) checks.
#include <catch2/catch.hpp>

#include "determinism_checks.hpp"
#include "gravac/comm/mpi_communicator.hpp"
#include "gravac/compress/qsgd.hpp"
#include "gravac/compress/randomk.hpp"
#include "gravac/compress/topk.hpp"

using namespace gravac;

namespace {
// Another training between the two runs on MPI: other sizes, seed and kept fraction.
void unrelated_mpi_run(mpi_communicator& comm) {
  layout lay;
  lay.add("big", {97, 31}, layer_kind::dense);
  lay.add("odd", {7}, layer_kind::bias_or_norm);
  trainer<topk, allgather, fixed_policy> t(comm, lay, {.policy = {.kept_fraction = 0.37}, .seed = 11});
  for (int s = 0; s < 3; ++s) {
    auto g = test::rank_gradient(lay, s + 5, comm.rank());
    t.step(std::span<float>(g));
  }
}

template <class C, class K, class P>
void check_mpi_determinism(bool same_as_threads) {
  mpi_communicator comm;
  const auto lay = test::mixed_layout();
  const auto first = test::hashed_run<C, K, P>(comm, lay, test::determinism_steps);
  unrelated_mpi_run(comm);
  const auto second = test::hashed_run<C, K, P>(comm, lay, test::determinism_steps);
  INFO("rank " << comm.rank());
  REQUIRE(first.step.size() == static_cast<std::size_t>(test::determinism_steps));
  CHECK(first == second);
  if (same_as_threads) {
    // Only steps that took the allgather path (a dense fallback would sum by Allreduce).
    for (auto k : first.kind) REQUIRE(k == collective_kind::allgather);
    // The same training on as many thread ranks, inside this process.
    const auto threads = test::thread_hashed_run<C, K, P>(comm.size(), lay, test::determinism_steps);
    const auto& mine = threads[static_cast<std::size_t>(comm.rank())];
    for (std::size_t s = 0; s < first.step.size(); ++s) {
      INFO("step " << s);
      CHECK(first.step[s] == mine.step[s]);
    }
    CHECK(first.residual == mine.residual);
  }
}
}  // namespace

TEST_CASE("MPI determinism: top-k, allgather, GraVAC on the simulated clock", "[mpi][determinism]") {
  check_mpi_determinism<topk, allgather, gravac_policy>(true);
}
TEST_CASE("MPI determinism: top-k, allreduce_compatible, fixed", "[mpi][determinism]") {
  check_mpi_determinism<topk, allreduce_compatible, fixed_policy>(false);  // Allreduce: (a) only
}
TEST_CASE("MPI determinism: random-k, dense_allreduce, Accordion", "[mpi][determinism]") {
  check_mpi_determinism<randomk, dense_allreduce, accordion_policy>(false);  // Allreduce: (a) only
}
TEST_CASE("MPI determinism: QSGD, allgather, fixed", "[mpi][determinism]") {
  check_mpi_determinism<qsgd, allgather, fixed_policy>(true);
}
