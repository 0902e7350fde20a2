// The Allreduce algorithms engines run and the rules that pick among them: each formula
// against hand-computed values at N = 2, 3, 4, 5, 8 and 1024; the wire bytes of recursive
// doubling and Rabenseifner against a message-by-message replay of Open MPI's schedule; the
// Open MPI 4.1 rule on both sides of every threshold of its table; the NCCL rule; and the
// simulated network charging and counting what a rule chose, its default unchanged.
#include <array>
#include <catch2/catch.hpp>
#include <cstddef>
#include <vector>

#include "gravac/comm/simulated_communicator.hpp"
#include "gravac_test_util.hpp"

using namespace gravac;
using algo = allreduce_algorithm;

namespace {

struct expected_terms {
  int n;
  double latency, bytes;
};

void check_terms(algo a, const std::vector<expected_terms>& rows) {
  for (const auto& e : rows) {
    INFO("algorithm " << static_cast<int>(a) << ", N = " << e.n);
    const cost_terms t = cost_model::allreduce(e.n, 1000.0, a);
    CHECK(t.latency == e.latency);
    CHECK(t.bytes == Approx(e.bytes).epsilon(1e-12));
  }
}

// Bytes each rank sends and receives in Open MPI's recursive doubling (ompi_coll_base_allreduce_
// intra_recursivedoubling) and in its Rabenseifner (..._redscat_allgather), message by message.
struct replay {
  std::vector<double> sent, received;
  explicit replay(int n) : sent(static_cast<std::size_t>(n)), received(static_cast<std::size_t>(n)) {}
  void message(int from, int to, double b) {
    sent[static_cast<std::size_t>(from)] += b;
    received[static_cast<std::size_t>(to)] += b;
  }
  [[nodiscard]] double mean_sent() const {
    double s = 0;
    for (double v : sent) s += v;
    return s / static_cast<double>(sent.size());
  }
  [[nodiscard]] double mean_received() const {
    double s = 0;
    for (double v : received) s += v;
    return s / static_cast<double>(received.size());
  }
};

int pof2_below(int n) {
  int p = 1;
  while (p * 2 <= n) p *= 2;
  return p;
}
// The rank in the power-of-two exchange of virtual rank v.
int real_rank(int v, int r) { return v < r ? 2 * v + 1 : v + r; }

replay recursive_doubling_messages(int n, double b) {
  replay m(n);
  const int p = pof2_below(n), r = n - p;
  for (int i = 0; i < 2 * r; i += 2) m.message(i, i + 1, b);  // even folds into odd
  for (int dist = 1; dist < p; dist *= 2)
    for (int v = 0; v < p; ++v) m.message(real_rank(v, r), real_rank(v ^ dist, r), b);
  for (int i = 0; i < 2 * r; i += 2) m.message(i + 1, i, b);  // odd returns the result
  return m;
}

replay rabenseifner_messages(int n, double b) {
  replay m(n);
  const int p = pof2_below(n), r = n - p;
  // Folded pairs: halves swapped, the odd rank returns its reduced half; here the even rank
  // goes on (Open MPI's vrank = rank / 2).
  auto in_exchange = [&](int v) { return v < r ? 2 * v : v + r; };
  for (int i = 0; i < 2 * r; i += 2) {
    m.message(i, i + 1, b / 2);
    m.message(i + 1, i, b / 2);
    m.message(i + 1, i, b / 2);
  }
  double piece = b;
  for (int mask = 1; mask < p; mask *= 2) {  // reduce-scatter, halving
    piece /= 2;
    for (int v = 0; v < p; ++v) m.message(in_exchange(v), in_exchange(v ^ mask), piece);
  }
  for (int mask = p / 2; mask > 0; mask /= 2) {  // allgather, doubling
    for (int v = 0; v < p; ++v) m.message(in_exchange(v), in_exchange(v ^ mask), piece);
    piece *= 2;
  }
  for (int i = 0; i < 2 * r; i += 2) m.message(i, i + 1, b);  // the result to the odd rank
  return m;
}

}  // namespace

TEST_CASE("allreduce algorithms: cost terms equal hand-computed values", "[network][cost_model][allreduce]") {
  // B = 1000 bytes. Ring: 2(N-1), 2(N-1)/N B.
  check_terms(
      algo::ring,
      {{2, 2, 1000}, {3, 4, 4000.0 / 3}, {4, 6, 1500}, {5, 8, 1600}, {8, 14, 1750}, {1024, 2046, 2046000.0 / 1024}});
  // Binomial tree: L = ceil(log2 N); 2L, 2L B.
  check_terms(algo::tree, {{2, 2, 2000}, {3, 4, 4000}, {4, 4, 4000}, {5, 6, 6000}, {8, 6, 6000}, {1024, 20, 20000}});
  // Recursive doubling: l = floor(log2 N) rounds of B, two more when N is not a power of two.
  check_terms(algo::recursive_doubling,
              {{2, 1, 1000}, {3, 3, 3000}, {4, 2, 2000}, {5, 4, 4000}, {8, 3, 3000}, {1024, 10, 10000}});
  // Rabenseifner: 2l, 2(p-1)/p B; not a power of two: + 3 and + 2B.
  check_terms(algo::rabenseifner,
              {{2, 2, 1000}, {3, 5, 3000}, {4, 4, 1500}, {5, 7, 3500}, {8, 6, 1750}, {1024, 20, 2046000.0 / 1024}});
  // NCCL's pipelined tree: 2 floor(log2 N), 2B.
  check_terms(algo::pipelined_tree,
              {{2, 2, 2000}, {3, 2, 2000}, {4, 4, 2000}, {5, 4, 2000}, {8, 6, 2000}, {1024, 20, 2000}});
  // Linear: 2(N-1), 2(N-1) B.
  check_terms(algo::linear,
              {{2, 2, 2000}, {3, 4, 4000}, {4, 6, 6000}, {5, 8, 8000}, {8, 14, 14000}, {1024, 2046, 2046000}});
  // One rank: nothing, whatever the algorithm.
  for (auto a :
       {algo::ring, algo::tree, algo::recursive_doubling, algo::rabenseifner, algo::pipelined_tree, algo::linear}) {
    CHECK(cost_model::allreduce(1, 1000, a).latency == 0.0);
    CHECK(cost_model::allreduce(1, 1000, a).bytes == 0.0);
  }
  // The case: 1,024 ranks, 0.94 MB at 10 Gbit/s and 50 us. Ring is a latency sum.
  const network_params ten = network_params::from_gbps(50e-6, 10);
  CHECK(cost_model::ring_allreduce(1024, 0.94e6).seconds(ten) == Approx(2046 * 50e-6 + 2046.0 / 1024 * 0.94e6 * 8e-10));
  CHECK(cost_model::rabenseifner_allreduce(1024, 0.94e6).seconds(ten) ==
        Approx(20 * 50e-6 + 2046.0 / 1024 * 0.94e6 * 8e-10));
}

TEST_CASE("allreduce algorithms: wire bytes per rank", "[network][wire][allreduce]") {
  // B = 1000: hand-computed.
  struct row {
    int n;
    double rd, rab, ring;
  };
  for (const row& e : std::vector<row>{{2, 1000, 1000, 1000},
                                       {3, 4000.0 / 3, 1500, 4000.0 / 3},
                                       {4, 2000, 1500, 1500},
                                       {5, 2000, 1700, 1600},
                                       {8, 3000, 1750, 1750},
                                       {1024, 10000, 2046000.0 / 1024, 2046000.0 / 1024}}) {
    INFO("N = " << e.n);
    CHECK(wire_bytes::allreduce(e.n, 1000, algo::recursive_doubling).sent == Approx(e.rd).epsilon(1e-12));
    CHECK(wire_bytes::allreduce(e.n, 1000, algo::rabenseifner).received == Approx(e.rab).epsilon(1e-12));
    for (auto a : {algo::ring, algo::tree, algo::pipelined_tree, algo::linear})
      CHECK(wire_bytes::allreduce(e.n, 1000, a) == wire_bytes::allreduce(e.n, 1000));
    CHECK(wire_bytes::allreduce(e.n, 1000, algo::ring).sent == Approx(e.ring).epsilon(1e-12));
  }
  CHECK(wire_bytes::allreduce(1, 1000, algo::rabenseifner) == wire_bytes{});
  // Against the replayed schedules, every N from 2 to 40: the per-rank average each way.
  for (int n = 2; n <= 40; ++n) {
    INFO("N = " << n);
    const replay rd = recursive_doubling_messages(n, 1000);
    CHECK(wire_bytes::allreduce(n, 1000, algo::recursive_doubling).sent == Approx(rd.mean_sent()).epsilon(1e-12));
    CHECK(wire_bytes::allreduce(n, 1000, algo::recursive_doubling).received ==
          Approx(rd.mean_received()).epsilon(1e-12));
    const replay rab = rabenseifner_messages(n, 1000);
    CHECK(wire_bytes::allreduce(n, 1000, algo::rabenseifner).sent == Approx(rab.mean_sent()).epsilon(1e-12));
    CHECK(wire_bytes::allreduce(n, 1000, algo::rabenseifner).received == Approx(rab.mean_received()).epsilon(1e-12));
  }
}

TEST_CASE("Open MPI 4.1 rule: each side of every threshold of coll/tuned's fixed decision",
          "[network][cost_model][allreduce][open_mpi]") {
  struct row {
    int n;
    double bytes;
    algo expected;
  };
  const auto R = algo::recursive_doubling, Rab = algo::rabenseifner, T = algo::tree, ring = algo::ring;
  // One-byte elements, so that the fallbacks (ring with fewer elements than ranks, Rabenseifner
  // with fewer than p) stay out of the way except where noted.
  const std::vector<row> rows{
      // fewer than 4 ranks
      {2, 7, ring},
      {2, 8, R},
      {2, 4095, R},
      {2, 4096, ring},
      {2, 8191, ring},
      {2, 8192, R},
      {2, 16383, R},
      {2, 16384, ring},
      {2, 65535, ring},
      {2, 65536, ring},
      {2, 262143, ring},
      {2, 262144, Rab},
      {3, 7, ring},
      {3, 8, R},
      {3, 262143, ring},
      {3, 262144, Rab},
      // 4 to 7
      {4, 15, ring},
      {4, 16, R},
      {4, 8191, R},
      {4, 8192, Rab},
      {7, 15, ring},
      {7, 8192, Rab},
      // 8 to 15
      {8, 8191, R},
      {8, 8192, Rab},
      {15, 8191, R},
      {15, 8192, Rab},
      // 16 to 31
      {16, 63, ring},
      {16, 64, R},
      {16, 4095, R},
      {16, 4096, Rab},
      {31, 63, ring},
      {31, 4096, Rab},
      // 32 to 63
      {32, 127, ring},
      {32, 128, Rab},
      {63, 127, ring},
      {63, 128, Rab},
      // 64 to 127
      {64, 262143, R},
      {64, 262144, Rab},
      {127, 262143, R},
      {127, 262144, Rab},
      // 128 to 255
      {128, 131071, T},
      {128, 131072, R},
      {128, 262143, R},
      {128, 262144, Rab},
      {255, 131071, T},
      {255, 262144, Rab},
      // 256 to 511
      {256, 4095, T},
      {256, 4096, Rab},
      {511, 4095, T},
      {511, 4096, Rab},
      // 512 to 2047
      {512, 2047, T},
      {512, 2048, R},
      {512, 16383, R},
      {512, 16384, Rab},
      {2047, 2047, T},
      {2047, 16384, Rab},
      // 2048 to 4095
      {2048, 2047, T},
      {2048, 2048, ring},
      {2048, 4095, ring},
      {2048, 4096, R},
      {2048, 16383, R},
      {2048, 16384, Rab},
      {4095, 16384, Rab},
      // 4096 and more (ring at 2048 bytes has fewer elements than ranks: recursive doubling)
      {4096, 2047, T},
      {4096, 2048, R},
      {4096, 16383, ring},
      {4096, 16384, R},
      {4096, 32767, R},
      {4096, 32768, Rab},
      // rank-count boundaries at one size
      {3, 10, R},
      {4, 10, ring},
      {7, 10, ring},
      {8, 10, R},
      {15, 20, R},
      {16, 20, ring},
      {31, 100, R},
      {32, 100, ring},
      {63, 1000, Rab},
      {64, 1000, R},
      {127, 1000, R},
      {128, 1000, T},
      {255, 200000, R},
      {256, 200000, Rab},
      {511, 3000, T},
      {512, 3000, R},
      {2047, 3000, R},
      {2048, 3000, ring},
      {4095, 20000, Rab},
      {4096, 20000, R},
  };
  for (const row& e : rows) {
    INFO("N = " << e.n << ", " << e.bytes << " bytes");
    CHECK(cost_model::open_mpi_4_1_allreduce(e.n, e.bytes, 1) == e.expected);
  }
  // The fallbacks with real element sizes: one float over 2 ranks (ring -> recursive
  // doubling); 16 doubles over 32 ranks (Rabenseifner with fewer elements than p -> linear),
  // 32 floats there stay Rabenseifner.
  CHECK(cost_model::open_mpi_4_1_allreduce(2, 4) == R);
  CHECK(cost_model::open_mpi_4_1_allreduce(2, 8) == R);  // 8 bytes: recursive doubling by the table
  CHECK(cost_model::open_mpi_4_1_allreduce(32, 128, 8) == algo::linear);
  CHECK(cost_model::open_mpi_4_1_allreduce(32, 128, 4) == Rab);
  // The scaling study's sizes: 0.94 MB and 25 MiB buckets at 8 to 1024 ranks are Rabenseifner;
  // a 4 KiB buffer at 1024 ranks is recursive doubling, a 1 KiB one reduce + broadcast.
  for (int n : {8, 64, 256, 1024}) {
    CHECK(cost_model::open_mpi_4_1_allreduce(n, 0.94e6) == Rab);
    CHECK(cost_model::open_mpi_4_1_allreduce(n, 25.0 * 1024 * 1024) == Rab);
  }
  CHECK(cost_model::open_mpi_4_1_allreduce(1024, 4096) == R);
  CHECK(cost_model::open_mpi_4_1_allreduce(1024, 1024) == T);
}

TEST_CASE("NCCL rule: tree at many ranks and small sizes, ring at large sizes", "[network][cost_model][allreduce]") {
  const network_params net = network_params::from_gbps(50e-6, 10);  // beta = 0.8 ns/byte
  // 8 ranks: the tree saves 2(7 - 3) alpha = 400 us and costs (2 - 1.75) B beta more; even at
  // B = 2e6 bytes.
  CHECK(cost_model::nccl_allreduce(8, 1.9e6, net) == algo::pipelined_tree);
  CHECK(cost_model::nccl_allreduce(8, 2.1e6, net) == algo::ring);
  CHECK(cost_model::nccl_allreduce(8, 1000, net) == algo::pipelined_tree);
  CHECK(cost_model::nccl_allreduce(8, 100e6, net) == algo::ring);
  // 1024 ranks: 2(1023 - 10) alpha = 101.3 ms of latency saved; the tree wins below
  // 101.3 ms / ((2 - 2046/1024) * 0.8 ns) = 65 GB.
  CHECK(cost_model::nccl_allreduce(1024, 0.94e6, net) == algo::pipelined_tree);
  CHECK(cost_model::nccl_allreduce(1024, 25.0 * 1024 * 1024, net) == algo::pipelined_tree);
  CHECK(cost_model::nccl_allreduce(1024, 1e12, net) == algo::ring);
  // 2 ranks: the tree has no latency to save and sends twice the bytes.
  CHECK(cost_model::nccl_allreduce(2, 1000, net) == algo::ring);
  // A tie is a ring; with no latency the ring always wins.
  CHECK(cost_model::nccl_allreduce(64, 1e6, network_params{0, 1e-9}) == algo::ring);
  // choose_allreduce: fixed returns the given algorithm.
  CHECK(cost_model::choose_allreduce(allreduce_rule::fixed, algo::tree, 1024, 1e6, net) == algo::tree);
  CHECK(cost_model::choose_allreduce(allreduce_rule::nccl, algo::ring, 1024, 1e6, net) == algo::pipelined_tree);
  CHECK(cost_model::choose_allreduce(allreduce_rule::open_mpi_4_1, algo::ring, 1024, 1e6, net) == algo::rabenseifner);
  CHECK(cost_model::allreduce_by_rule(1024, 1e6, allreduce_rule::fixed, net).latency == 2046.0);
  CHECK(cost_model::allreduce_by_rule(1024, 1e6, allreduce_rule::open_mpi_4_1, net).latency == 20.0);
}

namespace {

struct charged {
  std::vector<cost_terms> terms;
  std::vector<algo> algorithms;
  std::vector<double> sent, received;
  double clock = 0;
  bool summed = true;
};

// Every rank makes the same Allreduces of float buffers of the given lengths; rank 0's charges.
charged run_allreduces(int n, const simulated_network_options& opt, const network_params& net,
                       const std::vector<std::size_t>& lengths) {
  charged out;
  run_ranks(n, [&](thread_communicator& tc) {
    simulated_communicator<thread_communicator> sim(tc, network_profile::constant(net), opt);
    charged mine;
    for (std::size_t len : lengths) {
      std::vector<float> v(len, 1.0f);
      const double s0 = sim.wire_bytes_sent(), r0 = sim.wire_bytes_received();
      sim.allreduce_sum(std::span<float>(v));
      mine.terms.push_back(sim.last_charge().first);
      mine.algorithms.push_back(sim.last_allreduce());
      mine.sent.push_back(sim.wire_bytes_sent() - s0);
      mine.received.push_back(sim.wire_bytes_received() - r0);
      mine.summed = mine.summed && v.front() == static_cast<float>(n);  // still summed for real
    }
    mine.clock = sim.modeled_seconds();
    if (tc.rank() == 0) out = mine;
  });
  return out;
}

}  // namespace

TEST_CASE("simulated network: charges and counts the algorithm the rule chose", "[network][simulated][allreduce]") {
  const network_params net = network_params::from_gbps(50e-6, 10);
  SECTION("default: ring, as before the rules existed") {
    const charged c = run_allreduces(4, {}, net, {1000, 10000});
    CHECK(c.summed);
    for (std::size_t i = 0; i < 2; ++i) {
      CHECK(c.algorithms[i] == algo::ring);
      CHECK(c.terms[i].latency == 6.0);
    }
    CHECK(c.terms[0].bytes == 6000.0);
    CHECK(c.sent[0] == 6000.0);
    CHECK(c.received[1] == 60000.0);
    CHECK(c.clock == Approx(12 * 50e-6 + 66000 * 8e-10).epsilon(1e-12));
    // A fixed algorithm other than ring is still charged as given.
    const charged t = run_allreduces(4, {algo::tree}, net, {1000});
    CHECK(t.algorithms[0] == algo::tree);
    CHECK(t.terms[0].latency == 4.0);
    CHECK(t.terms[0].bytes == 16000.0);
    CHECK(t.sent[0] == 6000.0);
  }
  SECTION("Open MPI 4.1, 4 ranks: recursive doubling below 8 KiB, Rabenseifner above") {
    const charged c = run_allreduces(4, {algo::ring, allreduce_rule::open_mpi_4_1}, net, {1000, 10000, 2047, 2048});
    CHECK(c.algorithms == std::vector<algo>{algo::recursive_doubling, algo::rabenseifner, algo::recursive_doubling,
                                            algo::rabenseifner});
    CHECK(c.terms[0].latency == 2.0);
    CHECK(c.terms[0].bytes == 8000.0);
    CHECK(c.sent[0] == 8000.0);  // l B: two rounds of the whole 4000 bytes
    CHECK(c.received[0] == 8000.0);
    CHECK(c.terms[1].latency == 4.0);
    CHECK(c.terms[1].bytes == 60000.0);  // 2 * 3/4 * 40000
    CHECK(c.sent[1] == 60000.0);
    CHECK(c.clock == Approx((2 + 4 + 2 + 4) * 50e-6 + (8000 + 60000 + 16376 + 12288) * 8e-10).epsilon(1e-12));
  }
  SECTION("Open MPI 4.1, 5 ranks: the fold-in steps are charged and counted") {
    const charged c = run_allreduces(5, {algo::ring, allreduce_rule::open_mpi_4_1}, net, {1000, 10000});
    CHECK(c.algorithms == std::vector<algo>{algo::recursive_doubling, algo::rabenseifner});
    CHECK(c.terms[0].latency == 4.0);
    CHECK(c.terms[0].bytes == 16000.0);
    CHECK(c.sent[0] == Approx(8000.0));       // (4 * 2 + 2) / 5 * 4000
    CHECK(c.terms[1].latency == 7.0);         // 2 * 2 + 3
    CHECK(c.terms[1].bytes == 140000.0);      // 1.5 * 40000 + 2 * 40000
    CHECK(c.received[1] == Approx(68000.0));  // (2 * 3 + 2.5) / 5 * 40000
  }
  SECTION("NCCL, 4 ranks: the tree for a small buffer, the ring for a large one") {
    const charged c = run_allreduces(4, {algo::ring, allreduce_rule::nccl}, net, {1000, 1000000});
    CHECK(c.algorithms == std::vector<algo>{algo::pipelined_tree, algo::ring});
    CHECK(c.terms[0].latency == 4.0);
    CHECK(c.terms[0].bytes == 8000.0);
    CHECK(c.sent[0] == 6000.0);
    CHECK(c.terms[1].latency == 6.0);
    CHECK(c.sent[1] == 6e6);
  }
}
