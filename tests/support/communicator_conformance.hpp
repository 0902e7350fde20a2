#pragma once
//! \file communicator_conformance.hpp
//! \brief The communicator conformance suite: what gravac's collectives rely on from a
//! Communicator engine (ranks, exact and rank-identical reductions, allgatherv's layout,
//! alltoallv, broadcast from every root, barrier, and long mixed sequences of collectives),
//! checked on any engine over host memory.
//!
//! Every rank of the engine calls run_communicator_conformance (collectively, as with any
//! collective); each rank gets a conformance_log of named checks, which report_conformance
//! turns into Catch2 assertions. The two steps are apart because Catch2 2.x assertions are
//! not thread-safe: an engine whose ranks are threads (thread_communicator) runs the suite
//! in its ranks and reports on the test's thread after they joined; an engine whose ranks
//! are processes (MPI, a c10d process group) calls check_communicator_conformance, which does
//! both. The suite never stops early on a failed check and reads results only within the
//! sizes the engine returned, so a broken engine gives failed checks, not a hang or a crash
//! (all ranks make the same calls whatever they find). It is deterministic (no randomness)
//! and takes well under a second at 4 ranks.
//!
//! Values are chosen so that every sum is exact in any order of summation (small integers
//! plus dyadic fractions, at most 23 significant bits for float up to 128 ranks), so results
//! are compared with ==, element for element, against the value computed here; one case per
//! type sums rounded values instead, whose bits must only agree between the ranks.

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "gravac/concepts.hpp"
#include "gravac/memory.hpp"

namespace gravac::test {

//! One named check of the suite, as one rank saw it.
struct conformance_check {
  std::string what;    //!< the collective and the case
  bool passed = true;  //!< whether it held
  std::string detail;  //!< on failure: the first difference found
};

//! What one rank's run of the suite found.
struct conformance_log {
  int rank = -1;                          //!< the rank that ran it (comm.rank())
  std::vector<conformance_check> checks;  //!< every check, in the order made (the same on every rank)
  bool alltoallv_tested = false;          //!< whether the engine had alltoallv (AlltoallCommunicator)
  bool broadcast_values_tested = false;   //!< whether the engine had broadcast_values<T>

  //! Records check \p what, with \p detail when it failed.
  void record(std::string what, bool ok, std::string detail = {}) {
    checks.push_back({std::move(what), ok, ok ? std::string() : std::move(detail)});
  }
  //! Number of failed checks.
  [[nodiscard]] std::size_t failures() const {
    return static_cast<std::size_t>(
        std::count_if(checks.begin(), checks.end(), [](const auto& c) { return !c.passed; }));
  }
};

namespace conformance_detail {

inline std::span<const std::byte> bytes_of(const auto& buf) { return std::as_bytes(std::span(buf.data(), buf.size())); }

// The first index where a and b differ (a.size() when they are equal; sizes must match).
template <class T>
std::size_t first_difference(std::span<const T> a, std::span<const T> b) {
  for (std::size_t i = 0; i < a.size(); ++i)
    if (std::memcmp(&a[i], &b[i], sizeof(T)) != 0) return i;
  return a.size();
}

template <class T>
std::string at_index(std::size_t i, const T& got, const T& want) {
  std::ostringstream os;
  os.precision(17);
  if constexpr (std::same_as<T, std::byte>)
    os << "element " << i << ": got " << static_cast<int>(got) << ", expected " << static_cast<int>(want);
  else
    os << "element " << i << ": got " << got << ", expected " << want;
  return os.str();
}

// Compares got with want element for element (bit for bit) and records the result.
template <class T>
void record_equal(conformance_log& log, std::string what, std::span<const T> got, std::span<const T> want) {
  if (got.size() != want.size()) {
    log.record(std::move(what), false,
               "size " + std::to_string(got.size()) + ", expected " + std::to_string(want.size()));
    return;
  }
  const std::size_t i = first_difference(got, want);
  log.record(std::move(what), i == got.size(), i == got.size() ? std::string() : at_index(i, got[i], want[i]));
}

// Every rank's bytes through the engine's allgatherv, as (concatenation, sizes).
template <class M>
std::pair<std::vector<std::byte>, std::vector<std::size_t>> gather(M& comm, std::span<const std::byte> mine) {
  typename M::byte_buffer out;
  std::vector<std::size_t> sizes;
  comm.allgatherv(mine, out, sizes);
  const auto b = bytes_of(out);
  return {std::vector<std::byte>(b.begin(), b.end()), std::move(sizes)};
}

// Records whether \p bytes are the same on every rank: all ranks' copies are gathered and
// compared with rank 0's (relies on allgatherv, checked before the reductions).
template <class M>
void record_same_on_every_rank(M& comm, conformance_log& log, const std::string& what,
                               std::span<const std::byte> bytes) {
  const auto [all, sizes] = gather(comm, bytes);
  const auto n = static_cast<std::size_t>(comm.size());
  bool ok = sizes.size() == n && all.size() == n * bytes.size();
  for (std::size_t q = 0; ok && q < n; ++q) ok = sizes[q] == bytes.size();
  std::string detail = ok ? std::string() : "allgatherv of the results returned unexpected sizes";
  for (std::size_t q = 1; ok && q < n; ++q)
    if (!std::equal(all.begin() + static_cast<std::ptrdiff_t>(q * bytes.size()),
                    all.begin() + static_cast<std::ptrdiff_t>((q + 1) * bytes.size()), all.begin())) {
      ok = false;
      detail = "rank " + std::to_string(q) + "'s result differs from rank 0's";
    }
  log.record(what + ": identical bits on every rank", ok, detail);
}

// Rank r's contribution to element i of a sum: an integer in [-32, 32] plus a multiple of
// 2^-10 (float) or 2^-20 (double). Partial sums of up to 128 ranks stay below 2^13, so they
// are exact in any order (float: 13 + 10 bits of 24).
template <class T>
T summand(int r, std::size_t i, int salt) {
  const auto ur = static_cast<std::size_t>(r), us = static_cast<std::size_t>(salt);
  const double whole = static_cast<double>((ur * 131 + i * 29 + us * 7) % 65) - 32.0;
  const double frac_units = std::same_as<T, float> ? 1024.0 : 1048576.0;
  const double frac = static_cast<double>((ur * 977 + i * 3 + us) % static_cast<std::size_t>(frac_units)) / frac_units;
  return static_cast<T>(whole + frac);
}

// Rank r's contribution to element i of a maximum: negative, except that element i's
// maximum is held by one rank ((i + salt) % n) for every third i, and by all ranks at once
// for every seventh (ties).
inline double max_input(int r, int n, std::size_t i, int salt) {
  const auto ur = static_cast<std::size_t>(r), us = static_cast<std::size_t>(salt);
  if (i % 7 == 3) return -2.5;
  if (i % 3 == 0 && static_cast<int>((i + us) % static_cast<std::size_t>(n)) == r)
    return 1000.0 + static_cast<double>(i);
  if (i % 11 == 5) return -1e300 + static_cast<double>(r);  // very negative: an engine starting from 0 shows
  return -static_cast<double>((ur * 3 + i * 5 + us) % 17) - 0.5;
}

// The byte at position i of a block from \p src for \p dst in case \p c.
inline std::byte pattern(int src, int dst, std::size_t i, int c) {
  return static_cast<std::byte>((static_cast<std::size_t>(src) * 53 + static_cast<std::size_t>(dst) * 19 + i * 7 +
                                 static_cast<std::size_t>(c) * 101 + 1) &
                                0xff);
}

// allgatherv's cases: the length rank r sends in case c (of n ranks).
inline constexpr int gather_cases = 6;
inline std::size_t gather_length(int r, int n, int c) {
  const auto ur = static_cast<std::size_t>(r);
  switch (c) {
    case 0:
      return ur * 3 + 1;  // every rank different, none empty
    case 1:
      return r % 2 == 0 ? 0 : ur + 5;  // every other rank empty
    case 2:
      return 0;  // all empty
    case 3:
      return r == n - 1 ? 1000 : 0;  // only the last rank sends
    case 4:
      return 5000 - ur * 17;  // a few thousand bytes each
    default:
      return r == 0 ? 0 : 1;  // one byte each but rank 0 (smaller than every earlier output)
  }
}

// alltoallv's cases: the length of the block from src to dst in case c.
inline constexpr int alltoall_cases = 5;
inline std::size_t alltoall_length(int src, int dst, int c) {
  const auto s = static_cast<std::size_t>(src), d = static_cast<std::size_t>(dst);
  switch (c) {
    case 0:
      return (s * 3 + d * 5 + 1) % 7;  // differs per pair (not symmetric), some empty
    case 1:
      return src == dst ? 0 : s + 2 * d + 1;  // nothing to itself
    case 2:
      return 0;  // all empty
    case 3:
      return 1000 + 13 * s + 7 * d;  // large blocks
    default:
      return src == dst ? 3 : 0;  // only to itself
  }
}

template <class M>
bool engine_has_alltoallv(const M& comm) {
  if constexpr (!AlltoallCommunicator<M>)
    return false;
  else if constexpr (requires { comm.has_alltoallv(); })
    return comm.has_alltoallv();  // communicator_ref: decided by the engine it refers to
  else
    return true;
}

template <class M>
inline constexpr bool has_broadcast_values = requires(M& m, std::span<double> d, std::span<std::int32_t> i) {
  m.broadcast_values(d, 0);
  m.broadcast_values(i, 0);
};

// --- the parts of the suite -------------------------------------------------------------

// rank() in [0, size()), size() the same on every rank, ranks distinct (allgatherv of them).
template <class M>
void check_ranks(M& comm, conformance_log& log) {
  const int me = comm.rank(), n = comm.size();
  log.record("size() is positive", n > 0, "size() = " + std::to_string(n));
  log.record("rank() is in [0, size())", me >= 0 && me < n,
             "rank() = " + std::to_string(me) + ", size() = " + std::to_string(n));
  const std::int32_t mine[2] = {me, n};
  const auto [all, sizes] = gather(comm, std::as_bytes(std::span(mine)));
  bool shape = sizes.size() == static_cast<std::size_t>(n) && all.size() == sizeof(mine) * static_cast<std::size_t>(n);
  for (std::size_t q = 0; shape && q < sizes.size(); ++q) shape = sizes[q] == sizeof(mine);
  log.record("allgatherv of (rank, size): one 8-byte block per rank", shape);
  if (!shape) return;
  std::vector<std::int32_t> got(all.size() / sizeof(std::int32_t));
  std::memcpy(got.data(), all.data(), all.size());
  bool ranks_ok = true, sizes_ok = true;
  std::string detail;
  for (int q = 0; q < n; ++q) {
    if (got[2 * static_cast<std::size_t>(q)] != q && ranks_ok) {
      ranks_ok = false;
      detail = "block " + std::to_string(q) + " came from rank " + std::to_string(got[2 * static_cast<std::size_t>(q)]);
    }
    sizes_ok = sizes_ok && got[2 * static_cast<std::size_t>(q) + 1] == n;
  }
  log.record("ranks are distinct, 0..size()-1, gathered in rank order", ranks_ok, detail);
  log.record("size() is the same on every rank", sizes_ok);
}

// allreduce_sum of T: exact sums of every length (empty, one, odd, a few thousand, not a
// multiple of the rank count), in a subspan whose neighbours must stay untouched, and the
// same bits on every rank (a reduction tree that differs per rank would break training).
template <class T, class M>
void check_allreduce_sum(M& comm, conformance_log& log, const char* type) {
  const int me = comm.rank(), n = comm.size();
  const auto un = static_cast<std::size_t>(n);
  for (std::size_t len :
       {std::size_t{0}, std::size_t{1}, std::size_t{7}, 3 * un + 1, std::size_t{4096}, std::size_t{4099}}) {
    const std::string what = "allreduce_sum<" + std::string(type) + "> of " + std::to_string(len) + " elements";
    constexpr std::size_t guard = 3;
    std::vector<T> buf(len + 2 * guard, T(-77.25));
    std::vector<T> want(len);
    for (std::size_t i = 0; i < len; ++i) {
      buf[guard + i] = summand<T>(me, i, static_cast<int>(len));
      double s = 0;
      for (int q = 0; q < n; ++q) s += static_cast<double>(summand<T>(q, i, static_cast<int>(len)));
      want[i] = static_cast<T>(s);
    }
    comm.allreduce_sum(std::span<T>(buf.data() + guard, len));
    record_equal<T>(log, what + ": exact sums", std::span<const T>(buf.data() + guard, len), want);
    bool guards = true;
    for (std::size_t i = 0; i < guard; ++i) guards = guards && buf[i] == T(-77.25) && buf[guard + len + i] == T(-77.25);
    log.record(what + ": elements outside the span untouched", guards);
    record_same_on_every_rank(comm, log, what, std::as_bytes(std::span<const T>(buf.data() + guard, len)));
  }
  // Inexact sums (values of many exponents, rounded in every addition): the bits depend on
  // the order of summation, which must be the same on every rank; the sums must be close.
  constexpr std::size_t len = 4099;
  const std::string what = "allreduce_sum<" + std::string(type) + "> of " + std::to_string(len) + " inexact values";
  std::vector<T> buf(len);
  std::vector<double> exact(len, 0.0);
  const auto inexact = [](int r, std::size_t i) {
    const double scale = static_cast<double>(1u << ((static_cast<std::size_t>(r) * 5 + i) % 24));
    return static_cast<T>(scale / (3.0 + static_cast<double>((i * 7 + static_cast<std::size_t>(r)) % 13)));
  };
  for (std::size_t i = 0; i < len; ++i) {
    buf[i] = inexact(me, i);
    for (int q = 0; q < n; ++q) exact[i] += static_cast<double>(inexact(q, i));
  }
  comm.allreduce_sum(std::span<T>(buf));
  std::size_t far = len;
  for (std::size_t i = 0; i < len && far == len; ++i)
    if (std::abs(static_cast<double>(buf[i]) - exact[i]) > 1e-5 * std::abs(exact[i])) far = i;
  log.record(what + ": within rounding of the exact sums", far == len,
             far == len ? std::string() : at_index(far, static_cast<double>(buf[far]), exact[far]));
  record_same_on_every_rank(comm, log, what, std::as_bytes(std::span<const T>(buf)));
}

// allreduce_max of double: negative values (an engine starting from 0 fails), a maximum
// held by one rank, ties, and the same bits on every rank.
template <class M>
void check_allreduce_max(M& comm, conformance_log& log) {
  const int me = comm.rank(), n = comm.size();
  for (std::size_t len : {std::size_t{0}, std::size_t{1}, std::size_t{7}, std::size_t{2051}}) {
    const std::string what = "allreduce_max<double> of " + std::to_string(len) + " elements";
    std::vector<double> buf(len), want(len);
    for (std::size_t i = 0; i < len; ++i) {
      buf[i] = max_input(me, n, i, static_cast<int>(len));
      want[i] = max_input(0, n, i, static_cast<int>(len));
      for (int q = 1; q < n; ++q) want[i] = std::max(want[i], max_input(q, n, i, static_cast<int>(len)));
    }
    comm.allreduce_max(std::span<double>(buf));
    record_equal<double>(log, what + ": elementwise maxima", buf, want);
    record_same_on_every_rank(comm, log, what, std::as_bytes(std::span<const double>(buf)));
  }
}

// The received blocks of an allgatherv or alltoallv: \p sizes (named \p name) holds
// length(q) for each of the \p n ranks q, and \p out their blocks back to back in rank
// order, byte i of block q being expected(q, i). On the first difference, \p detail says it.
template <class Buffer, class Length, class Expected>
bool check_blocks(const char* name, const std::vector<std::size_t>& sizes, const Buffer& out, int n, Length length,
                  Expected expected, std::string& detail) {
  if (sizes.size() != static_cast<std::size_t>(n)) {
    detail = std::string(name) + " has " + std::to_string(sizes.size()) + " entries, expected " + std::to_string(n);
    return false;
  }
  std::size_t total = 0;
  for (int q = 0; q < n; ++q) {
    const std::size_t want = length(q);
    if (sizes[static_cast<std::size_t>(q)] != want) {
      detail = std::string(name) + "[" + std::to_string(q) +
               "] = " + std::to_string(sizes[static_cast<std::size_t>(q)]) + ", expected " + std::to_string(want);
      return false;
    }
    total += want;
  }
  const auto got = bytes_of(out);
  if (got.size() != total) {
    detail = "output holds " + std::to_string(got.size()) + " bytes, expected " + std::to_string(total);
    return false;
  }
  std::size_t at = 0;
  for (int q = 0; q < n; ++q)
    for (std::size_t i = 0; i < length(q); ++i, ++at)
      if (got[at] != expected(q, i)) {
        detail = "byte " + std::to_string(i) + " of rank " + std::to_string(q) + "'s block (output byte " +
                 std::to_string(at) + ") is wrong";
        return false;
      }
  return true;
}

// One allgatherv of case c into the reused \p out / \p sizes: sizes, total size (the buffer
// must be resized, also down) and every rank's bytes back to back in rank order.
template <class M>
bool allgatherv_case(M& comm, int c, typename M::byte_buffer& out, std::vector<std::size_t>& sizes,
                     std::string& detail) {
  const int me = comm.rank(), n = comm.size();
  std::vector<std::byte> mine(gather_length(me, n, c));
  for (std::size_t i = 0; i < mine.size(); ++i) mine[i] = pattern(me, -1, i, c);
  comm.allgatherv(std::span<const std::byte>(mine), out, sizes);
  return check_blocks(
      "sizes", sizes, out, n, [&](int q) { return gather_length(q, n, c); },
      [&](int q, std::size_t i) { return pattern(q, -1, i, c); }, detail);
}

template <class M>
void check_allgatherv(M& comm, conformance_log& log) {
  typename M::byte_buffer out;
  out.resize(100000);  // a stale, larger output: allgatherv must resize it
  std::vector<std::size_t> sizes(static_cast<std::size_t>(comm.size()) + 3, 999);  // stale, wrong length
  for (int round = 0; round < 2; ++round)  // the same buffers, reused across every case twice
    for (int c = 0; c < gather_cases; ++c) {
      std::string detail;
      const bool ok = allgatherv_case(comm, c, out, sizes, detail);
      log.record("allgatherv case " + std::to_string(c) + " (round " + std::to_string(round) +
                     ", reused output): sizes and bytes in rank order",
                 ok, detail);
    }
}

// One alltoallv of case c: the blocks addressed to this rank, in source-rank order, with
// their sizes.
template <class M>
bool alltoallv_case(M& comm, int c, typename M::byte_buffer& out, std::vector<std::size_t>& recv_sizes,
                    std::string& detail) {
  const int me = comm.rank(), n = comm.size();
  std::vector<std::size_t> send_sizes(static_cast<std::size_t>(n));
  std::vector<std::byte> send;
  for (int d = 0; d < n; ++d) {
    send_sizes[static_cast<std::size_t>(d)] = alltoall_length(me, d, c);
    for (std::size_t i = 0; i < send_sizes[static_cast<std::size_t>(d)]; ++i) send.push_back(pattern(me, d, i, c));
  }
  comm.alltoallv(std::span<const std::byte>(send), std::span<const std::size_t>(send_sizes), out, recv_sizes);
  return check_blocks(
      "recv_sizes", recv_sizes, out, n, [&](int src) { return alltoall_length(src, me, c); },
      [&](int src, std::size_t i) { return pattern(src, me, i, c); }, detail);
}

template <class M>
void check_alltoallv(M& comm, conformance_log& log) {
  typename M::byte_buffer out;
  out.resize(50000);  // stale and larger: must be resized
  std::vector<std::size_t> recv_sizes(1, 999);
  for (int round = 0; round < 2; ++round)
    for (int c = 0; c < alltoall_cases; ++c) {
      std::string detail;
      const bool ok = alltoallv_case(comm, c, out, recv_sizes, detail);
      log.record("alltoallv case " + std::to_string(c) + " (round " + std::to_string(round) +
                     "): blocks for this rank in source-rank order, recv sizes",
                 ok, detail);
    }
}

// broadcast of bytes from root: every rank ends with root's bytes.
template <class M>
bool broadcast_case(M& comm, int root, std::size_t len, int c) {
  std::vector<std::byte> buf(len, std::byte{0xAB});
  if (comm.rank() == root)
    for (std::size_t i = 0; i < len; ++i) buf[i] = pattern(root, -2, i, c);
  comm.broadcast(std::span<std::byte>(buf), root);
  for (std::size_t i = 0; i < len; ++i)
    if (buf[i] != pattern(root, -2, i, c)) return false;
  return true;
}

// broadcast and broadcast_values from every root, zero-length included.
template <class M>
void check_broadcast(M& comm, conformance_log& log) {
  const int n = comm.size();
  for (int root = 0; root < n; ++root)
    for (std::size_t len : {std::size_t{0}, std::size_t{1}, std::size_t{13}, std::size_t{3000}})
      log.record("broadcast of " + std::to_string(len) + " bytes from root " + std::to_string(root),
                 broadcast_case(comm, root, len, static_cast<int>(len % 251)));
  if constexpr (has_broadcast_values<M>) {
    log.broadcast_values_tested = true;
    for (int root = 0; root < n; ++root)
      for (std::size_t len : {std::size_t{0}, std::size_t{5}, std::size_t{1025}}) {
        std::vector<double> d(len, -1.0), dwant(len);
        std::vector<std::int32_t> k(len, -1), kwant(len);
        for (std::size_t i = 0; i < len; ++i) {
          dwant[i] = root * 1.5 + static_cast<double>(i) * 0.25 - 3.0;
          kwant[i] = root * 100000 - static_cast<std::int32_t>(i);
        }
        if (comm.rank() == root) {
          d = dwant;
          k = kwant;
        }
        comm.broadcast_values(std::span<double>(d), root);
        comm.broadcast_values(std::span<std::int32_t>(k), root);
        const std::string what = " of " + std::to_string(len) + " values from root " + std::to_string(root);
        record_equal<double>(log, "broadcast_values<double>" + what, d, dwant);
        record_equal<std::int32_t>(log, "broadcast_values<int32>" + what, k, kwant);
      }
  }
}

// 50 rounds of every collective in turn, with lengths and roots that change per round:
// an engine that mixes up tags, sequence numbers or buffers between calls shows here.
template <class M>
void check_mixed_rounds(M& comm, conformance_log& log, bool alltoall) {
  const int me = comm.rank(), n = comm.size();
  constexpr int rounds = 50;
  constexpr int kinds = 7;
  const char* names[kinds] = {"allreduce_sum<float>",  "allgatherv", "broadcast",
                              "allreduce_max<double>", "alltoallv",  "barrier",
                              "allreduce_sum<double>"};
  int done[kinds] = {}, good[kinds] = {};
  std::string first_bad[kinds];
  typename M::byte_buffer out;
  std::vector<std::size_t> sizes;
  for (int k = 0; k < rounds; ++k) {
    const int kind = k % kinds;
    const auto len = static_cast<std::size_t>(1 + (k * 37) % 300);
    bool ok = true;
    std::string detail;
    switch (kind) {
      case 0:
      case 6: {
        const bool as_float = kind == 0;
        std::vector<double> want(len);
        for (std::size_t i = 0; i < len; ++i) {
          double s = 0;
          for (int q = 0; q < n; ++q)
            s += as_float ? static_cast<double>(summand<float>(q, i, k)) : summand<double>(q, i, k);
          want[i] = s;
        }
        if (as_float) {
          std::vector<float> v(len);
          for (std::size_t i = 0; i < len; ++i) v[i] = summand<float>(me, i, k);
          comm.allreduce_sum(std::span<float>(v));
          for (std::size_t i = 0; ok && i < len; ++i) ok = v[i] == static_cast<float>(want[i]);
        } else {
          std::vector<double> v(len);
          for (std::size_t i = 0; i < len; ++i) v[i] = summand<double>(me, i, k);
          comm.allreduce_sum(std::span<double>(v));
          for (std::size_t i = 0; ok && i < len; ++i) ok = v[i] == want[i];
        }
        break;
      }
      case 1:
        ok = allgatherv_case(comm, k % gather_cases, out, sizes, detail);
        break;
      case 2:
        ok = broadcast_case(comm, k % n, len, k);
        break;
      case 3: {
        std::vector<double> v(len), want(len);
        for (std::size_t i = 0; i < len; ++i) {
          v[i] = max_input(me, n, i, k);
          want[i] = max_input(0, n, i, k);
          for (int q = 1; q < n; ++q) want[i] = std::max(want[i], max_input(q, n, i, k));
        }
        comm.allreduce_max(std::span<double>(v));
        ok = v == want;
        break;
      }
      case 4:
        if constexpr (AlltoallCommunicator<M>) {
          if (!alltoall) continue;  // the same on every rank: the engine's type decides
          ok = alltoallv_case(comm, k % alltoall_cases, out, sizes, detail);
        } else {
          continue;
        }
        break;
      default:
        comm.barrier();
        break;
    }
    ++done[kind];
    good[kind] += ok;
    if (!ok && first_bad[kind].empty()) first_bad[kind] = "first wrong in round " + std::to_string(k) + " " + detail;
  }
  for (int kind = 0; kind < kinds; ++kind)
    if (done[kind])
      log.record("mixed rounds: " + std::string(names[kind]) + " correct in all " + std::to_string(done[kind]) +
                     " of its rounds",
                 good[kind] == done[kind], first_bad[kind]);
}

}  // namespace conformance_detail

//! Runs the conformance suite on this rank of \p comm; every rank must call it (it makes the
//! same sequence of collectives on every rank, whatever it finds). Checks, in order:
//! - ranks: rank() in [0, size()), size() equal everywhere, ranks distinct and gathered in order;
//! - allgatherv: sizes and bytes back to back in rank order, ranks of different lengths,
//!   some or all empty, the output buffer and sizes reused (and shrunk) across calls;
//! - allreduce_sum on float and double: exact sums for lengths 0, 1, 7, 3n+1, 4096, 4099,
//!   neighbouring memory untouched, identical bits on every rank; and inexact sums (rounded,
//!   so their bits show the order of summation) identical on every rank;
//! - allreduce_max on double: negatives, a maximum held by one rank, ties, identical bits;
//! - alltoallv (AlltoallCommunicator only): blocks in source-rank order, per-pair lengths,
//!   empty blocks, recv sizes;
//! - broadcast and broadcast_values (when the engine has it) from every root, empty included;
//! - barrier, then 50 rounds of mixed collectives (tag and ordering mix-ups).
//! Requires an engine over host memory (the suite reads and writes the spans it passes).
template <Communicator M>
requires std::same_as<typename M::memory_space, host_space> conformance_log run_communicator_conformance(M& comm) {
  namespace cd = conformance_detail;
  conformance_log log;
  log.rank = comm.rank();
  cd::check_ranks(comm, log);
  cd::check_allgatherv(comm, log);
  cd::check_allreduce_sum<float>(comm, log, "float");
  cd::check_allreduce_sum<double>(comm, log, "double");
  cd::check_allreduce_max(comm, log);
  log.alltoallv_tested = cd::engine_has_alltoallv(comm);
  if constexpr (AlltoallCommunicator<M>)
    if (log.alltoallv_tested) cd::check_alltoallv(comm, log);
  cd::check_broadcast(comm, log);
  comm.barrier();
  comm.barrier();
  log.record("barrier() returned, twice in a row", true);
  if constexpr (AlltoallCommunicator<M>)
    cd::check_mixed_rounds(comm, log, log.alltoallv_tested);
  else
    cd::check_mixed_rounds(comm, log, false);
  comm.barrier();
  return log;
}

//! Turns one rank's \p log into Catch2 assertions, one CHECK per recorded check, the failed
//! ones with what was checked and the first difference. Call it from the test's own thread.
inline void report_conformance(const conformance_log& log) {
  INFO("communicator conformance, rank " << log.rank);
  CHECK(!log.checks.empty());
  for (const auto& c : log.checks) {
    INFO(c.what << (c.passed ? std::string() : ": " + c.detail));
    CHECK(c.passed);
  }
}

//! Runs the suite and reports it with Catch2 on this rank: for engines whose ranks are
//! processes (MPI, a c10d process group), where every rank has its own Catch2 session. All
//! ranks call it collectively. Engines whose ranks are threads of one process call
//! run_communicator_conformance in the ranks and report_conformance after they joined.
template <Communicator M>
requires std::same_as<typename M::memory_space, host_space> conformance_log check_communicator_conformance(M& comm) {
  auto log = run_communicator_conformance(comm);
  report_conformance(log);
  return log;
}

}  // namespace gravac::test
