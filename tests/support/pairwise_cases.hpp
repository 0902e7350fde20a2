#pragma once
// Test cases that cover every pair of factor levels (a pairwise covering array), for
// parameter sweeps too slow to run as a full product everywhere.

#include <cstddef>
#include <utility>
#include <vector>

namespace gravac::test {

//! Every case over factors with \p levels[f] levels each (the full product), the first
//! factor's level changing slowest.
inline std::vector<std::vector<int>> all_cases(const std::vector<int>& levels) {
  std::vector<std::vector<int>> all{{}};
  for (const int l : levels) {
    std::vector<std::vector<int>> next;
    for (const auto& c : all)
      for (int v = 0; v < l; ++v) {
        next.push_back(c);
        next.back().push_back(v);
      }
    all = std::move(next);
  }
  return all;
}

//! Cases over factors with \p levels[f] levels each (case[f] in [0, levels[f])) such that,
//! for every two factors, every pair of their levels occurs in some case. Greedy and
//! deterministic: each next case is the first of the full product, in order, that covers
//! the most pairs not yet covered. For 2 x 4 x 4 x 2 levels that is 16 cases instead of 64.
inline std::vector<std::vector<int>> pairwise_cases(const std::vector<int>& levels) {
  const std::size_t k = levels.size();
  const auto all = all_cases(levels);
  // covered[f][g][a * levels[g] + b]: levels a of factor f and b of factor g, f < g.
  std::vector<std::vector<std::vector<char>>> covered(k, std::vector<std::vector<char>>(k));
  std::size_t uncovered = 0;
  for (std::size_t f = 0; f < k; ++f)
    for (std::size_t g = f + 1; g < k; ++g) {
      covered[f][g].assign(static_cast<std::size_t>(levels[f] * levels[g]), 0);
      uncovered += covered[f][g].size();
    }
  const auto new_pairs = [&](const std::vector<int>& c) {
    std::size_t n = 0;
    for (std::size_t f = 0; f < k; ++f)
      for (std::size_t g = f + 1; g < k; ++g) n += !covered[f][g][static_cast<std::size_t>(c[f] * levels[g] + c[g])];
    return n;
  };
  std::vector<std::vector<int>> cases;
  while (uncovered > 0) {
    const std::vector<int>* best = nullptr;
    std::size_t best_new = 0;
    for (const auto& c : all)
      if (const std::size_t n = new_pairs(c); n > best_new) best = &c, best_new = n;
    for (std::size_t f = 0; f < k; ++f)
      for (std::size_t g = f + 1; g < k; ++g)
        covered[f][g][static_cast<std::size_t>((*best)[f] * levels[g] + (*best)[g])] = 1;
    uncovered -= best_new;
    cases.push_back(*best);
  }
  return k < 2 ? all : cases;  // one factor: every level is a case
}

//! Cases over factors with \p levels[f] levels each such that every level of every factor
//! occurs in some case: max(levels) cases, case i taking level i % levels[f] of factor f.
inline std::vector<std::vector<int>> each_level_cases(const std::vector<int>& levels) {
  int n = 1;
  for (const int l : levels) n = l > n ? l : n;
  std::vector<std::vector<int>> cases(static_cast<std::size_t>(n));
  for (int i = 0; i < n; ++i)
    for (const int l : levels) cases[static_cast<std::size_t>(i)].push_back(i % l);
  return cases;
}

//! The cases of a device test's sweep: the full product on a GPU; on the CUDA host double,
//! which runs the kernels one thread at a time and makes each case seconds long, the
//! pairwise cover.
inline std::vector<std::vector<int>> device_sweep_cases(const std::vector<int>& levels) {
#if defined(GRAVAC_CUDA_HOST_DOUBLE)
  return pairwise_cases(levels);
#else
  return all_cases(levels);
#endif
}

}  // namespace gravac::test
