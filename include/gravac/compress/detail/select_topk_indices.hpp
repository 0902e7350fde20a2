#pragma once
//! \file
//! \brief Exact top-k indices by a sampled threshold and a short candidate list (AR-Topk's
//! index rank), with nth_element over every index as its fallback.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "gravac/core/detail/random.hpp"
#include "gravac/stats/magnitude_histogram.hpp"

namespace gravac::detail {

//! Orders indices by |u| descending, then index ascending: the deterministic top-k order.
struct by_magnitude_then_index {
  const float* u;
  bool operator()(std::uint64_t a, std::uint64_t b) const noexcept {
    const float ma = std::fabs(u[a]), mb = std::fabs(u[b]);
    return ma > mb || (ma == mb && a < b);
  }
};

//! Selects the exact top-k of \p u into \p selected (ascending indices) by nth_element over
//! every index; \p order is scratch. select_topk_indices' fallback.
inline void select_topk_by_nth_element(std::span<const float> u, std::size_t k, std::vector<std::uint64_t>& order,
                                       std::vector<std::uint64_t>& selected) {
  order.resize(u.size());
  for (std::size_t i = 0; i < u.size(); ++i) order[i] = i;
  selected.clear();
  if (k == 0) return;
  if (k < u.size())
    std::nth_element(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(k - 1), order.end(),
                     by_magnitude_then_index{u.data()});
  // nth_element leaves the k best before and at position k-1 (in some order).
  selected.assign(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(k));
  std::sort(selected.begin(), selected.end());
}

//! The exact top-k of \p u into \p out (ascending indices), the same indices as
//! select_topk_by_nth_element (k largest |u|, ties to the lower index) at a fraction of its
//! cost: a seeded sample of the keys sets a low threshold (four standard deviations of the
//! sampled count below the k-th), one pass collects (key, index) of everything above it
//! packed in 64 bits, and nth_element then runs on that short list only. Falls back to
//! select_topk_by_nth_element when the threshold was too high (almost never) or u holds a
//! non-finite value (whose order that defines). \p scratch grows to u.size() once.
inline void select_topk_indices(std::span<const float> u, std::size_t k, std::vector<std::uint64_t>& scratch,
                                std::vector<std::uint64_t>& out) {
  const std::size_t n = u.size();
  out.clear();
  if (k == 0) return;
  constexpr std::size_t sample_size = 16384;
  if (k >= n / 4 || n <= 4 * sample_size || n > 0xffffffffull) return select_topk_by_nth_element(u, k, scratch, out);
  scratch.resize(n);
  // Keys (|u| bit patterns, ordered like |u|) at sample_size places, one drawn in each stratum.
  splitmix64 rng(0x9e3779b97f4a7c15ull ^ n);
  const std::size_t stratum = n / sample_size;
  for (std::size_t j = 0; j < sample_size; ++j)
    scratch[j] = magnitude_key(u[j * stratum + static_cast<std::size_t>(rng.next() % stratum)]);
  const double hits = static_cast<double>(k) * static_cast<double>(sample_size) / static_cast<double>(n);
  const double rank = hits + 4.0 * std::sqrt(hits) + 4.0;  // sampled keys above the threshold, aimed high
  if (rank >= static_cast<double>(sample_size)) return select_topk_by_nth_element(u, k, scratch, out);
  const auto r = static_cast<std::ptrdiff_t>(rank);
  std::nth_element(scratch.begin(), scratch.begin() + r, scratch.begin() + static_cast<std::ptrdiff_t>(sample_size),
                   std::greater<>());
  const auto floor = static_cast<std::uint32_t>(scratch[static_cast<std::size_t>(r)]);
  // (key << 32 | ~index): larger means a larger |u|, then a lower index, as by_magnitude_then_index.
  std::size_t c = 0;
  bool non_finite = false;
  for (std::size_t i = 0; i < n; ++i) {
    const std::uint32_t key = magnitude_key(u[i]);
    non_finite = non_finite || key >= non_finite_key;
    scratch[c] = (static_cast<std::uint64_t>(key) << 32) | (0xffffffffu - static_cast<std::uint32_t>(i));
    c += key >= floor ? 1u : 0u;
  }
  if (non_finite || c < k) return select_topk_by_nth_element(u, k, scratch, out);
  const auto kk = static_cast<std::ptrdiff_t>(k);
  std::nth_element(scratch.begin(), scratch.begin() + kk - 1, scratch.begin() + static_cast<std::ptrdiff_t>(c),
                   std::greater<>());
  out.resize(k);
  for (std::size_t j = 0; j < k; ++j) out[j] = 0xffffffffu - (scratch[j] & 0xffffffffu);
  std::sort(out.begin(), out.end());
}

}  // namespace gravac::detail
