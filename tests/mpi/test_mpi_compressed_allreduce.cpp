// The compressed allreduce on MPI ranks (registered with 4, 3 and 8 ranks): MPI's
// alltoallv moves blocks of any size, empty ones included, to the right ranks; and a
// trainer over MPI gives every rank the bits the same trainer gives on thread ranks (which
// test_compressed_allreduce checks against the serial two-stage reference), residuals and
// server residual included.
#include <catch2/catch.hpp>
#include <vector>

#include "gravac/comm/mpi_communicator.hpp"
#include "gravac/comm/thread_communicator.hpp"
#include "gravac_test_util.hpp"

using namespace gravac;

namespace {

// What rank `from` sends to rank `to`: (from + 2 to) % 5 bytes (some empty), each naming both.
std::vector<std::byte> block(int from, int to) {
  std::vector<std::byte> b(static_cast<std::size_t>((from + 2 * to) % 5));
  for (std::size_t i = 0; i < b.size(); ++i) b[i] = static_cast<std::byte>(16 * from + to + i);
  return b;
}

struct run_result {
  std::vector<std::vector<float>> grads;  // per step
  std::vector<float> residual, server;
};

template <class C, class Comm>
run_result train(Comm& comm, const layout& lay, int steps) {
  trainer<C, compressed_allreduce, fixed_policy> t(comm, lay);
  run_result out;
  for (int s = 0; s < steps; ++s) {
    auto g = test::make_data(lay.numel(), 100 * s + comm.rank() + 1);
    t.step(g);
    out.grads.push_back(g);
  }
  out.residual.assign(t.residual().begin(), t.residual().end());
  const auto sr = t.collective().server_residual();
  out.server.assign(sr.begin(), sr.end());
  return out;
}

template <class C>
void check_mpi_equals_threads(const std::string& name) {
  mpi_communicator comm;
  layout lay = test::mixed_layout();
  lay.add("tiny", {3}, layer_kind::bias_or_norm);
  constexpr int steps = 3;
  const run_result mpi = train<C>(comm, lay, steps);
  std::vector<run_result> threads(static_cast<std::size_t>(comm.size()));
  run_ranks(comm.size(),
            [&](thread_communicator& tc) { threads[static_cast<std::size_t>(tc.rank())] = train<C>(tc, lay, steps); });
  const run_result& mine = threads[static_cast<std::size_t>(comm.rank())];
  INFO(name << ", rank " << comm.rank() << " of " << comm.size());
  CHECK(mpi.grads == mine.grads);
  CHECK(mpi.residual == mine.residual);
  CHECK(mpi.server == mine.server);
}

}  // namespace

TEST_CASE("mpi alltoallv delivers every block, empty ones too, in source-rank order", "[mpi][alltoall]") {
  mpi_communicator comm;
  const int n = comm.size(), me = comm.rank();
  std::vector<std::byte> send;
  std::vector<std::size_t> sizes;
  for (int to = 0; to < n; ++to) {
    const auto b = block(me, to);
    send.insert(send.end(), b.begin(), b.end());
    sizes.push_back(b.size());
  }
  std::vector<std::byte> out;
  std::vector<std::size_t> got;
  comm.alltoallv(send, sizes, out, got);
  std::vector<std::byte> want;
  std::vector<std::size_t> want_sizes;
  for (int from = 0; from < n; ++from) {
    const auto b = block(from, me);
    want.insert(want.end(), b.begin(), b.end());
    want_sizes.push_back(b.size());
  }
  CHECK(got == want_sizes);
  CHECK(out == want);
  sizes.back() += 1;  // sizes that do not add up to the buffer are refused before any message
  CHECK_THROWS_AS(comm.alltoallv(send, sizes, out, got), error);
}

TEST_CASE("mpi compressed allreduce gives the thread ranks' bits", "[mpi][compressed_allreduce]") {
  check_mpi_equals_threads<qsgd>("qsgd");
  check_mpi_equals_threads<sign>("EF-sign");
  check_mpi_equals_threads<cast16>("cast16");
}
