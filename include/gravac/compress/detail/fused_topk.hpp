#pragma once
//! \file fused_topk.hpp
//! \brief The CPU kernels of exact error-feedback top-k (and of threshold selection).
//!
//! One fused pass forms u = g + e, writes u over e, sums ||g||^2 and ||u||^2, optionally
//! fills a (possibly sampled) magnitude histogram, and collects (index, bit pattern) of
//! every element whose |u| is at or above a guessed key (the previous step's threshold
//! widened by a margin, or an estimate from a sample). When at least k elements were
//! collected, the exact top-k is among them and is resolved from the short list by a
//! radix select on the keys; the residual update is then k scattered (prefetched) writes
//! of zero, or none when the pass left its candidates as zero (threshold). Only a miss
//! (too few collected) costs a second read of e, guided by a full histogram. Ties go to
//! the lower index, which makes the result identical to the sort-based reference.
//!
//! The pass runs in SSE2 lanes, or in AVX2 vectors where the processor has it
//! (fused_pass_avx2, chosen by runs_avx2_kernels(); the same bits).
//!
//! Candidates live in a workspace as long as the gradient buffer, in the region of each
//! layer (at the layer's offset), so no list can overflow and nothing is allocated per step.

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <thread>
#include <vector>

#if defined(__SSE2__) && !defined(GRAVAC_PORTABLE_KERNELS)
#include <emmintrin.h>
#endif

#include "gravac/detail/isa_dispatch.hpp"
#if GRAVAC_ISA_DISPATCH
#include <immintrin.h>
#endif

#include "gravac/stats/gain_curve.hpp"
#include "gravac/stats/magnitude_histogram.hpp"
#include "gravac/packet/sparse_packet.hpp"
#include "gravac/packet/format.hpp"

namespace gravac::detail {

//! A guess that collects nothing.
inline constexpr std::uint32_t no_guess = 0xffffffffu;

//! What one fused pass over a layer measured.
struct fused_pass_result {
  double grad_sq = 0;          //!< ||g||^2
  double input_sq = 0;         //!< ||u||^2
  std::size_t collected = 0;   //!< elements at or above the guess (finite only)
  bool non_finite = false;     //!< a NaN or infinity was seen in u
};

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

//! Which elements of a fused pass also go into a magnitude histogram (count and energy).
//! With a stride of 1, every element: the exact histogram. With a larger stride (large
//! layers, where a scatter per element would cost more than the whole selection), the gain
//! histogram is built in two parts: every candidate the pass collects (key >= the guess) is
//! added exactly afterwards (fused_topk_workspace::add_candidates), and of the elements below
//! the guess one block of fused_block in `stride` is added, each with weight `stride`. The
//! largest values, which carry the energy of small kept fractions and of heavy tails, are
//! thus exact, and the bulk below is a uniform sample. Blocks are chosen by their index in
//! the layer: those equal to `phase` modulo `stride`.
struct histogram_sampling {
  magnitude_histogram* hist = nullptr;  //!< where the elements go; null: no histogram
  std::uint32_t stride = 1;             //!< one block in this many (1: every element)
  std::uint32_t phase = 0;              //!< which one (below stride)
};

//! Elements per block of the fused pass (the unit of sums and of histogram sampling).
inline constexpr std::size_t fused_block = 256;

//! The gain histogram's sampling stride for a layer of \p n elements: every element of
//! layers up to 2^19 elements (the exact curve); above, a sample of about 2^18 elements
//! below the guess (one block in at most 64), where a full histogram would cost more than
//! the selection itself (a scatter per element against a memory-bound pass).
[[nodiscard]] inline std::uint32_t gain_sample_stride(std::size_t n) noexcept {
  constexpr std::size_t exact_up_to = std::size_t{1} << 19, sample = std::size_t{1} << 18;
  if (n <= exact_up_to) return 1;
  return static_cast<std::uint32_t>(std::min<std::size_t>(64, std::bit_floor(n / sample)));
}

//! The sampling of a layer's gain histogram at step \p step: the phase rotates with the
//! step, so every block is seen over stride steps.
[[nodiscard]] inline histogram_sampling gain_sampling(magnitude_histogram& h, std::size_t n, std::uint64_t step) noexcept {
  const std::uint32_t stride = gain_sample_stride(n);
  return {&h, stride, static_cast<std::uint32_t>(step % stride)};
}

//! Groups of 8 of the fused pass: u = g + e stored over e, float partial sums of g^2 and
//! u^2, a non-finite flag, and the mask of the lanes whose key lies in (lo, non_finite_key).
//! Keys are below 2^31, so signed compares order them, which SSE2 has.
#if defined(__SSE2__) && !defined(GRAVAC_PORTABLE_KERNELS)
struct fused_lanes {
  __m128 fg0 = _mm_setzero_ps(), fg1 = _mm_setzero_ps(), fu0 = _mm_setzero_ps(), fu1 = _mm_setzero_ps();
  __m128i nf = _mm_setzero_si128();

  template <bool Collect>
  unsigned step8(const float* g, float* e, std::int32_t lo) noexcept {
    const __m128i abs_mask = _mm_set1_epi32(0x7fffffff);
    const __m128i largest_finite = _mm_set1_epi32(static_cast<std::int32_t>(non_finite_key - 1));
    const __m128 g0 = _mm_loadu_ps(g), g1 = _mm_loadu_ps(g + 4);
    const __m128 u0 = _mm_add_ps(g0, _mm_loadu_ps(e)), u1 = _mm_add_ps(g1, _mm_loadu_ps(e + 4));
    _mm_storeu_ps(e, u0);
    _mm_storeu_ps(e + 4, u1);
    fg0 = _mm_add_ps(fg0, _mm_mul_ps(g0, g0));
    fg1 = _mm_add_ps(fg1, _mm_mul_ps(g1, g1));
    fu0 = _mm_add_ps(fu0, _mm_mul_ps(u0, u0));
    fu1 = _mm_add_ps(fu1, _mm_mul_ps(u1, u1));
    const __m128i k0 = _mm_and_si128(_mm_castps_si128(u0), abs_mask);
    const __m128i k1 = _mm_and_si128(_mm_castps_si128(u1), abs_mask);
    const __m128i bad0 = _mm_cmpgt_epi32(k0, largest_finite), bad1 = _mm_cmpgt_epi32(k1, largest_finite);
    nf = _mm_or_si128(nf, _mm_or_si128(bad0, bad1));
    if constexpr (!Collect) return 0;
    const __m128i l = _mm_set1_epi32(lo);
    const __m128i c0 = _mm_andnot_si128(bad0, _mm_cmpgt_epi32(k0, l));
    const __m128i c1 = _mm_andnot_si128(bad1, _mm_cmpgt_epi32(k1, l));
    return static_cast<unsigned>(_mm_movemask_ps(_mm_castsi128_ps(c0)) | (_mm_movemask_ps(_mm_castsi128_ps(c1)) << 4));
  }
  //! Adds the block's partial sums to \p gs and \p us (double) and restarts them.
  void flush(double& gs, double& us) noexcept {
    alignas(16) float a[4], b[4];
    _mm_store_ps(a, _mm_add_ps(fg0, fg1));
    _mm_store_ps(b, _mm_add_ps(fu0, fu1));
    gs += (static_cast<double>(a[0]) + a[1]) + (static_cast<double>(a[2]) + a[3]);
    us += (static_cast<double>(b[0]) + b[1]) + (static_cast<double>(b[2]) + b[3]);
    fg0 = fg1 = fu0 = fu1 = _mm_setzero_ps();
  }
  [[nodiscard]] bool non_finite() const noexcept { return _mm_movemask_epi8(nf) != 0; }
};
#else
// Portable version (any architecture; GRAVAC_PORTABLE_KERNELS selects it on x86 for tests).
struct fused_lanes {
  float fg[8] = {}, fu[8] = {};
  bool nf = false;

  template <bool Collect>
  unsigned step8(const float* g, float* e, std::int32_t lo) noexcept {
    unsigned mask = 0;
    for (unsigned l = 0; l < 8; ++l) {
      const float gv = g[l];
      const float u = gv + e[l];
      e[l] = u;
      fg[l] += gv * gv;
      fu[l] += u * u;
      const std::uint32_t k = std::bit_cast<std::uint32_t>(u) & 0x7fffffffu;
      const bool bad = k >= non_finite_key;
      nf = nf || bad;
      if constexpr (Collect) mask |= static_cast<unsigned>(!bad && static_cast<std::int32_t>(k) > lo) << l;
    }
    return mask;
  }
  void flush(double& gs, double& us) noexcept {
    for (unsigned l = 0; l < 8; ++l) {
      gs += fg[l];
      us += fu[l];
      fg[l] = fu[l] = 0.0f;
    }
  }
  [[nodiscard]] bool non_finite() const noexcept { return nf; }
};
#endif

#if GRAVAC_ISA_DISPATCH
//! fused_lanes with one 256-bit vector per quantity, for processors with AVX2 (see
//! fused_pass_avx2): half the instructions of the SSE2 version and the same bits
//! (lane l of the vector sums what lane l % 4 of the SSE2 version's fg0 or fg1 sums, and
//! flush adds the two halves as the SSE2 version adds fg0 and fg1).
struct fused_lanes_avx2 {
  __m256 fg, fu;
  __m256i nf;

  [[gnu::target("avx2")]] fused_lanes_avx2() noexcept
      : fg(_mm256_setzero_ps()), fu(_mm256_setzero_ps()), nf(_mm256_setzero_si256()) {}

  template <bool Collect>
  [[gnu::target("avx2")]] unsigned step8(const float* g, float* e, std::int32_t lo) noexcept {
    const __m256i abs_mask = _mm256_set1_epi32(0x7fffffff);
    const __m256i largest_finite = _mm256_set1_epi32(static_cast<std::int32_t>(non_finite_key - 1));
    const __m256 gv = _mm256_loadu_ps(g);
    const __m256 u = _mm256_add_ps(gv, _mm256_loadu_ps(e));
    _mm256_storeu_ps(e, u);
    fg = _mm256_add_ps(fg, _mm256_mul_ps(gv, gv));
    fu = _mm256_add_ps(fu, _mm256_mul_ps(u, u));
    const __m256i k = _mm256_and_si256(_mm256_castps_si256(u), abs_mask);
    const __m256i bad = _mm256_cmpgt_epi32(k, largest_finite);
    nf = _mm256_or_si256(nf, bad);
    if constexpr (!Collect) return 0;
    const __m256i c = _mm256_andnot_si256(bad, _mm256_cmpgt_epi32(k, _mm256_set1_epi32(lo)));
    return static_cast<unsigned>(_mm256_movemask_ps(_mm256_castsi256_ps(c)));
  }
  [[gnu::target("avx2")]] void flush(double& gs, double& us) noexcept {
    alignas(16) float a[4], b[4];
    _mm_store_ps(a, _mm_add_ps(_mm256_castps256_ps128(fg), _mm256_extractf128_ps(fg, 1)));
    _mm_store_ps(b, _mm_add_ps(_mm256_castps256_ps128(fu), _mm256_extractf128_ps(fu, 1)));
    gs += (static_cast<double>(a[0]) + a[1]) + (static_cast<double>(a[2]) + a[3]);
    us += (static_cast<double>(b[0]) + b[1]) + (static_cast<double>(b[2]) + b[3]);
    fg = fu = _mm256_setzero_ps();
  }
  [[nodiscard, gnu::target("avx2")]] bool non_finite() const noexcept {
    return _mm256_movemask_epi8(nf) != 0;
  }
};
#endif

//! The fused pass over one chunk: u = g + e stored in e; the elements whose key is >= guess
//! (and finite) collected into idx/bits in index order: the index (relative to the layer:
//! \p base is the chunk's offset in it) and the bit pattern of u (its key is the pattern
//! without the sign bit). Elements selected by \p hs also go into its histogram (count and
//! energy). With \p Zero the collected elements whose key is >= \p zero_from are left as
//! zero in e (their values live in bits): the caller sends them from there, restores those
//! it does not send and zeroes the others it sends (see keep_selected).
//!
//! The pass runs at about the speed of `e += g` (memory-bound): the sums ride in float
//! lanes per block (32 terms per lane, then double), the compare yields a bit mask per 8
//! elements, and only the rare set bits cost a loop trip. The histogram is what is slow
//! (a scatter per element), hence the sampling for large layers.
//! \p Lanes is fused_lanes, or fused_lanes_avx2 inlined into fused_pass_avx2.
template <bool Collect, bool Zero, class Lanes = fused_lanes>
GRAVAC_KERNEL_INLINE fused_pass_result fused_pass_chunk(const float* g, float* e, std::size_t n, std::uint32_t base,
                                                        std::uint32_t guess, std::uint32_t* idx, std::uint32_t* bits,
                                                        const histogram_sampling& hs, std::uint32_t zero_from) noexcept {
  // Collect keys in [guess, non_finite_key): key > lo, signed (keys are below 2^31).
  const std::int32_t lo = static_cast<std::int32_t>(std::min(guess, non_finite_key)) - 1;
  Lanes lanes;
  fused_pass_result r;
  std::size_t c = 0;
  const std::size_t first_block = base / fused_block;  // chunks of threads start block-aligned
  for (std::size_t b0 = 0; b0 < n; b0 += fused_block) {
    const std::size_t m = std::min(fused_block, n - b0);
    const float* gb = g + b0;
    float* eb = e + b0;
    const std::size_t c0 = c;
    std::size_t j = 0;
    for (; j + 8 <= m; j += 8) {
      unsigned mask = lanes.template step8<Collect>(gb + j, eb + j, lo);
      if constexpr (Collect) {
        while (mask != 0) {
          const auto l = static_cast<std::uint32_t>(std::countr_zero(mask));
          idx[c] = base + static_cast<std::uint32_t>(b0 + j) + l;
          bits[c] = std::bit_cast<std::uint32_t>(eb[j + l]);
          ++c;
          mask &= mask - 1;
        }
      }
    }
    lanes.flush(r.grad_sq, r.input_sq);
    for (; j < m; ++j) {  // the last few of a chunk
      const float gv = gb[j];
      const float u = gv + eb[j];
      eb[j] = u;
      r.grad_sq += static_cast<double>(gv) * gv;
      r.input_sq += static_cast<double>(u) * u;
      const std::uint32_t k = std::bit_cast<std::uint32_t>(u) & 0x7fffffffu;
      r.non_finite = r.non_finite || k >= non_finite_key;
      if constexpr (Collect) {
        idx[c] = base + static_cast<std::uint32_t>(b0 + j);
        bits[c] = std::bit_cast<std::uint32_t>(u);
        c += (k >= guess && k < non_finite_key) ? 1u : 0u;
      }
    }
    if (hs.hist != nullptr && (first_block + b0 / fused_block) % hs.stride == hs.phase) {
      std::uint32_t kmin = 0xffffffffu, kmax = 0;
      for (std::size_t i = 0; i < m; ++i) {
        const std::uint32_t k = std::bit_cast<std::uint32_t>(eb[i]) & 0x7fffffffu;
        kmin = std::min(kmin, k);
        kmax = std::max(kmax, k);
        if (hs.stride == 1)
          hs.hist->add_unchecked(k);
        else if (!Collect || k < guess || k >= non_finite_key)  // candidates are added exactly later
          hs.hist->add_weighted_unchecked(k, hs.stride);
      }
      hs.hist->note_range(kmin, kmax);
    }
    if constexpr (Zero)  // after the histogram, which must see u
      for (std::size_t q = c0; q < c; ++q)
        if ((bits[q] & 0x7fffffffu) >= zero_from) e[idx[q] - base] = 0.0f;
  }
  r.collected = c;
  r.non_finite = r.non_finite || lanes.non_finite();
  return r;
}

//! The fused pass of one chunk with the variant the guess and \p zero_from (no_guess: zero
//! nothing) call for (see fused_pass_chunk), in \p Lanes.
template <class Lanes>
GRAVAC_KERNEL_INLINE fused_pass_result fused_pass(const float* g, float* e, std::size_t n, std::uint32_t base,
                                                  std::uint32_t guess, std::uint32_t* idx, std::uint32_t* bits,
                                                  const histogram_sampling& hs, std::uint32_t zero_from) noexcept {
  if (guess == no_guess) return fused_pass_chunk<false, false, Lanes>(g, e, n, base, guess, idx, bits, hs, zero_from);
  return zero_from != no_guess ? fused_pass_chunk<true, true, Lanes>(g, e, n, base, guess, idx, bits, hs, zero_from)
                               : fused_pass_chunk<true, false, Lanes>(g, e, n, base, guess, idx, bits, hs, zero_from);
}

#if GRAVAC_ISA_DISPATCH
//! fused_pass compiled for AVX2 (inlined here with fused_lanes_avx2): what
//! fused_topk_workspace runs where runs_avx2_kernels() (isa_dispatch.hpp); the same bits.
[[gnu::target("avx2")]] inline fused_pass_result fused_pass_avx2(const float* g, float* e, std::size_t n,
                                                                 std::uint32_t base, std::uint32_t guess,
                                                                 std::uint32_t* idx, std::uint32_t* bits,
                                                                 const histogram_sampling& hs,
                                                                 std::uint32_t zero_from) noexcept {
  return fused_pass<fused_lanes_avx2>(g, e, n, base, guess, idx, bits, hs, zero_from);
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

//! The workspace and steps of the fused top-k: sized once for a buffer of \p capacity
//! elements, reused every step.
class fused_topk_workspace {
 public:
  //! A workspace for buffers of up to \p capacity elements, with \p threads threads for
  //! the fused pass of large layers (1: the calling thread only).
  explicit fused_topk_workspace(std::size_t capacity = 0, unsigned threads = 1)
      : idx_(capacity), bits_(capacity), digits_(std::size_t{1} << 12), threads_(std::max(1u, threads)) {
    if (threads_ > 1) {
      thread_hist_.resize(threads_);
      thread_results_.resize(threads_);
      pool_.reserve(threads_ - 1);
    }
  }

  //! Elements the workspace holds.
  [[nodiscard]] std::size_t capacity() const noexcept { return idx_.size(); }

  //! The fused pass over one layer whose candidates go to the slots at \p slot:
  //! u = g + e over e, sums, candidates with key >= \p guess, the elements \p hs selects
  //! into its histogram. Returns the measurements; candidates are contiguous. Candidates
  //! with key >= \p zero_from (no_guess: none) are left as zero in e (see
  //! fused_pass_chunk): then keep_selected or zero_below (with the residual) and
  //! write_segment_from_candidates must follow.
  fused_pass_result fuse(std::span<const float> g, std::span<float> e, std::size_t slot, std::uint32_t guess,
                         const histogram_sampling& hs = {}, std::uint32_t zero_from = no_guess) {
    const std::size_t n = g.size();
    if (threads_ > 1 && n >= threads_ * min_chunk) return fuse_threaded(g, e, slot, guess, hs, zero_from);
    return fuse_chunk(g.data(), e.data(), n, 0, guess, idx_.data() + slot, bits_.data() + slot, hs, zero_from);
  }

  //! Adds the \p count candidates at \p slot to \p h exactly (count and energy): the part
  //! of a sampled gain histogram above the guess (see histogram_sampling).
  void add_candidates(magnitude_histogram& h, std::size_t slot, std::size_t count) const noexcept {
    if (count == 0) return;
    std::uint32_t kmin = 0xffffffffu, kmax = 0;
    const std::uint32_t* bp = bits_.data() + slot;
    for (std::size_t i = 0; i < count; ++i) {
      const std::uint32_t k = bp[i] & 0x7fffffffu;
      kmin = std::min(kmin, k);
      kmax = std::max(kmax, k);
      h.add_unchecked(k);
    }
    h.note_range(kmin, kmax);
  }

  //! After a miss: collects every finite element of u (held in e) with key >= \p floor.
  std::size_t recollect(std::span<const float> u, std::size_t slot, std::uint32_t floor) noexcept {
    return collect_at_least(u, floor, idx_.data() + slot, bits_.data() + slot);
  }

  //! The k-th largest key over the candidate runs (k >= 1 and at most their total), by a
  //! three-level radix select on 12, 12 and 7 key bits.
  kth_key select(std::span<const candidate_run> runs, std::uint64_t k) noexcept {
    struct level {
      unsigned shift, bits;
    };
    constexpr level levels[] = {{19, 12}, {7, 12}, {0, 7}};
    std::uint32_t prefix = 0;
    for (const level lv : levels) {
      const unsigned above = lv.shift + lv.bits;  // bits above this level's digit form the prefix
      const std::uint32_t mask = (1u << lv.bits) - 1u;
      std::fill_n(digits_.begin(), std::size_t{1} << lv.bits, 0);
      for (const auto& r : runs) {
        const std::uint32_t* bp = bits_.data() + r.first;
        for (std::size_t i = 0; i < r.count; ++i) {
          const std::uint32_t key = bp[i] & 0x7fffffffu;
          if ((key >> above) == prefix) ++digits_[(key >> lv.shift) & mask];
        }
      }
      std::uint64_t cum = 0;
      std::uint32_t d = mask;
      for (;; --d) {
        if (cum + digits_[d] >= k || d == 0) break;
        cum += digits_[d];
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
  //! back, and every kept candidate the pass left in it is zeroed. (Both are scattered
  //! writes to a layer out of the cache: zero_from near t keeps them few.)
  std::size_t keep_selected(candidate_run run, std::uint32_t t, std::uint64_t& ties_left,
                            std::span<float> residual = {}, std::uint32_t zero_from = 0) noexcept {
    std::uint32_t* ip = idx_.data() + run.first;
    std::uint32_t* bp = bits_.data() + run.first;
    std::size_t w = 0;
    for (std::size_t i = 0; i < run.count; ++i) {
      const std::uint32_t ix = ip[i], b = bp[i], k = b & 0x7fffffffu;
      bool take = k > t;
      if (k == t && ties_left > 0) {
        take = true;
        --ties_left;
      }
      if (!residual.empty() && take != (k >= zero_from)) residual[ix] = take ? 0.0f : std::bit_cast<float>(b);
      ip[w] = ix;
      bp[w] = b;
      w += take ? 1u : 0u;
    }
    return w;
  }

  //! Zeroes in \p residual the candidates of \p run with key below \p zero_from, which a
  //! pass with that zero_from left in it: when every candidate is sent.
  void zero_below(candidate_run run, std::uint32_t zero_from, std::span<float> residual) const noexcept {
    const std::uint32_t* ip = idx_.data() + run.first;
    const std::uint32_t* bp = bits_.data() + run.first;
    for (std::size_t i = 0; i < run.count; ++i)
      if ((bp[i] & 0x7fffffffu) < zero_from) residual[ip[i]] = 0.0f;
  }

  //! Writes the sparse segment of layer \p index (\p numel elements) from the \p count
  //! candidates at \p slot, values from the pass (after a pass that zeroed them in e: the
  //! residual is already right, and e is not touched). Returns the energy sent.
  double write_segment_from_candidates(byte_writer& w, std::uint32_t index, std::size_t numel, std::size_t slot,
                                       std::size_t count) {
    const segment_header sh = sparse_header(index, numel, count);
    double ksq = 0;
    const std::uint32_t* ip = idx_.data() + slot;
    const std::uint32_t* bp = bits_.data() + slot;
    write_segment(w, sh, [&](byte_writer& bw) {
      std::byte* id = bw.reserve(count * sizeof(std::uint32_t));
      std::byte* vd = bw.reserve(count * sizeof(float));
      std::memcpy(id, ip, count * sizeof(std::uint32_t));
      std::memcpy(vd, bp, count * sizeof(float));
      for (std::size_t j = 0; j < count; ++j) {
        const double v = std::bit_cast<float>(bp[j]);
        ksq += v * v;
      }
    });
    return ksq;
  }

  //! Writes the sparse segment of layer \p index from the \p count selected indices at
  //! \p slot, taking each value from u (held in e) and leaving zero in the residual.
  //! Returns the energy sent.
  double write_segment_from(byte_writer& w, std::uint32_t index, std::span<float> e, std::size_t slot,
                            std::size_t count) {
    const segment_header sh = sparse_header(index, e.size(), count);
    double ksq = 0;
    const std::uint32_t* ip = idx_.data() + slot;
    write_segment(w, sh, [&](byte_writer& bw) {
      std::byte* id = bw.reserve(count * sizeof(std::uint32_t));
      std::byte* vd = bw.reserve(count * sizeof(float));
      // The selected elements are scattered over a layer that left the cache during the
      // fused pass: prefetching 64 ahead overlaps their misses (3x faster at 2^24).
      constexpr std::size_t ahead = 64;
      for (std::size_t j = 0; j < count; ++j) {
        if (j + ahead < count) __builtin_prefetch(e.data() + ip[j + ahead], 1);
        const std::uint32_t ix = ip[j];
        const float v = e[ix];
        e[ix] = 0.0f;
        ksq += static_cast<double>(v) * v;
        std::memcpy(id + j * sizeof(std::uint32_t), &ix, sizeof ix);
        std::memcpy(vd + j * sizeof(float), &v, sizeof v);
      }
    });
    return ksq;
  }

  //! Selected index \p j of the layer at \p slot (after keep_selected).
  [[nodiscard]] std::uint32_t index_at(std::size_t slot, std::size_t j) const noexcept { return idx_[slot + j]; }
  //! Key of candidate \p j of the layer at \p slot.
  [[nodiscard]] std::uint32_t key_at(std::size_t slot, std::size_t j) const noexcept {
    return bits_[slot + j] & 0x7fffffffu;
  }

 private:
  // The header of a sparse segment of \p count values of layer \p index (\p numel elements).
  static segment_header sparse_header(std::uint32_t index, std::size_t numel, std::size_t count) noexcept {
    segment_header sh;
    sh.layer = index;
    sh.index_width = index_width_for(numel);
    sh.numel = numel;
    sh.count = count;
    return sh;
  }

  // Below this many elements per thread a thread costs more than it saves.
  static constexpr std::size_t min_chunk = std::size_t{1} << 18;

  static fused_pass_result fuse_chunk(const float* g, float* e, std::size_t n, std::uint32_t base,
                                      std::uint32_t guess, std::uint32_t* idx, std::uint32_t* bits,
                                      const histogram_sampling& hs, std::uint32_t zero_from) noexcept {
#if GRAVAC_ISA_DISPATCH
    if (runs_avx2_kernels()) return fused_pass_avx2(g, e, n, base, guess, idx, bits, hs, zero_from);
#endif
    return fused_pass<fused_lanes>(g, e, n, base, guess, idx, bits, hs, zero_from);
  }

  // Splits the layer into one chunk per thread (whole blocks, so histogram sampling picks
  // the same blocks as one thread would); each collects into its own part of the layer's
  // region and fills its own histogram. The parts are then moved together (in index
  // order) and the histograms merged.
  fused_pass_result fuse_threaded(std::span<const float> g, std::span<float> e, std::size_t slot,
                                  std::uint32_t guess, const histogram_sampling& hs, std::uint32_t zero_from) {
    const std::size_t n = g.size();
    const std::size_t blocks = (n + fused_block - 1) / fused_block;
    const std::size_t per = (blocks + threads_ - 1) / threads_ * fused_block;
    auto work = [&](unsigned t) {
      const std::size_t a = std::min(n, t * per), b = std::min(n, a + per);
      histogram_sampling ths = hs;
      if (hs.hist != nullptr) ths.hist = &thread_hist_[t];
      thread_results_[t] = fuse_chunk(g.data() + a, e.data() + a, b - a, static_cast<std::uint32_t>(a), guess,
                                      idx_.data() + slot + a, bits_.data() + slot + a, ths, zero_from);
    };
    for (unsigned t = 1; t < threads_; ++t) pool_.emplace_back(work, t);
    work(0);
    pool_.clear();  // joins
    fused_pass_result r;
    std::size_t c = 0;
    for (unsigned t = 0; t < threads_; ++t) {
      const auto& tr = thread_results_[t];
      const std::size_t a = std::min(n, t * per);
      if (c != a) {
        std::memmove(idx_.data() + slot + c, idx_.data() + slot + a, tr.collected * sizeof(std::uint32_t));
        std::memmove(bits_.data() + slot + c, bits_.data() + slot + a, tr.collected * sizeof(std::uint32_t));
      }
      c += tr.collected;
      r.grad_sq += tr.grad_sq;
      r.input_sq += tr.input_sq;
      r.non_finite = r.non_finite || tr.non_finite;
      if (hs.hist != nullptr) {
        hs.hist->merge(thread_hist_[t]);
        thread_hist_[t].clear();
      }
    }
    r.collected = c;
    return r;
  }

  std::vector<std::uint32_t> idx_;
  std::vector<std::uint32_t> bits_;
  std::vector<std::uint64_t> digits_;
  unsigned threads_ = 1;
  std::vector<magnitude_histogram> thread_hist_;
  std::vector<fused_pass_result> thread_results_;
  std::vector<std::jthread> pool_;
};

//! The gain curve of a layer of \p numel elements after its fused pass (with sampling \p hs
//! and \p collected candidates at \p slot): completes a sampled histogram with the exact
//! candidates, then adds the curve to \p kept_sq.
inline void add_fused_gain_curve(const fused_topk_workspace& w, const histogram_sampling& hs, std::size_t slot,
                                 std::size_t collected, std::size_t numel, std::span<const double> candidates,
                                 std::span<double> kept_sq) noexcept {
  if (hs.stride > 1) w.add_candidates(*hs.hist, slot, collected);
  add_gain_curve(*hs.hist, numel, candidates, kept_sq);
}

//! The next step's guess: the threshold key lowered by a margin of \p margin in magnitude
//! (magnitudes drift slowly from step to step, so the next top-k is almost surely above it).
[[nodiscard]] inline std::uint32_t widened_guess(std::uint32_t threshold_key, float margin) noexcept {
  return magnitude_key(key_magnitude(threshold_key) * margin);
}

}  // namespace gravac::detail
