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
#include <cmath>
#include <cstddef>

#include "gravac/error.hpp"

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

//! How an Allreduce is performed (what its cost formula is).
enum class allreduce_algorithm : unsigned char {
  ring,  //!< reduce-scatter + allgather around a ring: 2(N-1) messages, 2(N-1)/N of the bytes
  tree,  //!< binomial tree reduce + broadcast: 2L messages, 2L times the bytes
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
//! Allreduce of \p bytes by algorithm \p a.
inline cost_terms allreduce(int n, double bytes, allreduce_algorithm a) noexcept {
  return a == allreduce_algorithm::ring ? ring_allreduce(n, bytes) : tree_allreduce(n, bytes);
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
