#pragma once
//! \file fused_lanes.hpp
//! \brief The vector lanes of the fused error-feedback pass (detail of fused_pass.hpp):
//! groups of 8 elements in SSE2 lanes, in one AVX2 vector (fused_lanes_avx2, compiled for
//! AVX2 and chosen at run time), or in plain C++ (any architecture; GRAVAC_PORTABLE_KERNELS
//! selects it on x86 for tests). All three give the same bits.

#include <bit>
#include <cstdint>

#if defined(__SSE2__) && !defined(GRAVAC_PORTABLE_KERNELS)
#include <emmintrin.h>
#endif

#include "gravac/core/detail/isa_dispatch.hpp"
#if GRAVAC_ISA_DISPATCH
#include <immintrin.h>
#endif

#include "gravac/core/detail/square_sum.hpp"
#include "gravac/stats/magnitude_histogram.hpp"

namespace gravac::detail {

//! Groups of 8 of the fused pass: u = g + e stored over e, the float lanes of the leaf sums
//! of g^2 and u^2 (square_sum.hpp), a non-finite flag, and the mask of the lanes whose key lies in (lo,
//! non_finite_key). With \p Band, also a count of the lanes whose key lies in (band_lo, non_finite_key): the elements
//! at or above a lower floor, counted without being collected (see fused_pass_result::at_floor). Keys are below 2^31,
//! so signed compares order them, which SSE2 has.
#if defined(__SSE2__) && !defined(GRAVAC_PORTABLE_KERNELS)
struct fused_lanes {
  __m128 fg0 = _mm_setzero_ps(), fg1 = _mm_setzero_ps(), fu0 = _mm_setzero_ps(), fu1 = _mm_setzero_ps();
  __m128i nf = _mm_setzero_si128();
  __m128i band = _mm_setzero_si128();  // per lane: elements at or above the floor

  template <bool Collect, bool Band = false>
  unsigned step8(const float* g, float* e, std::int32_t lo, std::int32_t band_lo = 0) noexcept {
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
    if constexpr (Band) {  // a true compare is -1: subtracting it counts
      const __m128i b = _mm_set1_epi32(band_lo);
      band = _mm_sub_epi32(band, _mm_andnot_si128(bad0, _mm_cmpgt_epi32(k0, b)));
      band = _mm_sub_epi32(band, _mm_andnot_si128(bad1, _mm_cmpgt_epi32(k1, b)));
    }
    const __m128i l = _mm_set1_epi32(lo);
    const __m128i c0 = _mm_andnot_si128(bad0, _mm_cmpgt_epi32(k0, l));
    const __m128i c1 = _mm_andnot_si128(bad1, _mm_cmpgt_epi32(k1, l));
    return static_cast<unsigned>(_mm_movemask_ps(_mm_castsi128_ps(c0)) | (_mm_movemask_ps(_mm_castsi128_ps(c1)) << 4));
  }
  //! The block's leaf sums (square_sum.hpp) into \p gs and \p us; restarts the lanes.
  void flush(double& gs, double& us) noexcept {
    alignas(16) float a[4], b[4];
    _mm_store_ps(a, _mm_add_ps(fg0, fg1));
    _mm_store_ps(b, _mm_add_ps(fu0, fu1));
    gs = (static_cast<double>(a[0]) + a[1]) + (static_cast<double>(a[2]) + a[3]);
    us = (static_cast<double>(b[0]) + b[1]) + (static_cast<double>(b[2]) + b[3]);
    fg0 = fg1 = fu0 = fu1 = _mm_setzero_ps();
  }
  //! Stores the (index, bit pattern) of the lanes of \p mask (the last step8's group of 8
  //! at \p e, element \p first) at \p idx / \p bits; returns how many. A loop over the
  //! set bits, which are rare.
  static unsigned collect8(unsigned mask, std::uint32_t first, const float* e, std::uint32_t* idx,
                           std::uint32_t* bits) noexcept {
    unsigned c = 0;
    while (mask != 0) {
      const auto l = static_cast<std::uint32_t>(std::countr_zero(mask));
      idx[c] = first + l;
      bits[c] = std::bit_cast<std::uint32_t>(e[l]);
      ++c;
      mask &= mask - 1;
    }
    return c;
  }
  //! The elements counted at or above the floor so far (lanes of 32 bits: a chunk has
  //! fewer than 2^32 groups of 8).
  [[nodiscard]] std::uint64_t band_count() const noexcept {
    alignas(16) std::uint32_t c[4];
    _mm_store_si128(reinterpret_cast<__m128i*>(c), band);
    return std::uint64_t{c[0]} + c[1] + c[2] + c[3];
  }
  [[nodiscard]] bool non_finite() const noexcept { return _mm_movemask_epi8(nf) != 0; }
};
#else
// Portable version (any architecture; GRAVAC_PORTABLE_KERNELS selects it on x86 for tests).
struct fused_lanes {
  float fg[8] = {}, fu[8] = {};
  bool nf = false;
  std::uint64_t band = 0;

  template <bool Collect, bool Band = false>
  unsigned step8(const float* g, float* e, std::int32_t lo, std::int32_t band_lo = 0) noexcept {
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
      if constexpr (Collect && Band) band += (!bad && static_cast<std::int32_t>(k) > band_lo) ? 1u : 0u;
    }
    return mask;
  }
  //! The block's leaf sums (square_sum.hpp) into \p gs and \p us; restarts the lanes.
  void flush(double& gs, double& us) noexcept {
    gs = combine_square_lanes(fg);
    us = combine_square_lanes(fu);
    for (unsigned l = 0; l < 8; ++l) fg[l] = fu[l] = 0.0f;
  }
  //! Stores the (index, bit pattern) of the lanes of \p mask (the last step8's group of 8
  //! at \p e, element \p first) at \p idx / \p bits; returns how many. A loop over the
  //! set bits, which are rare.
  static unsigned collect8(unsigned mask, std::uint32_t first, const float* e, std::uint32_t* idx,
                           std::uint32_t* bits) noexcept {
    unsigned c = 0;
    while (mask != 0) {
      const auto l = static_cast<std::uint32_t>(std::countr_zero(mask));
      idx[c] = first + l;
      bits[c] = std::bit_cast<std::uint32_t>(e[l]);
      ++c;
      mask &= mask - 1;
    }
    return c;
  }
  [[nodiscard]] std::uint64_t band_count() const noexcept { return band; }
  [[nodiscard]] bool non_finite() const noexcept { return nf; }
};
#endif

#if GRAVAC_ISA_DISPATCH
//! fused_lanes with one 256-bit vector per quantity, for processors with AVX2 (see
//! fused_pass_avx2): half the instructions of the SSE2 version and the same bits
//! (lane l of the vector sums what lane l % 4 of the SSE2 version's fg0 or fg1 sums, and
//! flush adds the two halves as the SSE2 version adds fg0 and fg1).
//! Lane indices of the set bits of each 8-bit mask, in order (the rest zero): what
//! fused_lanes_avx2::collect8 permutes by.
struct compress_lut {
  alignas(64) std::uint8_t lanes[256][8] = {};
  constexpr compress_lut() noexcept {
    for (unsigned m = 0; m < 256; ++m) {
      unsigned c = 0;
      for (unsigned l = 0; l < 8; ++l)
        if (m & (1u << l)) lanes[m][c++] = static_cast<std::uint8_t>(l);
    }
  }
};
inline constexpr compress_lut compress_lanes{};

struct fused_lanes_avx2 {
  __m256 fg, fu;
  __m256i nf, band;
  __m256 last_u;  // u of the last step8's group, for collect8

  [[gnu::target("avx2")]] fused_lanes_avx2() noexcept
      : fg(_mm256_setzero_ps()),
        fu(_mm256_setzero_ps()),
        nf(_mm256_setzero_si256()),
        band(_mm256_setzero_si256()),
        last_u(_mm256_setzero_ps()) {}

  //! Stores the (index, bit pattern) of the lanes of \p mask of the last step8's group
  //! (element \p first) at \p idx / \p bits; returns how many. One permutation moves the
  //! selected lanes to the front and all 8 are stored (the caller's slots reach at least 8
  //! past its count: candidates never outnumber the elements seen), so no branch depends on
  //! the data.
  [[gnu::target("avx2")]] unsigned collect8(unsigned mask, std::uint32_t first, const float*, std::uint32_t* idx,
                                            std::uint32_t* bits) const noexcept {
    if (mask == 0) return 0;  // most groups: predicted well
    const __m256i perm =
        _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(compress_lanes.lanes[mask])));
    const __m256i ix = _mm256_add_epi32(_mm256_set1_epi32(static_cast<std::int32_t>(first)), perm);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(idx), ix);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(bits),
                        _mm256_permutevar8x32_epi32(_mm256_castps_si256(last_u), perm));
    return static_cast<unsigned>(std::popcount(mask));
  }

  template <bool Collect, bool Band = false>
  [[gnu::target("avx2")]] unsigned step8(const float* g, float* e, std::int32_t lo, std::int32_t band_lo = 0) noexcept {
    const __m256i abs_mask = _mm256_set1_epi32(0x7fffffff);
    const __m256i largest_finite = _mm256_set1_epi32(static_cast<std::int32_t>(non_finite_key - 1));
    const __m256 gv = _mm256_loadu_ps(g);
    const __m256 u = _mm256_add_ps(gv, _mm256_loadu_ps(e));
    _mm256_storeu_ps(e, u);
    last_u = u;
    fg = _mm256_add_ps(fg, _mm256_mul_ps(gv, gv));
    fu = _mm256_add_ps(fu, _mm256_mul_ps(u, u));
    const __m256i k = _mm256_and_si256(_mm256_castps_si256(u), abs_mask);
    const __m256i bad = _mm256_cmpgt_epi32(k, largest_finite);
    nf = _mm256_or_si256(nf, bad);
    if constexpr (!Collect) return 0;
    if constexpr (Band)
      band = _mm256_sub_epi32(band, _mm256_andnot_si256(bad, _mm256_cmpgt_epi32(k, _mm256_set1_epi32(band_lo))));
    const __m256i c = _mm256_andnot_si256(bad, _mm256_cmpgt_epi32(k, _mm256_set1_epi32(lo)));
    return static_cast<unsigned>(_mm256_movemask_ps(_mm256_castsi256_ps(c)));
  }
  [[gnu::target("avx2")]] void flush(double& gs, double& us) noexcept {
    alignas(16) float a[4], b[4];
    _mm_store_ps(a, _mm_add_ps(_mm256_castps256_ps128(fg), _mm256_extractf128_ps(fg, 1)));
    _mm_store_ps(b, _mm_add_ps(_mm256_castps256_ps128(fu), _mm256_extractf128_ps(fu, 1)));
    gs = (static_cast<double>(a[0]) + a[1]) + (static_cast<double>(a[2]) + a[3]);
    us = (static_cast<double>(b[0]) + b[1]) + (static_cast<double>(b[2]) + b[3]);
    fg = fu = _mm256_setzero_ps();
  }
  [[nodiscard, gnu::target("avx2")]] std::uint64_t band_count() const noexcept {
    alignas(32) std::uint32_t c[8];
    _mm256_store_si256(reinterpret_cast<__m256i*>(c), band);
    std::uint64_t s = 0;
    for (std::uint32_t x : c) s += x;
    return s;
  }
  [[nodiscard, gnu::target("avx2")]] bool non_finite() const noexcept { return _mm256_movemask_epi8(nf) != 0; }
};
#endif

}  // namespace gravac::detail
