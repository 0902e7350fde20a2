#pragma once
//! \file wire_bytes.hpp
//! \brief What one rank sends and receives on the wire for one collective call, by the
//! algorithm the call runs as. One set of rules for both counters: the collectives fill
//! step_report::wire_bytes_sent / wire_bytes_received with them, and simulated_communicator
//! adds them up in wire_bytes_sent() / wire_bytes_received(), so a report and the simulated
//! network agree to the byte. docs/algorithms.md, "Wire bytes", says why each rule is what
//! it is (exact for a ring, a per-rank average for a tree).
//!
//! Every rule is 0 with one rank: nothing leaves the process.

#include <bit>

#include "gravac/core/step.hpp"
#include "gravac/network/cost_model.hpp"

namespace gravac {

//! Bytes one rank sends and receives in one or more collective calls, and the rule of
//! each call kind over \p n ranks (static members, so the rules carry the type's name and
//! claim no short name of their own in namespace gravac).
struct wire_bytes {
  double sent = 0;      //!< bytes this rank puts on the wire
  double received = 0;  //!< bytes this rank takes off the wire

  //! Allreduce of \p bytes: 2(N-1)/N of the buffer each way (a ring's reduce-scatter and
  //! allgather, 2(N-1) blocks of B/N; the per-rank average of a tree's messages).
  static constexpr wire_bytes allreduce(int n, double bytes) noexcept {
    if (n <= 1) return {};
    const double b = 2.0 * (n - 1) / n * bytes;
    return {b, b};
  }
  //! Allreduce of \p bytes (B) run as algorithm \p a, per rank (averaged over the ranks where
  //! ranks differ, so the totals balance). p = 2^l is the largest power of two <= N, r = N - p.
  //! - ring, tree, pipelined tree, linear: 2(N-1)/N B each way (as allreduce(n, bytes)): every
  //!   one of them moves 2(N-1) B in all (a ring's 2N(N-1) blocks of B/N, a tree's or the
  //!   linear root's 2(N-1) messages of B, a double tree's 2 x 2(N-1) halves).
  //! - recursive doubling: l B each way when N is a power of two; otherwise (p l + 2r)/N B, the
  //!   average of l B on the N - 2r ranks that are not folded in, (l + 1) B on the r that
  //!   receive a neighbour's buffer and return the result, and B on the r neighbours.
  //! - Rabenseifner: 2(p-1)/p B each way when N is a power of two; otherwise
  //!   (2(p-1) + 5r/2)/N B: the p ranks of the exchange move 2(p-1)/p B each, and every folded
  //!   pair moves 5/2 B more (two halves swapped, a reduced half returned, the result sent back).
  static constexpr wire_bytes allreduce(int n, double bytes, allreduce_algorithm a) noexcept {
    if (n <= 1) return {};
    const auto un = static_cast<unsigned>(n);
    const double p = static_cast<double>(std::bit_floor(un));
    const double l = static_cast<double>(std::bit_width(un) - 1);
    const double r = n - p;
    double b = 2.0 * (n - 1) / n * bytes;
    if (a == allreduce_algorithm::recursive_doubling)
      b = r == 0 ? l * bytes : (p * l + 2.0 * r) / n * bytes;
    else if (a == allreduce_algorithm::rabenseifner)
      b = r == 0 ? 2.0 * (p - 1) / p * bytes : (2.0 * (p - 1) + 2.5 * r) / n * bytes;
    return {b, b};
  }
  //! Allgather(v) of blocks summing to \p total bytes, this rank's block \p own bytes:
  //! every other block in, and as many forwarded out (a ring passes on N-1 blocks).
  static constexpr wire_bytes allgather(int n, double total, double own) noexcept {
    if (n <= 1) return {};
    return {total - own, total - own};
  }
  //! Broadcast of \p bytes: received by every rank but the root; sent is the per-rank
  //! average (N-1)/N of a binomial tree's N-1 messages, so the totals over ranks balance.
  static constexpr wire_bytes broadcast(int n, double bytes, bool is_root) noexcept {
    if (n <= 1) return {};
    return {static_cast<double>(n - 1) / n * bytes, is_root ? 0.0 : bytes};
  }
  //! Alltoall(v): the blocks addressed to the other ranks out, the blocks from them in
  //! (exact: a pairwise exchange sends each block once, directly).
  static constexpr wire_bytes alltoall(int n, double to_others, double from_others) noexcept {
    if (n <= 1) return {};
    return {to_others, from_others};
  }

  //! Adds the bytes of another call.
  constexpr wire_bytes& operator+=(const wire_bytes& o) noexcept {
    sent += o.sent;
    received += o.received;
    return *this;
  }
  //! The bytes of two calls.
  friend constexpr wire_bytes operator+(wire_bytes a, const wire_bytes& b) noexcept { return a += b; }
  //! Equal counts (exact: tests compare the two counters bit for bit).
  friend constexpr bool operator==(const wire_bytes&, const wire_bytes&) noexcept = default;
};

//! The wire bytes of the Allreduce of \p bytes that \p comm has just made: by the algorithm
//! it was charged as where the engine says (a simulated network's `last_allreduce()`, also
//! through communicator_ref), else a ring's. Collectives call it right after each Allreduce,
//! so their reports equal the simulated network's counts under any allreduce_rule.
template <class M>
wire_bytes last_allreduce_wire_bytes(const M& comm, double bytes) {
  if constexpr (requires { comm.last_allreduce(); })
    return wire_bytes::allreduce(comm.size(), bytes, comm.last_allreduce());
  else
    return wire_bytes::allreduce(comm.size(), bytes);
}

//! Writes \p w into the report's wire-byte fields (what a collective does once per step).
inline void set_wire_bytes(step_report& r, const wire_bytes& w) noexcept {
  r.wire_bytes_sent = w.sent;
  r.wire_bytes_received = w.received;
}

}  // namespace gravac
