#pragma once
//! \file
//! \brief random-k's index draw: k distinct sorted indices from a seeded generator.

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "gravac/compress/layered.hpp"
#include "gravac/concepts/concepts.hpp"
#include "gravac/core/detail/random.hpp"
#include "gravac/packet/packet_bound.hpp"

namespace gravac::detail {

//! Draws exactly k distinct indices of [0, n) in ascending order by selection sampling
//! (Knuth's algorithm S): each index is kept with probability (k - kept) / (n - seen),
//! which makes every k-subset equally likely. Deterministic for a given seed.
inline void sample_indices(std::size_t n, std::size_t k, std::uint64_t seed, std::vector<std::uint64_t>& out) {
  out.clear();
  splitmix64 rng(seed);
  std::size_t need = k;
  for (std::size_t i = 0; i < n && need > 0; ++i) {
    if (static_cast<double>(n - i) * rng.uniform() < static_cast<double>(need)) {
      out.push_back(i);
      --need;
    }
  }
}

}  // namespace gravac::detail
