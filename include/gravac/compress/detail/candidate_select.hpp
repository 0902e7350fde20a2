#pragma once
//! \file candidate_select.hpp
//! \brief The exact top-k among the candidates of a fused pass: the k-th largest key by a
//! radix select, then the selected candidates kept in index order (ties to the lower
//! index), which makes the result identical to the sort-based reference selection.

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <span>

namespace gravac::detail {

//! The k-th largest key among candidates and how many of the candidates equal to it are
//! selected (the ones of lowest index).
struct kth_key {
  std::uint32_t key = 0;   //!< the k-th largest key
  std::uint64_t ties = 0;  //!< candidates with this key to take, lowest index first
};

//! A run of candidates: the first slot in the workspace and their number.
struct candidate_run {
  std::size_t first = 0;  //!< slot of the first candidate
  std::size_t count = 0;  //!< candidates in the run
};

//! Candidates in a workspace: the index and the bit pattern of u of each slot.
struct candidate_slots {
  std::uint32_t* idx = nullptr;   //!< element index (relative to its layer)
  std::uint32_t* bits = nullptr;  //!< bit pattern of u (its key without the sign bit)
};

//! The k-th largest key over the candidate runs (k >= 1 and at most their total), by a
//! three-level radix select on 12, 12 and 7 key bits; \p digits holds 2^12 counters.
inline kth_key select_kth_key(const std::uint32_t* bits, std::span<const candidate_run> runs, std::uint64_t k,
                              std::span<std::uint64_t> digits) noexcept {
  struct level {
    unsigned shift, bits;
  };
  constexpr level levels[] = {{19, 12}, {7, 12}, {0, 7}};
  std::uint32_t prefix = 0;
  for (const level lv : levels) {
    const unsigned above = lv.shift + lv.bits;  // bits above this level's digit form the prefix
    const std::uint32_t mask = (1u << lv.bits) - 1u;
    std::fill_n(digits.begin(), std::size_t{1} << lv.bits, 0);
    for (const auto& r : runs) {
      const std::uint32_t* bp = bits + r.first;
      for (std::size_t i = 0; i < r.count; ++i) {
        const std::uint32_t key = bp[i] & 0x7fffffffu;
        if ((key >> above) == prefix) ++digits[(key >> lv.shift) & mask];
      }
    }
    std::uint64_t cum = 0;
    std::uint32_t d = mask;
    for (;; --d) {
      if (cum + digits[d] >= k || d == 0) break;
      cum += digits[d];
    }
    k -= cum;
    prefix = (prefix << lv.bits) | d;
  }
  return {prefix, k};
}

//! Keeps, in place and in index order, the candidates of \p run that beat \p t: a larger
//! key, or the key of t while \p ties_left lasts (lowest index first). Returns the count.
//! After a pass that zeroed its candidates of key >= \p zero_from, \p residual is the
//! layer's residual, made right: the value of every zeroed candidate not kept is written
//! back, and every kept candidate the pass left in it is zeroed. Both are scattered writes
//! to a layer out of the cache: each block of candidates asks for the lines of its writes
//! and writes those of the block before, so that the misses overlap (about 4x faster at
//! 2^24 and 1% than writing as the candidates come).
inline std::size_t keep_selected(candidate_slots s, candidate_run run, std::uint32_t t, std::uint64_t& ties_left,
                                 std::span<float> residual = {}, std::uint32_t zero_from = 0) noexcept {
  std::uint32_t* ip = s.idx + run.first;
  std::uint32_t* bp = s.bits + run.first;
  constexpr std::size_t block = 128;
  struct pending {
    std::uint32_t ix;
    float v;
  };
  pending writes[2][block];
  std::size_t count[2] = {0, 0};
  const bool fix = !residual.empty();
  std::size_t w = 0;
  for (std::size_t b0 = 0, turn = 0; b0 < run.count; b0 += block, turn ^= 1) {
    const std::size_t end = std::min(run.count, b0 + block);
    pending* cur = writes[turn];
    std::size_t c = 0;
    for (std::size_t i = b0; i < end; ++i) {
      const std::uint32_t ix = ip[i], b = bp[i], k = b & 0x7fffffffu;
      bool take = k > t;
      if (k == t && ties_left > 0) {
        take = true;
        --ties_left;
      }
      if (fix && take != (k >= zero_from)) {
        __builtin_prefetch(residual.data() + ix, 1);
        cur[c++] = {ix, take ? 0.0f : std::bit_cast<float>(b)};
      }
      ip[w] = ix;
      bp[w] = b;
      w += take ? 1u : 0u;
    }
    count[turn] = c;
    const pending* prev = writes[turn ^ 1];
    for (std::size_t j = 0; j < count[turn ^ 1]; ++j) residual[prev[j].ix] = prev[j].v;
    count[turn ^ 1] = 0;
  }
  for (int turn = 0; turn < 2; ++turn)
    for (std::size_t j = 0; j < count[turn]; ++j) residual[writes[turn][j].ix] = writes[turn][j].v;
  return w;
}

//! Zeroes in \p residual the candidates of \p run with key below \p zero_from, which a
//! pass with that zero_from left in it: when every candidate is sent.
inline void zero_below(candidate_slots s, candidate_run run, std::uint32_t zero_from,
                       std::span<float> residual) noexcept {
  const std::uint32_t* ip = s.idx + run.first;
  const std::uint32_t* bp = s.bits + run.first;
  for (std::size_t i = 0; i < run.count; ++i)
    if ((bp[i] & 0x7fffffffu) < zero_from) residual[ip[i]] = 0.0f;
}

//! Writes back into \p residual the value of every candidate of \p run with key at or
//! above \p zero_from, which a pass with that zero_from left as zero: undoes the zeroing
//! before a step reads u from the residual again (a miss, a non-finite value).
inline void restore_zeroed(candidate_slots s, candidate_run run, std::uint32_t zero_from,
                           std::span<float> residual) noexcept {
  const std::uint32_t* ip = s.idx + run.first;
  const std::uint32_t* bp = s.bits + run.first;
  for (std::size_t i = 0; i < run.count; ++i)
    if ((bp[i] & 0x7fffffffu) >= zero_from) residual[ip[i]] = std::bit_cast<float>(bp[i]);
}

}  // namespace gravac::detail
