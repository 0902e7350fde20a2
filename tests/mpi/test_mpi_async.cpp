// The asynchronous step on MPI ranks: its communication thread calls MPI while the rank
// computes, so it needs MPI_THREAD_SERIALIZED (refused with a clear error otherwise; this
// binary runs twice, once initialised with MPI_THREAD_SINGLE), and it gives the
// synchronous step's bits with the same buckets (tests/support/bucket_checks.hpp).
#include <catch2/catch.hpp>
#include <span>

#include "bucket_checks.hpp"
#include "gravac/comm/mpi_communicator.hpp"
#include "gravac/compress/identity.hpp"
#include "gravac/compress/qsgd.hpp"
#include "gravac/compress/topk.hpp"

using namespace gravac;

namespace {

template <class C, class K, class P>
void check_on_mpi(std::size_t bucket_bytes) {
  mpi_communicator comm;
  const auto lay = test::mixed_layout();
  const auto sync =
      test::bucketed_run<C, K, P>(comm, lay, test::bucket_steps, bucket_bytes, test::step_mode::synchronous);
  const auto async =
      test::bucketed_run<C, K, P>(comm, lay, test::bucket_steps, bucket_bytes, test::step_mode::overlapped);
  const auto scrambled =
      test::bucketed_run<C, K, P>(comm, lay, test::bucket_steps, bucket_bytes, test::step_mode::scrambled);
  INFO("rank " << comm.rank() << ", bucket_bytes " << bucket_bytes);
  CHECK(sync == async);
  CHECK(sync == scrambled);
}

int thread_level() {
  int level = MPI_THREAD_SINGLE;
  MPI_Query_thread(&level);
  return level;
}

}  // namespace

TEST_CASE("mpi async: the communication thread needs MPI_THREAD_SERIALIZED", "[mpi][async][thread-level]") {
  mpi_communicator comm;
  const auto lay = test::mixed_layout();
  trainer<topk, allgather, fixed_policy> t(comm, lay, {.bucket_bytes = bucket_per_layer});
  auto g = test::rank_gradient(lay, 0, comm.rank());
  if (thread_level() < MPI_THREAD_SERIALIZED) {
    CHECK_FALSE(comm.accepts_calls_from_other_threads());
    CHECK_THROWS_WITH(t.begin_step(std::span<float>(g)), Catch::Contains("MPI_THREAD_SERIALIZED"));
    CHECK_FALSE(t.step_in_progress());
    CHECK_NOTHROW(t.step(std::span<float>(g)));  // the synchronous step needs no thread level
  } else {
    CHECK(comm.accepts_calls_from_other_threads());
    t.begin_step(std::span<float>(g));
    for (std::size_t i = lay.size(); i-- > 0;) t.ready(i);
    CHECK(t.finish().buckets == t.bucket_count());
  }
}

TEST_CASE("mpi async: top-k + allgather + gravac matches the synchronous step", "[mpi][async]") {
  if (thread_level() < MPI_THREAD_SERIALIZED) return;
  check_on_mpi<topk, allgather, gravac_policy>(bucket_per_layer);
  check_on_mpi<topk, allgather, gravac_policy>(2048);
}
TEST_CASE("mpi async: top-k + AR-Topk + accordion matches the synchronous step", "[mpi][async]") {
  if (thread_level() < MPI_THREAD_SERIALIZED) return;
  check_on_mpi<topk, allreduce_compatible, accordion_policy>(bucket_per_layer);
}
TEST_CASE("mpi async: top-k + flexible + moo matches the synchronous step", "[mpi][async]") {
  if (thread_level() < MPI_THREAD_SERIALIZED) return;
  check_on_mpi<topk, flexible, moo_policy>(bucket_per_layer);
}
TEST_CASE("mpi async: QSGD + allgather + fixed matches the synchronous step", "[mpi][async]") {
  if (thread_level() < MPI_THREAD_SERIALIZED) return;
  check_on_mpi<qsgd, allgather, fixed_policy>(bucket_per_layer);
}
TEST_CASE("mpi async: identity + dense Allreduce matches the synchronous step", "[mpi][async]") {
  if (thread_level() < MPI_THREAD_SERIALIZED) return;
  check_on_mpi<identity, dense_allreduce, fixed_policy>(bucket_per_layer);
}
