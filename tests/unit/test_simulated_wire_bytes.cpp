// The simulated network's wire-byte counters: what one rank sends and receives for each
// call kind under the algorithm it is charged as, checked against hand-computed values for
// N = 4, and the balance of the totals (every byte sent is received by some rank).
#include <array>
#include <catch2/catch.hpp>
#include <cstddef>
#include <vector>

#include "gravac/comm/simulated_communicator.hpp"
#include "gravac_test_util.hpp"

using namespace gravac;

namespace {

using gravac::test::ranks;

// Sent and received bytes of one call on every rank: fn(sim) makes the call.
struct wire {
  std::array<double, ranks> sent{}, received{};
};

template <class Fn>
wire per_rank(Fn&& fn, const simulated_network_options& opt = {}) {
  wire w;
  run_ranks(ranks, [&](thread_communicator& tc) {
    simulated_communicator<thread_communicator> sim(tc, network_profile::constant({}), opt);
    fn(sim);
    const auto r = static_cast<std::size_t>(tc.rank());
    w.sent[r] = sim.wire_bytes_sent();
    w.received[r] = sim.wire_bytes_received();
  });
  return w;
}

double sum(const std::array<double, ranks>& a) {
  double s = 0;
  for (double v : a) s += v;
  return s;
}

}  // namespace

TEST_CASE("wire bytes: Allreduce moves 2(N-1)/N of the buffer each way on every rank", "[network][simulated][wire]") {
  // 1000 floats = 4000 bytes; 2 * 3 / 4 * 4000 = 6000. Ring and tree are counted alike.
  for (auto algo : {allreduce_algorithm::ring, allreduce_algorithm::tree}) {
    const wire w = per_rank(
        [](auto& sim) {
          std::vector<float> v(1000, 1.0f);
          sim.allreduce_sum(std::span<float>(v));
        },
        {algo});
    for (int r = 0; r < ranks; ++r) {
      CHECK(w.sent[static_cast<std::size_t>(r)] == 6000.0);
      CHECK(w.received[static_cast<std::size_t>(r)] == 6000.0);
    }
  }
  // Doubles, sum and max: 3 doubles = 24 bytes -> 36 each, twice.
  const wire w = per_rank([](auto& sim) {
    std::vector<double> v(3, 1.0);
    sim.allreduce_sum(std::span<double>(v));
    sim.allreduce_max(std::span<double>(v));
  });
  for (int r = 0; r < ranks; ++r) {
    CHECK(w.sent[static_cast<std::size_t>(r)] == 72.0);
    CHECK(w.received[static_cast<std::size_t>(r)] == 72.0);
  }
}

TEST_CASE("wire bytes: Allgather receives every other rank's block and forwards as many",
          "[network][simulated][wire]") {
  SECTION("equal blocks: 100 bytes each, 300 in and 300 out") {
    const wire w = per_rank([](auto& sim) {
      std::vector<std::byte> mine(100), all;
      std::vector<std::size_t> sizes;
      sim.allgatherv(mine, all, sizes);
    });
    for (int r = 0; r < ranks; ++r) {
      CHECK(w.sent[static_cast<std::size_t>(r)] == 300.0);
      CHECK(w.received[static_cast<std::size_t>(r)] == 300.0);
    }
  }
  SECTION("unequal blocks: 8, 108, 208, 308 bytes (total 632)") {
    const wire w = per_rank([](auto& sim) {
      std::vector<std::byte> mine(static_cast<std::size_t>(sim.rank()) * 100 + 8), all;
      std::vector<std::size_t> sizes;
      sim.allgatherv(mine, all, sizes);
    });
    const std::array<double, ranks> expect{624, 524, 424, 324};  // 632 minus the own block
    for (std::size_t r = 0; r < ranks; ++r) {
      CHECK(w.received[r] == expect[r]);
      CHECK(w.sent[r] == expect[r]);
    }
    CHECK(sum(w.sent) == sum(w.received));  // 3 * 632
    CHECK(sum(w.received) == 3 * 632.0);
  }
}

TEST_CASE("wire bytes: broadcast reaches every rank but the root; the tree's sends averaged",
          "[network][simulated][wire]") {
  // 512 bytes from rank 1: received 512 on ranks 0, 2, 3 and 0 on the root; sent
  // (N-1)/N * 512 = 384 on every rank, so the totals balance (3 * 512 = 4 * 384).
  const wire w = per_rank([](auto& sim) {
    std::vector<std::byte> b(512);
    sim.broadcast(b, 1);
  });
  for (std::size_t r = 0; r < ranks; ++r) {
    CHECK(w.sent[r] == 384.0);
    CHECK(w.received[r] == (r == 1 ? 0.0 : 512.0));
  }
  CHECK(sum(w.sent) == sum(w.received));
}

TEST_CASE("wire bytes: a barrier carries none, and the counts add up over calls", "[network][simulated][wire]") {
  const wire none = per_rank([](auto& sim) { sim.barrier(); });
  CHECK(sum(none.sent) == 0.0);
  CHECK(sum(none.received) == 0.0);

  // Allreduce of 4000 bytes (6000), Allgather of 100-byte blocks (300), broadcast of 512
  // from rank 0 (384 sent; 512 received off the root), barrier (0).
  const wire all = per_rank([](auto& sim) {
    std::vector<float> v(1000, 1.0f);
    sim.allreduce_sum(std::span<float>(v));
    std::vector<std::byte> mine(100), out;
    std::vector<std::size_t> sizes;
    sim.allgatherv(mine, out, sizes);
    std::vector<std::byte> b(512);
    sim.broadcast(b, 0);
    sim.barrier();
  });
  for (std::size_t r = 0; r < ranks; ++r) {
    CHECK(all.sent[r] == 6000.0 + 300.0 + 384.0);
    CHECK(all.received[r] == 6000.0 + 300.0 + (r == 0 ? 0.0 : 512.0));
  }
}

TEST_CASE("wire bytes: one rank puts nothing on the wire", "[network][simulated][wire]") {
  run_ranks(1, [&](thread_communicator& tc) {
    simulated_communicator<thread_communicator> sim(tc, network_profile::constant({}));
    std::vector<float> v(100, 1.0f);
    sim.allreduce_sum(std::span<float>(v));
    std::vector<std::byte> mine(100), out, b(64);
    std::vector<std::size_t> sizes;
    sim.allgatherv(mine, out, sizes);
    sim.broadcast(b, 0);
    CHECK(sim.wire_bytes_sent() == 0.0);
    CHECK(sim.wire_bytes_received() == 0.0);
  });
}
