// The communicator conformance suite (support/communicator_conformance.hpp) on the thread
// engine, directly and through communicator_ref<host_space> (how the trainer holds it), on
// 1 to 4 ranks. The ranks run the suite; Catch2 reports on this thread after they joined.
#include <catch2/catch.hpp>
#include <chrono>
#include <cstddef>
#include <vector>

#include "communicator_conformance.hpp"
#include "gravac/comm/communicator_ref.hpp"
#include "gravac/comm/thread_communicator.hpp"

using namespace gravac;

namespace {
// Runs the suite on \p n thread ranks, each rank through make_engine(comm), and reports
// every rank's checks. A broken engine that desynchronises the ranks times out in 60 s.
template <class MakeEngine>
void conformance_on_threads(int n, MakeEngine make_engine) {
  std::vector<test::conformance_log> logs(static_cast<std::size_t>(n));
  run_ranks(
      n,
      [&](thread_communicator& comm) {
        auto&& engine = make_engine(comm);
        logs[static_cast<std::size_t>(comm.rank())] = test::run_communicator_conformance(engine);
      },
      std::chrono::seconds(60));
  for (int r = 0; r < n; ++r) {
    const auto& log = logs[static_cast<std::size_t>(r)];
    INFO(n << " ranks, rank " << r);
    CHECK(log.rank == r);
    CHECK(log.checks.size() == logs[0].checks.size());  // every rank made the same checks
    CHECK(log.alltoallv_tested);
    CHECK(log.broadcast_values_tested);
    test::report_conformance(log);
  }
}
}  // namespace

TEST_CASE("thread_communicator passes the communicator conformance suite", "[conformance][comm]") {
  for (int n : {1, 2, 3, 4})
    conformance_on_threads(n, [](thread_communicator& comm) -> thread_communicator& { return comm; });
}

TEST_CASE("communicator_ref over thread_communicator passes the communicator conformance suite",
          "[conformance][comm]") {
  static_assert(AlltoallCommunicator<communicator_ref<host_space>>);
  for (int n : {1, 2, 3, 4})
    conformance_on_threads(n, [](thread_communicator& comm) { return communicator_ref<host_space>(comm); });
}
