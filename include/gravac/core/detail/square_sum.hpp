#pragma once
//! \file
//! \brief The one summation order of every sum of squares a policy reads (||g||^2, ||u||^2,
//! the kept energy), shared by the host compressors and the device kernels so that both
//! give the same bits, whatever the threads, the grid or the GPU:
//!
//! - a *leaf* is 256 consecutive values; lane l (0..7) sums the squares of its values at
//!   8j + l in float, j ascending (float products, float sums: a build that contracts
//!   them into fused multiply-adds, -ffp-contract=fast with FMA enabled, gives other bits);
//!   a_l = lane_l + lane_(l+4) in float; the leaf's sum is (a_0 + a_1) + (a_2 + a_3) in
//!   double; the values of a last, short group of 8 are then added one by one, as exact
//!   double squares;
//! - a leaf whose sum so comes out infinite or NaN (a float square or lane overflowed past
//!   about 1.8e19, or a value is not finite), or below 2^-60 with a value that is not zero
//!   (float squares underflowed), is summed again in double, value by value in index order:
//!   finite values then give a finite norm, and tiny ones a norm that is not zero;
//! - the leaves are added in a balanced binary tree aligned on powers of two (leaves 0+1,
//!   2+3, then (0+1)+(2+3), ...; a missing right part counts as zero).
//!
//! The leaf is what the host's vector lanes compute in one pass (fused_lanes.hpp); the
//! aligned tree is what any split of the leaves into aligned power-of-two groups gives,
//! which is how device blocks and host threads share the work (cuda/detail/square_sums.hpp).

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>

#include "gravac/core/detail/isa_dispatch.hpp"

namespace gravac::detail {

//! Values per leaf of the summation tree.
inline constexpr std::size_t square_sum_leaf = 256;
//! Float lanes per leaf.
inline constexpr std::size_t square_sum_lanes = 8;

//! The aligned binary tree over a stream of leaf sums: push them in order, read total().
//! Holds one partial sum per set bit of the count (a binary counter), so it streams.
class pairwise_sum {
 public:
  //! Adds the next leaf's sum.
  void push(double v) noexcept {
    unsigned level = 0;
    for (std::uint64_t c = count_; c & 1u; c >>= 1, ++level) v = level_[level] + v;
    level_[level] = v;
    ++count_;
  }
  //! The tree's root over the leaves pushed so far (0 when none): the partial trees from
  //! the smallest (rightmost) up, each added as the left part of what follows it.
  [[nodiscard]] double total() const noexcept {
    double acc = 0;
    bool any = false;
    for (unsigned level = 0; level < 64; ++level) {
      if (((count_ >> level) & 1u) == 0) continue;
      acc = any ? level_[level] + acc : level_[level];
      any = true;
    }
    return acc;
  }
  //! Leaves pushed.
  [[nodiscard]] std::uint64_t count() const noexcept { return count_; }

 private:
  double level_[64] = {};
  std::uint64_t count_ = 0;
};

//! The leaf sum of lanes' float partials \p lane (8 of them): (a0 + a1) + (a2 + a3) with
//! a_l = lane_l + lane_(l+4) in float.
[[nodiscard]] inline double combine_square_lanes(const float (&lane)[square_sum_lanes]) noexcept {
  float a[4];
  for (unsigned l = 0; l < 4; ++l) a[l] = lane[l] + lane[l + 4];
  return (static_cast<double>(a[0]) + a[1]) + (static_cast<double>(a[2]) + a[3]);
}

//! A leaf summed in double, value by value in index order: what a leaf whose float lanes
//! overflowed is (\p m values, value i being \p load(i)).
template <class Load>
[[nodiscard]] double leaf_square_sum_in_double(std::size_t m, Load&& load) noexcept {
  double s = 0;
  for (std::size_t j = 0; j < m; ++j) {
    const double v = load(j);
    s += v * v;
  }
  return s;
}

//! Below this, a leaf's lane sum may have lost its values' squares to float underflow.
inline constexpr double tiny_leaf_sum = 0x1p-60;

//! Whether a leaf whose lanes summed to \p s must be summed again in double: \p s is not
//! finite, or below tiny_leaf_sum while one of its \p m values (\p load(i)) is not zero.
template <class Load>
[[nodiscard]] bool leaf_needs_double(double s, std::size_t m, Load&& load) noexcept {
  if (!std::isfinite(s)) return true;
  if (s >= tiny_leaf_sum) return false;
  for (std::size_t j = 0; j < m; ++j)
    if (load(j) != 0.0f) return true;
  return false;
}

//! The sum of one leaf of \p m (at most square_sum_leaf) values, value i being \p load(i).
template <class Load>
[[nodiscard]] double leaf_square_sum(std::size_t m, Load&& load) noexcept {
  float lane[square_sum_lanes] = {};
  const std::size_t full = m / square_sum_lanes * square_sum_lanes;
  for (std::size_t j = 0; j < full; j += square_sum_lanes)
    for (std::size_t l = 0; l < square_sum_lanes; ++l) {
      const float v = load(j + l);
      lane[l] += v * v;
    }
  double s = combine_square_lanes(lane);
  for (std::size_t j = full; j < m; ++j) {
    const double v = load(j);
    s += v * v;
  }
  return leaf_needs_double(s, m, load) ? leaf_square_sum_in_double(m, load) : s;
}

//! Leaves summed at once by whole_leaf_sums: independent chains that hide the float adds'
//! latency (one leaf alone is one chain of 32 dependent adds per vector register).
inline constexpr std::size_t leaves_at_once = 4;

#if defined(__GNUC__) || defined(__clang__)
//! A leaf's eight float lanes as one vector (two SSE registers, or one AVX register where
//! the caller is compiled for AVX2). Written as a vector so that no optimization level turns
//! the lanes into shuffles (GCC's -O3 vectorized a plain loop across the wrong axis).
using square_lane_vector = float __attribute__((vector_size(square_sum_lanes * sizeof(float))));
//! \p v = the lanes at \p q (any float address: the copy compiles to an unaligned vector
//! load; by reference, as a vector returned by value would change the ABI without AVX).
GRAVAC_KERNEL_INLINE void load_lanes(const float* q, square_lane_vector& v) noexcept { std::memcpy(&v, q, sizeof v); }
#endif

//! The lane sums of the leaf at \p q: lane l adds the squares of q[8j + l], j ascending.
GRAVAC_KERNEL_INLINE void leaf_lanes(const float* q, float (&lane)[square_sum_lanes]) noexcept {
  for (std::size_t l = 0; l < square_sum_lanes; ++l) lane[l] = 0.0f;
  for (std::size_t j = 0; j < square_sum_leaf; j += square_sum_lanes)
    for (std::size_t l = 0; l < square_sum_lanes; ++l) lane[l] += q[j + l] * q[j + l];
}

//! The sums of the \p leaves whole leaves from \p p into \p out, each leaf_square_sum's
//! bits: the lanes of leaves_at_once leaves are summed side by side, the arithmetic of each
//! leaf unchanged. Inlined into its caller, so that it is compiled for the caller's
//! instruction set (isa_dispatch.hpp).
GRAVAC_KERNEL_INLINE void whole_leaf_sums(const float* __restrict p, std::size_t leaves,
                                          double* __restrict out) noexcept {
  constexpr std::size_t L = square_sum_lanes, A = leaves_at_once;
  std::size_t k = 0;
#if defined(__GNUC__) || defined(__clang__)
  static_assert(A == 4);
  for (; k + A <= leaves; k += A) {
    square_lane_vector a0 = {}, a1 = {}, a2 = {}, a3 = {};
    const float* q = p + k * square_sum_leaf;
    for (std::size_t j = 0; j < square_sum_leaf; j += L) {
      square_lane_vector v0;
      load_lanes(q + j, v0);
      square_lane_vector v1;
      load_lanes(q + square_sum_leaf + j, v1);
      square_lane_vector v2;
      load_lanes(q + 2 * square_sum_leaf + j, v2);
      square_lane_vector v3;
      load_lanes(q + 3 * square_sum_leaf + j, v3);
      a0 += v0 * v0;
      a1 += v1 * v1;
      a2 += v2 * v2;
      a3 += v3 * v3;
    }
    const square_lane_vector* acc[A] = {&a0, &a1, &a2, &a3};
    for (std::size_t a = 0; a < A; ++a) {
      float lane[L];
      std::memcpy(lane, acc[a], sizeof lane);
      out[k + a] = combine_square_lanes(lane);
    }
  }
  if (k + 2 <= leaves) {  // two leaves, as a bucket of 512 values gives
    square_lane_vector a0 = {}, a1 = {};
    const float* q = p + k * square_sum_leaf;
    for (std::size_t j = 0; j < square_sum_leaf; j += L) {
      square_lane_vector v0;
      load_lanes(q + j, v0);
      square_lane_vector v1;
      load_lanes(q + square_sum_leaf + j, v1);
      a0 += v0 * v0;
      a1 += v1 * v1;
    }
    float lane[L];
    std::memcpy(lane, &a0, sizeof lane);
    out[k] = combine_square_lanes(lane);
    std::memcpy(lane, &a1, sizeof lane);
    out[k + 1] = combine_square_lanes(lane);
    k += 2;
  }
#endif
  for (; k < leaves; ++k) {
    float lane[L];
    leaf_lanes(p + k * square_sum_leaf, lane);
    out[k] = combine_square_lanes(lane);
  }
  for (k = 0; k < leaves; ++k) {  // the rare leaf whose lanes overflowed or underflowed
    const float* q = p + k * square_sum_leaf;
    const auto load = [q](std::size_t i) { return q[i]; };
    if (leaf_needs_double(out[k], square_sum_leaf, load)) out[k] = leaf_square_sum_in_double(square_sum_leaf, load);
  }
}

//! The sum of squares of \p n values in the tree's order, value i being \p load(i).
template <class Load>
[[nodiscard]] double square_sum_of(std::size_t n, Load&& load) noexcept {
  pairwise_sum tree;
  for (std::size_t a = 0; a < n; a += square_sum_leaf) {
    const std::size_t m = n - a < square_sum_leaf ? n - a : square_sum_leaf;
    tree.push(leaf_square_sum(m, [&](std::size_t i) { return load(a + i); }));
  }
  return tree.total();
}

//! The sums of squares of two arrays of \p n values in the tree's order, fed as a prefix of
//! them becomes final (add_to): each leaf is summed once it is complete, while a pass that
//! just wrote it still has it in cache.
class square_sum_pair_stream {
 public:
  //! Over \p a and \p b, \p n values each.
  square_sum_pair_stream(const float* a, const float* b, std::size_t n) noexcept : a_(a), b_(b), n_(n) {}
  //! Sums every leaf that ends at or before \p end (the first \p end values are final).
  void add_to(std::size_t end) noexcept {
    for (; at_ + square_sum_leaf <= end; at_ += square_sum_leaf) push(square_sum_leaf);
  }
  //! Sums the rest (every value is final) and gives the two sums.
  void finish(double& sum_a, double& sum_b) noexcept {
    add_to(n_);
    if (at_ < n_) push(n_ - at_);
    at_ = n_;
    sum_a = tree_a_.total();
    sum_b = tree_b_.total();
  }

 private:
  void push(std::size_t m) noexcept {
    const float* a = a_ + at_;
    const float* b = b_ + at_;
    tree_a_.push(leaf_square_sum(m, [a](std::size_t i) { return a[i]; }));
    tree_b_.push(leaf_square_sum(m, [b](std::size_t i) { return b[i]; }));
  }
  const float* a_;
  const float* b_;
  std::size_t n_;
  std::size_t at_ = 0;
  pairwise_sum tree_a_, tree_b_;
};

//! The sum of squares, in the tree's order, of values fed in order in runs of any length
//! (add): whole leaves are summed from the caller's memory, the values of a leaf that is not
//! complete yet are copied (at most 255), so a run may be overwritten once it was added.
class square_sum_stream {
 public:
  //! Adds the next \p m values \p p[0..m). Inlined into its caller, so that its leaves are
  //! summed in the caller's instruction set (a quantizer's kernel compiled for AVX2).
  GRAVAC_KERNEL_INLINE void add(const float* p, std::size_t m) noexcept {
    if (held_ > 0) {
      const std::size_t take = m < square_sum_leaf - held_ ? m : square_sum_leaf - held_;
      std::memcpy(partial_ + held_, p, take * sizeof(float));
      held_ += take;
      p += take;
      m -= take;
      if (held_ < square_sum_leaf) return;
      push(partial_, square_sum_leaf);
      held_ = 0;
    }
    while (m >= square_sum_leaf) {
      const std::size_t leaves = std::min(m / square_sum_leaf, batch);
      double sums[batch];
      whole_leaf_sums(p, leaves, sums);
      for (std::size_t k = 0; k < leaves; ++k) tree_.push(sums[k]);
      p += leaves * square_sum_leaf;
      m -= leaves * square_sum_leaf;
    }
    if (m > 0) std::memcpy(partial_, p, m * sizeof(float));
    held_ = m;
  }
  //! The sum over every value added (a short last leaf is summed now; add no more after).
  [[nodiscard]] double finish() noexcept {
    if (held_ > 0) push(partial_, held_);
    held_ = 0;
    return tree_.total();
  }

 private:
  void push(const float* p, std::size_t m) noexcept {
    tree_.push(leaf_square_sum(m, [p](std::size_t i) { return p[i]; }));
  }
  static constexpr std::size_t batch = 16;  // leaves summed per whole_leaf_sums call
  pairwise_sum tree_;
  float partial_[square_sum_leaf];
  std::size_t held_ = 0;
};

//! The sum of squares of \p x in the tree's order.
[[nodiscard]] inline double square_sum(std::span<const float> x) noexcept {
  return square_sum_of(x.size(), [x](std::size_t i) { return x[i]; });
}

//! The sum of squares of the \p n floats stored from \p p (unaligned bytes, as in a
//! packet) in the tree's order.
[[nodiscard]] inline double square_sum_bytes(const std::byte* p, std::size_t n) noexcept {
  return square_sum_of(n, [p](std::size_t i) {
    float v;
    std::memcpy(&v, p + i * sizeof(float), sizeof v);
    return v;
  });
}

}  // namespace gravac::detail
