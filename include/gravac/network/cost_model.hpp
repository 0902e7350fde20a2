#pragma once
//! \file cost_model.hpp
//! \brief The alpha-beta cost of each collective (docs/algorithms.md, "The cost model"):
//! time = latency_terms * alpha + byte_terms * beta, with alpha the latency in seconds
//! and beta the inverse bandwidth in seconds per byte.
//!
//! Every formula returns its two coefficients separately (cost_terms) so that the same
//! table serves three purposes: pricing a collective under known (alpha, beta), fitting
//! (alpha, beta) from timed calls (network_estimate), and charging a virtual clock
//! (simulated_communicator).

#include <array>
#include <bit>
#include <cmath>
#include <cstddef>
#include <limits>

#include "gravac/core/error.hpp"

namespace gravac {

//! Latency and inverse bandwidth of a network.
struct network_params {
  double alpha = 50e-6;        //!< latency of one message, seconds
  double beta = 1.0 / 1.25e9;  //!< seconds per byte (1 / bandwidth); default 10 Gbit/s

  //! Parameters from a latency in seconds and a bandwidth in Gbit/s.
  static network_params from_gbps(double latency_s, double gbit_per_s) {
    require(latency_s >= 0 && std::isfinite(latency_s), "network_params: latency must be finite and >= 0");
    require(gbit_per_s > 0 && std::isfinite(gbit_per_s), "network_params: bandwidth must be finite and > 0");
    return {latency_s, 8.0 / (gbit_per_s * 1e9)};
  }
  //! Bandwidth in Gbit/s.
  [[nodiscard]] double gbps() const noexcept { return beta > 0 ? 8.0 / (beta * 1e9) : INFINITY; }
  //! Equal parameters.
  friend bool operator==(const network_params&, const network_params&) = default;
};

//! A modeled time as `latency * alpha + bytes * beta`: the coefficients of one call.
struct cost_terms {
  double latency = 0;  //!< number of message latencies on the critical path
  double bytes = 0;    //!< bytes on the critical path

  //! Seconds under network \p n.
  [[nodiscard]] constexpr double seconds(const network_params& n) const noexcept {
    return latency * n.alpha + bytes * n.beta;
  }
  //! Sum of two calls made one after the other.
  constexpr cost_terms& operator+=(const cost_terms& o) noexcept {
    latency += o.latency;
    bytes += o.bytes;
    return *this;
  }
  //! Sum of two calls made one after the other.
  friend constexpr cost_terms operator+(cost_terms a, const cost_terms& b) noexcept { return a += b; }
};

//! How an Allreduce is performed (what its cost formula is). B is the buffer's bytes, N the
//! ranks, L = ceil(log2 N), and for recursive doubling and Rabenseifner p = the largest power
//! of two <= N, l = log2 p, r = N - p (the ranks folded in first).
enum class allreduce_algorithm : unsigned char {
  ring,                //!< reduce-scatter + allgather around a ring: `2(N-1) alpha + 2(N-1)/N B beta`
  tree,                //!< binomial tree reduce + broadcast, unpipelined: `2L alpha + 2L B beta`
  recursive_doubling,  //!< exchange of the whole buffer with partners at distance 1, 2, 4, ...:
                       //!< `l alpha + l B beta`, plus `2 alpha + 2B beta` when r > 0
  rabenseifner,        //!< reduce-scatter by recursive halving + allgather by recursive doubling:
                       //!< `2l alpha + 2(p-1)/p B beta`, plus `3 alpha + 2B beta` when r > 0
  pipelined_tree,      //!< NCCL's double binary tree, pipelined: `2 floor(log2 N) alpha + 2B beta`
  linear,              //!< every rank to one root and back (Open MPI's basic linear):
                       //!< `2(N-1) alpha + 2(N-1) B beta`
};

//! Who chooses the algorithm of each Allreduce (cost_model::choose_allreduce).
enum class allreduce_rule : unsigned char {
  fixed,         //!< always the one algorithm given with the rule (ring unless said otherwise)
  open_mpi_4_1,  //!< as Open MPI 4.1's `coll/tuned` fixed decision chooses (cost_model::open_mpi_4_1_allreduce)
  nccl,          //!< as NCCL chooses, simplified to the cheaper of ring and pipelined tree (cost_model::nccl_allreduce)
};

//! The cost formulas of docs/algorithms.md ("The cost model") for N ranks. Values and indices are 4 bytes.
namespace cost_model {

//! L = ceil(log2 N): rounds of a binomial tree (log2 N when N is a power of two).
inline double log_ranks(int n) noexcept { return n > 1 ? std::ceil(std::log2(static_cast<double>(n))) : 0.0; }

//! Ring Allreduce of \p bytes per rank: `2(N-1) alpha + 2(N-1)/N bytes beta`.
inline cost_terms ring_allreduce(int n, double bytes) noexcept {
  if (n <= 1) return {};
  return {2.0 * (n - 1), 2.0 * (n - 1) / n * bytes};
}
//! Tree Allreduce of \p bytes per rank: `2L alpha + 2L bytes beta`.
inline cost_terms tree_allreduce(int n, double bytes) noexcept {
  const double l = log_ranks(n);
  return {2.0 * l, 2.0 * l * bytes};
}
//! floor(log2 N): the depth of a binary tree of N ranks, and the rounds of recursive
//! doubling among the largest power of two <= N ranks.
inline double floor_log_ranks(int n) noexcept {
  return n > 1 ? static_cast<double>(std::bit_width(static_cast<unsigned>(n)) - 1) : 0.0;
}
//! Recursive doubling of \p bytes: `l alpha + l B beta` with p = 2^l the largest power of
//! two <= N. When N is not a power of two, the first 2r ranks (r = N - p) pair up first: each
//! even one sends its whole buffer to its odd neighbour, which joins the exchange among p ranks
//! and sends the result back at the end: `+ 2 alpha + 2B beta`.
inline cost_terms recursive_doubling_allreduce(int n, double bytes) noexcept {
  if (n <= 1) return {};
  const double l = floor_log_ranks(n);
  const double rounds = std::has_single_bit(static_cast<unsigned>(n)) ? l : l + 2.0;
  return {rounds, rounds * bytes};
}
//! Rabenseifner's Allreduce of \p bytes (a reduce-scatter by recursive halving, then an
//! allgather by recursive doubling): `2l alpha + 2(p-1)/p B beta`, p = 2^l the largest power
//! of two <= N. When N is not a power of two the first 2r ranks (r = N - p) fold in as Open MPI
//! does: each pair swaps halves (one message of B/2 each way), the odd one returns its reduced
//! half (B/2) and drops out, and at the end receives the whole result (B):
//! `+ 3 alpha + 2B beta`.
inline cost_terms rabenseifner_allreduce(int n, double bytes) noexcept {
  if (n <= 1) return {};
  const double l = floor_log_ranks(n);
  const double p = std::exp2(l);
  cost_terms t{2.0 * l, 2.0 * (p - 1) / p * bytes};
  if (!std::has_single_bit(static_cast<unsigned>(n))) t += cost_terms{3.0, 2.0 * bytes};
  return t;
}
//! NCCL's tree Allreduce of \p bytes: a reduce up and a broadcast down a (double) binary tree
//! of depth floor(log2 N), pipelined in chunks so that the buffer's time is paid about once
//! each way: `2 floor(log2 N) alpha + 2B beta`. NCCL's own model (src/graph/tuning.cc) charges
//! its tree 2 log2(nodes) network latencies and half the ring's bus bandwidth; this is that
//! shape under one alpha and one beta.
inline cost_terms pipelined_tree_allreduce(int n, double bytes) noexcept {
  if (n <= 1) return {};
  return {2.0 * floor_log_ranks(n), 2.0 * bytes};
}
//! Linear Allreduce of \p bytes: the root receives N-1 buffers and sends N-1 back, one after
//! the other: `2(N-1) alpha + 2(N-1) B beta`.
inline cost_terms linear_allreduce(int n, double bytes) noexcept {
  if (n <= 1) return {};
  return {2.0 * (n - 1), 2.0 * (n - 1) * bytes};
}
//! Allreduce of \p bytes by algorithm \p a.
inline cost_terms allreduce(int n, double bytes, allreduce_algorithm a) noexcept {
  switch (a) {
    case allreduce_algorithm::ring:
      return ring_allreduce(n, bytes);
    case allreduce_algorithm::tree:
      return tree_allreduce(n, bytes);
    case allreduce_algorithm::recursive_doubling:
      return recursive_doubling_allreduce(n, bytes);
    case allreduce_algorithm::rabenseifner:
      return rabenseifner_allreduce(n, bytes);
    case allreduce_algorithm::pipelined_tree:
      return pipelined_tree_allreduce(n, bytes);
    case allreduce_algorithm::linear:
      return linear_allreduce(n, bytes);
  }
  return ring_allreduce(n, bytes);
}

//! The algorithm Open MPI 4.1 runs for a commutative MPI_Allreduce (a sum, a max) of
//! \p bytes over N ranks, whose elements are \p element_bytes each: the fixed decision of its
//! `coll/tuned` component (ompi/mca/coll/tuned/coll_tuned_decision_fixed.c, function
//! `ompi_coll_tuned_allreduce_intra_dec_fixed`, read at tag v4.1.4; the same table since
//! v4.1.0), which is the component that serves an intra-communicator of 2 ranks or more with
//! host buffers by default (priority 30, above `basic` and `libnbc` at 10; `han`, `adapt` and
//! `sm` default to priority 0; `self` serves one rank only), and which uses its fixed decision
//! unless `coll_tuned_use_dynamic_rules` is set.
//!
//! By rank count (first row that holds), the size thresholds in bytes of the whole buffer,
//! each meaning "below this size" (R recursive doubling, Rab Rabenseifner, T reduce + broadcast,
//! ring: the ring or the segmented ring):
//!
//! | ranks | choice by size |
//! |---|---|
//! | < 4 | < 8 ring, < 4096 R, < 8192 ring, < 16384 R, < 262144 ring, else Rab |
//! | < 8 | < 16 ring, < 8192 R, else Rab |
//! | < 16 | < 8192 R, else Rab |
//! | < 32 | < 64 ring, < 4096 R, else Rab |
//! | < 64 | < 128 ring, else Rab |
//! | < 128 | < 262144 R, else Rab |
//! | < 256 | < 131072 T, < 262144 R, else Rab |
//! | < 512 | < 4096 T, else Rab |
//! | < 2048 | < 2048 T, < 16384 R, else Rab |
//! | < 4096 | < 2048 T, < 4096 ring, < 16384 R, else Rab |
//! | otherwise | < 2048 T, < 16384 ring, < 32768 R, else Rab |
//!
//! In our terms: the decision's "segmented ring" is given no segment size, so it runs as the
//! plain ring (priced as ring); its "nonoverlapping" is a reduce to rank 0 then a broadcast,
//! priced as the binomial tree (Open MPI's own reduce and broadcast decisions pick k-nomial and
//! binary trees there, no deeper than L). Open MPI's ring falls back to recursive doubling when
//! the buffer has fewer elements than ranks, and its Rabenseifner to the linear algorithm when
//! it has fewer elements than p (the largest power of two <= N); both fallbacks are applied.
inline allreduce_algorithm open_mpi_4_1_allreduce(int n, double bytes, double element_bytes = 4) noexcept {
  using a = allreduce_algorithm;
  struct step {
    double below;  // bytes
    a algorithm;
  };
  struct row {
    int ranks_below;
    std::array<step, 6> steps;  // the last step's `below` is +infinity
  };
  constexpr double inf = INFINITY;
  static constexpr std::array<row, 11> table{{
      {4,
       {{{8, a::ring},
         {4096, a::recursive_doubling},
         {8192, a::ring},
         {16384, a::recursive_doubling},
         {262144, a::ring},
         {inf, a::rabenseifner}}}},
      {8, {{{16, a::ring}, {8192, a::recursive_doubling}, {inf, a::rabenseifner}}}},
      {16, {{{8192, a::recursive_doubling}, {inf, a::rabenseifner}}}},
      {32, {{{64, a::ring}, {4096, a::recursive_doubling}, {inf, a::rabenseifner}}}},
      {64, {{{128, a::ring}, {inf, a::rabenseifner}}}},
      {128, {{{262144, a::recursive_doubling}, {inf, a::rabenseifner}}}},
      {256, {{{131072, a::tree}, {262144, a::recursive_doubling}, {inf, a::rabenseifner}}}},
      {512, {{{4096, a::tree}, {inf, a::rabenseifner}}}},
      {2048, {{{2048, a::tree}, {16384, a::recursive_doubling}, {inf, a::rabenseifner}}}},
      {4096, {{{2048, a::tree}, {4096, a::ring}, {16384, a::recursive_doubling}, {inf, a::rabenseifner}}}},
      {std::numeric_limits<int>::max(),
       {{{2048, a::tree}, {16384, a::ring}, {32768, a::recursive_doubling}, {inf, a::rabenseifner}}}},
  }};
  if (n <= 1) return a::ring;
  const row* r = &table.back();
  for (const row& candidate : table)
    if (n < candidate.ranks_below) {
      r = &candidate;
      break;
    }
  a chosen = a::rabenseifner;
  for (const step& s : r->steps)
    if (bytes < s.below) {
      chosen = s.algorithm;
      break;
    }
  const double elements = element_bytes > 0 ? std::floor(bytes / element_bytes) : bytes;
  if (chosen == a::ring && elements < n) return a::recursive_doubling;
  if (chosen == a::rabenseifner && elements < std::exp2(floor_log_ranks(n))) return a::linear;
  return chosen;
}

//! The algorithm NCCL would run for an Allreduce of \p bytes over N ranks, simplified: the
//! cheaper under \p net of the ring and the pipelined tree (ring on a tie). NCCL picks the
//! algorithm and protocol of least predicted time from its own model (src/graph/tuning.cc in
//! NVIDIA/nccl), whose latencies and bandwidths differ by protocol (LL, LL128, Simple), by
//! link (NVLink, PCI, network), by channel count and by GPU generation, with NVLS, CollNet and
//! PAT besides and a tuner plugin able to override it all; this rule keeps only the shape of
//! its two network algorithms under one alpha and one beta. The tree wins while
//! `2(N-1-floor(log2 N)) alpha > (2 - 2(N-1)/N) B beta`: at small sizes and many ranks.
inline allreduce_algorithm nccl_allreduce(int n, double bytes, const network_params& net) noexcept {
  if (n <= 1) return allreduce_algorithm::ring;
  return pipelined_tree_allreduce(n, bytes).seconds(net) < ring_allreduce(n, bytes).seconds(net)
             ? allreduce_algorithm::pipelined_tree
             : allreduce_algorithm::ring;
}

//! The algorithm an Allreduce of \p bytes (elements of \p element_bytes) over N ranks runs as
//! under rule \p rule: \p fixed itself for allreduce_rule::fixed, else the engine's choice
//! (\p net matters to NCCL's only).
inline allreduce_algorithm choose_allreduce(allreduce_rule rule, allreduce_algorithm fixed, int n, double bytes,
                                            const network_params& net, double element_bytes = 4) noexcept {
  switch (rule) {
    case allreduce_rule::open_mpi_4_1:
      return open_mpi_4_1_allreduce(n, bytes, element_bytes);
    case allreduce_rule::nccl:
      return nccl_allreduce(n, bytes, net);
    case allreduce_rule::fixed:
      break;
  }
  return fixed;
}
//! Allreduce of \p bytes as rule \p rule chooses (see choose_allreduce).
inline cost_terms allreduce_by_rule(int n, double bytes, allreduce_rule rule, const network_params& net,
                                    allreduce_algorithm fixed = allreduce_algorithm::ring,
                                    double element_bytes = 4) noexcept {
  return allreduce(n, bytes, choose_allreduce(rule, fixed, n, bytes, net, element_bytes));
}
//! Binomial-tree broadcast of \p bytes: `L alpha + L bytes beta`.
inline cost_terms broadcast(int n, double bytes) noexcept {
  const double l = log_ranks(n);
  return {l, l * bytes};
}
//! Allgather where the ranks contribute \p total_bytes together (recursive doubling):
//! `L alpha + (N-1)/N total beta`, i.e. (N-1) times one rank's share when shares are equal.
inline cost_terms allgather(int n, double total_bytes) noexcept {
  if (n <= 1) return {};
  return {log_ranks(n), static_cast<double>(n - 1) / n * total_bytes};
}
//! Personalised all-to-all by pairwise exchange (N-1 rounds, one partner each):
//! `(N-1) alpha + busiest beta`, with \p busiest_bytes the most any one rank sends or
//! receives (excluding its block to itself).
inline cost_terms alltoall(int n, double busiest_bytes) noexcept {
  if (n <= 1) return {};
  return {static_cast<double>(n - 1), busiest_bytes};
}
//! Dissemination barrier: `L alpha`.
inline cost_terms barrier(int n) noexcept { return {log_ranks(n), 0.0}; }

//! Dense fp32 ring Allreduce of \p d parameters: `2(N-1) alpha + 2(N-1)/N 4d beta`.
inline cost_terms dense_allreduce(int n, double d) noexcept { return ring_allreduce(n, 4.0 * d); }
//! Broadcast of the k = f d indices: `L alpha + L 4 d f beta`.
inline cost_terms index_broadcast(int n, double d, double f) noexcept { return broadcast(n, 4.0 * d * f); }
//! AR-Topk: broadcast of the indices, then an Allreduce of the k values by algorithm \p a.
//! Ring: `+ 2(N-1) alpha + 2(N-1)/N 4 d f beta`; tree: `+ 2L alpha + 2L 4 d f beta`.
inline cost_terms ar_topk(int n, double d, double f, allreduce_algorithm a = allreduce_algorithm::ring) noexcept {
  return index_broadcast(n, d, f) + allreduce(n, 4.0 * d * f, a);
}
//! AR-Topk with indices every rank can draw itself (random-k): the Allreduce only.
inline cost_terms ar_topk_shared_indices(int n, double d, double f,
                                         allreduce_algorithm a = allreduce_algorithm::ring) noexcept {
  return allreduce(n, 4.0 * d * f, a);
}
//! Allgather of top-k values and indices: `L alpha + 2(N-1) 4 d f beta`.
inline cost_terms allgather_topk(int n, double d, double f) noexcept { return allgather(n, n * 8.0 * d * f); }

//! Allgather of one packet of \p packet_bytes (P) from every rank: `L alpha + (N-1) P beta`.
//! What an Allgather of quantized packets costs: their size is set by the layout and the
//! codec's options, not by a kept fraction.
inline cost_terms allgather_packets(int n, double packet_bytes) noexcept {
  return allgather(n, static_cast<double>(n) * packet_bytes);
}
//! The compressed allreduce of one rank's whole compressed gradient of \p packet_bytes (P):
//! an alltoall in which each rank sends and receives the N-1 shards that are not its own,
//! (N-1)/N P, then an Allgather of the N recompressed shards, P in all:
//! `(N-1) alpha + (N-1)/N P beta` plus `L alpha + (N-1)/N P beta`.
inline cost_terms compressed_allreduce(int n, double packet_bytes) noexcept {
  if (n <= 1) return {};
  return alltoall(n, static_cast<double>(n - 1) / n * packet_bytes) + allgather(n, packet_bytes);
}

//! Modeled seconds of the flexible collective's three candidates for N ranks, d parameters
//! and kept fraction f under \p net, in the order dense Allreduce, AR-Topk (by algorithm
//! \p a), Allgather top-k. AR-Topk is +infinity when the compressor has no index-selection
//! hook (\p ar_possible false). The flexible collective and the multi-objective policy
//! both price with this one function, so they cannot disagree on a cost.
inline std::array<double, 3> candidate_costs(int n, double d, double f, const network_params& net,
                                             allreduce_algorithm a = allreduce_algorithm::ring,
                                             bool ar_possible = true) noexcept {
  return {dense_allreduce(n, d).seconds(net), ar_possible ? ar_topk(n, d, f, a).seconds(net) : INFINITY,
          allgather_topk(n, d, f).seconds(net)};
}

//! What the flexible collective's four paths depend on besides N, d and f: which of them the
//! compressor and the communicator allow, and how a packet is sized.
struct path_pricing {
  allreduce_algorithm allreduce = allreduce_algorithm::ring;  //!< how AR-Topk's value Allreduce runs
  bool ar_possible = true;                                    //!< the compressor has an index-selection hook (AR-Topk)
  bool compressed_possible = false;  //!< shardable compressor and a communicator with alltoallv
  bool allgather_by_packet = false;  //!< price the Allgather by packet_bytes, not 8 bytes per kept value
  double packet_bytes = 0;           //!< one rank's whole packet (the Allgather's and the compressed allreduce's P)
};

//! The cost terms of the flexible collective's path \p k (0 dense Allreduce, 1 AR-Topk,
//! 2 Allgather, 3 compressed allreduce) for N ranks, d parameters and kept fraction f;
//! paths \p how does not allow are not priced here (see path_costs).
inline cost_terms path_terms(std::size_t k, int n, double d, double f, const path_pricing& how) noexcept {
  switch (k) {
    case 0:
      return dense_allreduce(n, d);
    case 1:
      return ar_topk(n, d, f, how.allreduce);
    case 2:
      return how.allgather_by_packet ? allgather_packets(n, how.packet_bytes) : allgather_topk(n, d, f);
    default:
      return compressed_allreduce(n, how.packet_bytes);
  }
}

//! Modeled seconds of the flexible collective's four paths under \p net, in the order dense
//! Allreduce, AR-Topk, Allgather, compressed allreduce; a path \p how does not allow is
//! +infinity. With `compressed_possible` and `allgather_by_packet` false the first three are
//! candidate_costs' (top-k compressors are priced as before).
inline std::array<double, 4> path_costs(int n, double d, double f, const network_params& net,
                                        const path_pricing& how) noexcept {
  return {path_terms(0, n, d, f, how).seconds(net),
          how.ar_possible ? path_terms(1, n, d, f, how).seconds(net) : INFINITY,
          path_terms(2, n, d, f, how).seconds(net),
          how.compressed_possible ? path_terms(3, n, d, f, how).seconds(net) : INFINITY};
}

}  // namespace cost_model

}  // namespace gravac
