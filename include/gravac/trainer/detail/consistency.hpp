#pragma once
//! \file
//! \brief The debug check that every rank took the same decision for a step: a hash of
//! the step parameters is compared across the ranks by a tiny allreduce (trainer option
//! `check_consistency`). Ranks that diverge would otherwise send packets of different
//! shapes or pick different indices: at best silently wrong averages, at worst a hang.

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <tuple>
#include <vector>

#include "gravac/core/error.hpp"
#include "gravac/core/layout.hpp"
#include "gravac/core/step.hpp"

namespace gravac::detail {

//! Hash of everything in \p p that changes what a rank sends (bit patterns of the
//! doubles, so -0.0 and 0.0 or two NaNs with different payloads count as different).
inline std::uint64_t hash_step_params(const step_params& p) noexcept {
  const auto bits = [](double d) {
    std::uint64_t u = 0;
    std::memcpy(&u, &d, sizeof u);
    return u;
  };
  std::uint64_t h = fnv1a_u64(p.step, 0xcbf29ce484222325ull);
  h = fnv1a_u64(p.seed, h);
  h = fnv1a_u64(p.kept_fraction.size(), h);
  for (double f : p.kept_fraction) h = fnv1a_u64(bits(f), h);
  h = fnv1a_u64(bits(p.global_fraction), h);
  h = fnv1a_u64(static_cast<std::uint64_t>(p.collective), h);
  h = fnv1a_u64(p.gain_candidates.size(), h);
  for (double f : p.gain_candidates) h = fnv1a_u64(bits(f), h);
  h = fnv1a_u64(static_cast<std::uint64_t>(p.ranks), h);
  return h;
}

//! \p h (hash_step_params's) combined with a compressor's step settings \p s: the sizes and
//! values of its per-layer vectors (S::per_layer(), compress/step_settings.hpp).
template <class S>
std::uint64_t hash_step_settings(const S& s, std::uint64_t h) noexcept {
  std::apply(
      [&](const auto&... v) {
        const auto one = [&](const auto& vec) {
          h = fnv1a_u64(vec.size(), h);
          for (const auto x : vec) h = fnv1a_u64(static_cast<std::uint64_t>(x), h);
        };
        (one(v), ...);
      },
      s.per_layer());
  return h;
}

//! Compares a 64-bit value across the ranks of \p comm and returns the ranks whose value
//! differs from rank 0's ("1, 3"), or an empty string when all agree; every rank gets the
//! same answer. Uses only reductions of host doubles (which every engine supports, device
//! engines included): the value travels as four exact 16-bit parts, and max(part) ==
//! -max(-part) on every part means all agree. The common case is one allreduce of 8
//! doubles and allocates nothing; a disagreement costs two more to name the ranks.
template <class Comm>
std::string ranks_differing_from_rank0(Comm& comm, std::uint64_t h) {
  double v[8];
  for (int i = 0; i < 4; ++i) {
    v[i] = static_cast<double>((h >> (16 * i)) & 0xffffu);
    v[4 + i] = -v[i];
  }
  comm.allreduce_max(std::span<double>(v, 8));
  bool same = true;
  for (int i = 0; i < 4; ++i) same = same && v[i] == -v[4 + i];
  if (same) return {};
  // Every rank saw the disagreement and takes this path: rank 0's value reaches everyone
  // by a sum, then each rank flags itself when it differs.
  const auto n = static_cast<std::size_t>(comm.size());
  std::vector<double> w(4 + n, 0.0);
  if (comm.rank() == 0)
    for (int i = 0; i < 4; ++i) w[static_cast<std::size_t>(i)] = static_cast<double>((h >> (16 * i)) & 0xffffu);
  comm.allreduce_sum(std::span<double>(w.data(), 4));
  std::uint64_t h0 = 0;
  for (int i = 0; i < 4; ++i) h0 |= static_cast<std::uint64_t>(w[static_cast<std::size_t>(i)]) << (16 * i);
  w[4 + static_cast<std::size_t>(comm.rank())] = h0 != h ? 1.0 : 0.0;
  comm.allreduce_sum(std::span<double>(w.data() + 4, n));
  std::string odd;
  for (std::size_t r = 0; r < n; ++r)
    if (w[4 + r] != 0.0) odd += (odd.empty() ? "" : ", ") + std::to_string(r);
  return odd;
}

//! Compares one 64-bit hash per rank and throws gravac::error(diverged) on every rank when
//! any differs, naming the ranks that differ from rank 0 (ranks_differing_from_rank0).
class consistency_checker {
 public:
  //! Compares \p h, the decision of step \p step, across the ranks of \p comm.
  template <class Comm>
  void check(Comm& comm, std::uint64_t h, std::uint64_t step) {
    const std::string odd = ranks_differing_from_rank0(comm, h);
    if (odd.empty()) return;
    throw error(status::diverged,
                "step " + std::to_string(step) + ": ranks " + odd + " planned different step parameters than rank 0",
                comm.rank());
  }
};

}  // namespace gravac::detail
