#pragma once
//! \file fused_pass.hpp
//! \brief The fused error-feedback pass of top-k and threshold selection over one chunk
//! of a layer: u = g + e written over e, ||g||^2 and ||u||^2, the non-finite flag, an
//! optional (sampled) magnitude histogram, the candidates at or above a guessed key, and a
//! count of those at or above a lower floor. Also the slow paths a miss needs (a collecting
//! read of u, the histogram of a whole layer).
//!
//! The pass runs in SSE2 lanes, or in AVX2 vectors where the processor has it
//! (fused_pass_avx2, chosen by runs_avx2_kernels(); the same bits): fused_lanes.hpp.

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>

#include "gravac/compress/detail/fused_lanes.hpp"
#include "gravac/compress/detail/gain_sampling.hpp"
#include "gravac/core/detail/isa_dispatch.hpp"
#include "gravac/core/detail/square_sum.hpp"
#include "gravac/stats/magnitude_histogram.hpp"

namespace gravac::detail {

static_assert(fused_block == square_sum_leaf, "a block of the fused pass is a leaf of the sums' tree");

//! A guess that collects nothing.
inline constexpr std::uint32_t no_guess = 0xffffffffu;

//! What one fused pass over a layer measured.
struct fused_pass_result {
  double grad_sq = 0;         //!< ||g||^2
  double input_sq = 0;        //!< ||u||^2
  std::size_t collected = 0;  //!< elements at or above the guess (finite only)
  //! Finite elements at or above the floor (counted, not collected; >= collected). Equal to
  //! collected when the pass counted no band.
  std::size_t at_floor = 0;
  bool non_finite = false;  //!< a NaN or infinity was seen in u
};

//! The fused pass over one chunk: u = g + e stored in e; ||g||^2 and ||u||^2 over the
//! chunk's blocks in square_sum.hpp's tree (the chunk starts on a block boundary); the elements whose key is >= guess
//! (and finite) collected into idx/bits in index order: the index (relative to the layer:
//! \p base is the chunk's offset in it) and the bit pattern of u (its key is the pattern
//! without the sign bit). Elements selected by \p hs also go into its histogram (count and
//! energy). With \p Zero the collected elements whose key is >= \p zero_from are left as
//! zero in e (their values live in bits): the caller sends them from there, restores those
//! it does not send and zeroes the others it sends (see keep_selected). With \p Band the
//! finite elements whose key is >= \p floor (below guess) are counted, not collected
//! (fused_pass_result::at_floor): a miss then knows whether one read of e collecting from
//! the floor suffices.
//!
//! The pass runs at about the speed of `e += g` (memory-bound): the sums ride in float
//! lanes per block (32 terms per lane, then double, then the blocks' tree), the compare yields a bit mask per 8
//! elements, and the lanes store the candidates of the mask (fused_lanes::collect8: a
//! loop over its set bits, or in AVX2 one compressing permutation, no branch). The histogram is what is slow
//! (a scatter per element), hence the sampling for large layers.
//! \p Lanes is fused_lanes, or fused_lanes_avx2 inlined into fused_pass_avx2.
template <bool Collect, bool Zero, bool Band, class Lanes = fused_lanes>
GRAVAC_KERNEL_INLINE fused_pass_result fused_pass_chunk(const float* g, float* e, std::size_t n, std::uint32_t base,
                                                        std::uint32_t guess, std::uint32_t* idx, std::uint32_t* bits,
                                                        const histogram_sampling& hs, std::uint32_t zero_from,
                                                        std::uint32_t floor) noexcept {
  // Collect keys in [guess, non_finite_key): key > lo, signed (keys are below 2^31).
  const std::int32_t lo = static_cast<std::int32_t>(std::min(guess, non_finite_key)) - 1;
  const std::int32_t band_lo = static_cast<std::int32_t>(std::min(floor, non_finite_key)) - 1;
  std::uint64_t tail_band = 0;
  Lanes lanes;
  fused_pass_result r;
  pairwise_sum grad_tree, input_tree;  // the leaves are the blocks (square_sum.hpp)
  std::size_t c = 0;
  const std::size_t first_block = base / fused_block;  // chunks of threads start block-aligned
  for (std::size_t b0 = 0; b0 < n; b0 += fused_block) {
    const std::size_t m = std::min(fused_block, n - b0);
    const float* gb = g + b0;
    float* eb = e + b0;
    const std::size_t c0 = c;
    std::size_t j = 0;
    for (; j + 8 <= m; j += 8) {
      unsigned mask = lanes.template step8<Collect, Band>(gb + j, eb + j, lo, band_lo);
      if constexpr (Collect) {
        c += lanes.collect8(mask, base + static_cast<std::uint32_t>(b0 + j), eb + j, idx + c, bits + c);
      }
    }
    double leaf_g = 0, leaf_u = 0;
    lanes.flush(leaf_g, leaf_u);
    for (; j < m; ++j) {  // the last few of a chunk
      const float gv = gb[j];
      const float u = gv + eb[j];
      eb[j] = u;
      leaf_g += static_cast<double>(gv) * gv;
      leaf_u += static_cast<double>(u) * u;
      const std::uint32_t k = std::bit_cast<std::uint32_t>(u) & 0x7fffffffu;
      r.non_finite = r.non_finite || k >= non_finite_key;
      if constexpr (Collect) {
        idx[c] = base + static_cast<std::uint32_t>(b0 + j);
        bits[c] = std::bit_cast<std::uint32_t>(u);
        c += (k >= guess && k < non_finite_key) ? 1u : 0u;
        if constexpr (Band) tail_band += (k >= floor && k < non_finite_key) ? 1u : 0u;
      }
    }
    // A lane that overflowed or underflowed (or a value that is not finite): the leaf again
    // in double (square_sum.hpp).
    const auto g_at = [gb](std::size_t i) { return gb[i]; };
    const auto u_at = [eb](std::size_t i) { return eb[i]; };
    if (leaf_needs_double(leaf_g, m, g_at)) leaf_g = leaf_square_sum_in_double(m, g_at);
    if (leaf_needs_double(leaf_u, m, u_at)) leaf_u = leaf_square_sum_in_double(m, u_at);
    grad_tree.push(leaf_g);
    input_tree.push(leaf_u);
    if (hs.hist != nullptr && (first_block + b0 / fused_block) % hs.stride == hs.phase) {
      std::uint32_t kmin = 0xffffffffu, kmax = 0;
      for (std::size_t i = 0; i < m; ++i) {
        const std::uint32_t k = std::bit_cast<std::uint32_t>(eb[i]) & 0x7fffffffu;
        kmin = std::min(kmin, k);
        kmax = std::max(kmax, k);
        if (hs.stride == 1)
          hs.hist->add_unchecked(k);
        else
          hs.hist->add_weighted_unchecked(k, hs.stride);
      }
      hs.hist->note_range(kmin, kmax);
    }
    if constexpr (Zero)  // after the histogram, which must see u
      for (std::size_t q = c0; q < c; ++q)
        if ((bits[q] & 0x7fffffffu) >= zero_from) e[idx[q] - base] = 0.0f;
  }
  r.grad_sq = grad_tree.total();
  r.input_sq = input_tree.total();
  r.collected = c;
  if constexpr (Band)
    r.at_floor = lanes.band_count() + tail_band;
  else
    r.at_floor = c;
  r.non_finite = r.non_finite || lanes.non_finite();
  return r;
}

//! The fused pass of one chunk with the variant the guess, \p zero_from (no_guess: zero
//! nothing) and \p floor (not below guess: count no band) call for (see
//! fused_pass_chunk), in \p Lanes.
template <class Lanes>
GRAVAC_KERNEL_INLINE fused_pass_result fused_pass(const float* g, float* e, std::size_t n, std::uint32_t base,
                                                  std::uint32_t guess, std::uint32_t* idx, std::uint32_t* bits,
                                                  const histogram_sampling& hs, std::uint32_t zero_from,
                                                  std::uint32_t floor = no_guess) noexcept {
  if (guess == no_guess)
    return fused_pass_chunk<false, false, false, Lanes>(g, e, n, base, guess, idx, bits, hs, zero_from, floor);
  const bool band = floor < guess;
  if (zero_from != no_guess)
    return band ? fused_pass_chunk<true, true, true, Lanes>(g, e, n, base, guess, idx, bits, hs, zero_from, floor)
                : fused_pass_chunk<true, true, false, Lanes>(g, e, n, base, guess, idx, bits, hs, zero_from, floor);
  if (band) return fused_pass_chunk<true, false, true, Lanes>(g, e, n, base, guess, idx, bits, hs, zero_from, floor);
  return fused_pass_chunk<true, false, false, Lanes>(g, e, n, base, guess, idx, bits, hs, zero_from, floor);
}

#if GRAVAC_ISA_DISPATCH
//! fused_pass compiled for AVX2 (inlined here with fused_lanes_avx2): what
//! fused_topk_workspace runs where runs_avx2_kernels() (isa_dispatch.hpp); the same bits.
[[gnu::target("avx2")]] inline fused_pass_result fused_pass_avx2(const float* g, float* e, std::size_t n,
                                                                 std::uint32_t base, std::uint32_t guess,
                                                                 std::uint32_t* idx, std::uint32_t* bits,
                                                                 const histogram_sampling& hs, std::uint32_t zero_from,
                                                                 std::uint32_t floor = no_guess) noexcept {
  return fused_pass<fused_lanes_avx2>(g, e, n, base, guess, idx, bits, hs, zero_from, floor);
}
#endif
//! Collects (index, bit pattern) of the finite elements of \p u with key >= \p floor, in
//! index order.
inline std::size_t collect_at_least(std::span<const float> u, std::uint32_t floor, std::uint32_t* idx,
                                    std::uint32_t* bits) noexcept {
  const std::uint32_t span_keys = floor <= non_finite_key ? non_finite_key - floor : 0;
  std::size_t c = 0;
  for (std::size_t i = 0; i < u.size(); ++i) {
    const std::uint32_t b = std::bit_cast<std::uint32_t>(u[i]);
    idx[c] = static_cast<std::uint32_t>(i);
    bits[c] = b;
    c += ((b & 0x7fffffffu) - floor) < span_keys ? 1u : 0u;
  }
  return c;
}

//! Adds every |u| to \p h: counts only (what a miss needs), or counts and energies (\p
//! energy: what an exact gain curve needs).
inline void histogram_of_layer(std::span<const float> u, magnitude_histogram& h, bool energy) noexcept {
  std::uint32_t kmin = 0xffffffffu, kmax = 0;
  for (float x : u) {
    const std::uint32_t k = magnitude_key(x);
    kmin = std::min(kmin, k);
    kmax = std::max(kmax, k);
    if (energy)
      h.add_unchecked(k);
    else
      h.count_unchecked(k);
  }
  h.note_range(kmin, kmax);
}

}  // namespace gravac::detail
