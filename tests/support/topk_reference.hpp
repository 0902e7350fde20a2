#pragma once
// The tests' oracle of exact top-k: every index ordered by nth_element, with no sample, no
// threshold and no candidate list, against which the fast selections are checked
// (detail::select_topk_indices, the fused top-k, AR-Topk's index rank).

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace gravac::test {

//! Selects the exact top-k of \p u into \p selected (ascending indices): the k largest |u|,
//! ties to the lower index. \p order is scratch. Non-finite values are ordered as the
//! library's fallback orders them (the same nth_element over the same comparison), so the
//! fast path's fallback on such input can be checked too.
inline void select_topk_reference(std::span<const float> u, std::size_t k, std::vector<std::uint64_t>& order,
                                  std::vector<std::uint64_t>& selected) {
  order.resize(u.size());
  for (std::size_t i = 0; i < u.size(); ++i) order[i] = i;
  selected.clear();
  if (k == 0) return;
  const auto by_magnitude_then_index = [&u](std::uint64_t a, std::uint64_t b) {
    const float ma = std::fabs(u[a]), mb = std::fabs(u[b]);
    return ma > mb || (ma == mb && a < b);
  };
  if (k < u.size())
    std::nth_element(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(k - 1), order.end(),
                     by_magnitude_then_index);
  // nth_element leaves the k best before and at position k-1 (in some order).
  selected.assign(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(k));
  std::sort(selected.begin(), selected.end());
}

}  // namespace gravac::test
