#pragma once
//! \file quantize_kernels.hpp
//! \brief Loops shared by the quantizers: counter-based random draws, chunked code
//! packing, and sums with independent partial accumulators (so the compiler can keep
//! them in vector lanes without -ffast-math).

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "gravac/compress/detail/float_bits.hpp"
#include "gravac/core/detail/isa_dispatch.hpp"
#include "gravac/packet/detail/bit_codes.hpp"

namespace gravac::detail {

//! Elements processed per chunk: codes and random draws of one chunk live on the stack.
inline constexpr std::size_t quant_chunk = 1024;

//! Independent float partial sums per reduction. Sixteen, not eight: with eight, GCC 12
//! vectorizes the i loop with interleaved (transposing) loads and runs several times
//! slower; with sixteen it vectorizes the unrolled body (4 SSE or 2 AVX vectors per sum).
inline constexpr std::size_t sum_lanes = 16;

//! The (n+1)-th output of splitmix64(seed): splitmix64's state advances by a constant, so
//! any draw can be computed from its position; the stream is the same as
//! splitmix64(seed).next() called n+1 times. The quantizers use it once per 64 elements
//! (random_group_key), where 64-bit multiplies cost nothing.
constexpr std::uint64_t splitmix64_nth(std::uint64_t seed, std::uint64_t n) noexcept {
  std::uint64_t z = seed + (n + 1) * 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

//! Murmur3's 32-bit finalizer: a bijective mix with full avalanche, on 32-bit lanes only
//! (SSE2 has no 64-bit vector multiply; every x86-64 and CUDA target has a 32-bit one).
constexpr std::uint32_t fmix32(std::uint32_t x) noexcept {
  x ^= x >> 16;
  x *= 0x85ebca6bu;
  x ^= x >> 13;
  x *= 0xc2b2ae35u;
  return x ^ (x >> 16);
}

//! Elements that share one 64-bit group key in element_bits.
inline constexpr std::size_t random_group = 64;
//! The counter step inside a group (the 32-bit golden ratio, as SplitMix32).
inline constexpr std::uint32_t random_step = 0x9e3779b9u;

//! Key of the \p group -th group of random_group elements of a stream: the low half of a
//! full 64-bit splitmix64 mix, so groups (and layers, steps, seeds) are independent.
constexpr std::uint32_t random_group_key(std::uint64_t stream, std::uint64_t group) noexcept {
  return static_cast<std::uint32_t>(splitmix64_nth(stream, group));
}

//! The 32 random bits of element \p i of a layer stream (the stochastic quantizers' draw):
//! fmix32(key(i / 64) + (i % 64) * golden ratio), a SplitMix32 step inside each group of 64.
//! A pure function of (stream, i): loops over elements carry no dependency and
//! vectorize, any chunking gives the same bits, and a device kernel computes the same draw
//! per thread. Distinct elements of a group give distinct values (fmix32 is a bijection).
constexpr std::uint32_t element_bits(std::uint64_t stream, std::uint64_t i) noexcept {
  return fmix32(random_group_key(stream, i / random_group) +
                static_cast<std::uint32_t>(i % random_group) * random_step);
}

//! Uniform float in [0, 1) from the top 24 of 32 random bits (exactly representable).
GRAVAC_KERNEL_INLINE float uniform24(std::uint32_t bits) noexcept {
  return static_cast<float>(static_cast<std::int32_t>(bits >> 8)) * 0x1p-24f;
}

//! Fills \p u[0..m) with uniform24(element_bits(stream, first + k)). \p first must be a
//! multiple of random_group (chunks start on bucket boundaries, which are multiples of 64).
GRAVAC_KERNEL_INLINE void fill_uniforms(std::uint64_t stream, std::size_t first, std::size_t m, float* u) noexcept {
  for (std::size_t at = 0; at < m; at += random_group) {
    const std::uint32_t key = random_group_key(stream, (first + at) / random_group);
    float* ug = u + at;
    if (m - at >= random_group) {
      for (std::uint32_t j = 0; j < random_group; ++j) ug[j] = uniform24(fmix32(key + j * random_step));
    } else {
      const auto rest = static_cast<std::uint32_t>(m - at);
      for (std::uint32_t j = 0; j < rest; ++j) ug[j] = uniform24(fmix32(key + j * random_step));
    }
  }
}

//! Packs \p m codes of W bits (W in 1, 2, 4), one per byte of \p codes, into \p out
//! (code_bytes(m, W) bytes written). Eight codes at a time as one 64-bit word, folded by
//! three shift-or-mask steps, so no per-code shifting. \p codes must be readable up to
//! m rounded up to 8, with zeros after m; the first code lands on bit 0 of out[0].
template <unsigned W>
GRAVAC_KERNEL_INLINE void pack_code_bytes(const std::uint8_t* __restrict codes, std::size_t m,
                                          std::byte* __restrict out) noexcept {
  static_assert(W == 1 || W == 2 || W == 4);
  constexpr std::uint64_t m1 = W == 1 ? 0x0003000300030003ull : W == 2 ? 0x000f000f000f000full : 0x00ff00ff00ff00ffull;
  constexpr std::uint64_t m2 = W == 1 ? 0x0000000f0000000full : W == 2 ? 0x000000ff000000ffull : 0x0000ffff0000ffffull;
  constexpr std::uint64_t m3 = (1ull << (8 * W)) - 1;
  const std::size_t words = m / 8;
  for (std::size_t k = 0; k < words; ++k) {
    std::uint64_t x;
    std::memcpy(&x, codes + 8 * k, 8);
    x = (x | (x >> (8 - W))) & m1;
    x = (x | (x >> (16 - 2 * W))) & m2;
    x = (x | (x >> (32 - 4 * W))) & m3;
    std::memcpy(out + k * W, &x, W);  // little-endian: the low W bytes
  }
  if (m % 8) {
    std::uint64_t x;
    std::memcpy(&x, codes + 8 * words, 8);
    x = (x | (x >> (8 - W))) & m1;
    x = (x | (x >> (16 - 2 * W))) & m2;
    x = (x | (x >> (32 - 4 * W))) & m3;
    std::memcpy(out + words * W, &x, code_bytes(m, W) - words * W);
  }
}

//! Packs \p m codes of W bits into \p out (code_bytes(m, W) bytes written). The first code
//! lands on bit 0 of out[0], so chunks must start on a 64-code boundary.
template <unsigned W>
void pack_codes(const std::uint16_t* codes, std::size_t m, std::byte* out) noexcept {
  constexpr std::size_t per = 64 / W;
  const std::size_t full = m / per;
  for (std::size_t w = 0; w < full; ++w) {
    std::uint64_t word = 0;
    for (std::size_t k = 0; k < per; ++k) word |= static_cast<std::uint64_t>(codes[w * per + k]) << (k * W);
    std::memcpy(out + 8 * w, &word, 8);
  }
  const std::size_t rest = m - full * per;
  if (rest) {
    std::uint64_t word = 0;
    for (std::size_t k = 0; k < rest; ++k) word |= static_cast<std::uint64_t>(codes[full * per + k]) << (k * W);
    std::memcpy(out + 8 * full, &word, code_bytes(rest, W));
  }
}

//! Unpacks \p m codes of W bits (W in 1, 2, 4) from \p in (code_bytes(m, W) bytes read)
//! into one byte each: pack_code_bytes run backwards, eight codes per 64-bit word by three
//! shift-or-mask steps. \p out must have room for m rounded up to 8.
template <unsigned W>
void unpack_code_bytes(const std::byte* __restrict in, std::size_t m, std::uint8_t* __restrict out) noexcept {
  static_assert(W == 1 || W == 2 || W == 4);
  constexpr std::uint64_t m0 = W == 1 ? 0x0101010101010101ull : W == 2 ? 0x0303030303030303ull : 0x0f0f0f0f0f0f0f0full;
  constexpr std::uint64_t m1 = W == 1 ? 0x0003000300030003ull : W == 2 ? 0x000f000f000f000full : 0x00ff00ff00ff00ffull;
  constexpr std::uint64_t m2 = W == 1 ? 0x0000000f0000000full : W == 2 ? 0x000000ff000000ffull : 0x0000ffff0000ffffull;
  auto spread = [](std::uint64_t x) {
    x = (x | (x << (32 - 4 * W))) & m2;
    x = (x | (x << (16 - 2 * W))) & m1;
    return (x | (x << (8 - W))) & m0;
  };
  const std::size_t words = m / 8;
  for (std::size_t k = 0; k < words; ++k) {
    std::uint64_t x = 0;
    std::memcpy(&x, in + k * W, W);  // a constant size: one load, not a library call
    x = spread(x);
    std::memcpy(out + 8 * k, &x, 8);
  }
  if (m % 8) {
    std::uint64_t x = 0;
    std::memcpy(&x, in + words * W, code_bytes(m, W) - words * W);
    x = spread(x);
    std::memcpy(out + 8 * words, &x, 8);
  }
}

//! Unpacks \p m one-bit codes from \p in (code_bytes(m, 1) bytes read) into one byte
//! each (0 or 1), eight at a time by 64-bit arithmetic: the byte is replicated, bit k kept
//! in byte k, and each byte tested for zero without carries between bytes. \p out must
//! have room for m rounded up to 8.
inline void unpack_bits_to_bytes(const std::byte* __restrict in, std::size_t m, std::uint8_t* __restrict out) noexcept {
  const std::size_t bytes = code_bytes(m, 1);
  for (std::size_t j = 0; j < bytes; ++j) {
    std::uint64_t x = static_cast<std::uint64_t>(in[j]) * 0x0101010101010101ull;
    x &= 0x8040201008040201ull;
    x = ((x + 0x7f7f7f7f7f7f7f7full) & 0x8080808080808080ull) >> 7;
    std::memcpy(out + 8 * j, &x, 8);
  }
}

//! Unpacks \p m codes of W bits from \p in (reads code_bytes(m, W) bytes).
template <unsigned W>
void unpack_codes(const std::byte* in, std::size_t m, std::uint16_t* codes) noexcept {
  constexpr std::size_t per = 64 / W;
  constexpr std::uint64_t mask = (1ull << W) - 1;
  const std::size_t full = m / per;
  for (std::size_t w = 0; w < full; ++w) {
    std::uint64_t word;
    std::memcpy(&word, in + 8 * w, 8);
    for (std::size_t k = 0; k < per; ++k) codes[w * per + k] = static_cast<std::uint16_t>((word >> (k * W)) & mask);
  }
  const std::size_t rest = m - full * per;
  if (rest) {
    std::uint64_t word = 0;
    std::memcpy(&word, in + 8 * full, code_bytes(rest, W));
    for (std::size_t k = 0; k < rest; ++k) codes[full * per + k] = static_cast<std::uint16_t>((word >> (k * W)) & mask);
  }
}

//! Elements ahead of the element being coded whose cache lines stream_prefetch asks for.
inline constexpr std::size_t prefetch_distance = 1024;

//! Asks for the cache lines of g and e (e to be written) at elements [at + prefetch_distance,
//! + random_group) of a layer of \p n elements, and for those of the codes the kernel will
//! write for them, \p code_bits per element from \p codes (the layer's first code; the
//! packet's lines would otherwise be read from memory when the first store misses). Called
//! once per group of 64 elements from a compute-bound coding loop, so that memory streams
//! the data a later pass reads while this one computes: the hardware prefetcher only
//! advances while loads miss, and asking for a whole block at once overflows the miss
//! buffers and stalls the loop.
GRAVAC_KERNEL_INLINE void stream_prefetch(const float* g, const float* e, std::size_t n, std::size_t at,
                                          const std::byte* codes, std::size_t code_bits) noexcept {
  const std::size_t from = at + prefetch_distance;
  if (from >= n) return;
  const std::size_t to = from + random_group < n ? from + random_group : n;
  for (std::size_t i = from; i < to; i += 16) {  // 16 floats a 64-byte line
    __builtin_prefetch(g + i);
    __builtin_prefetch(e + i, 1);
  }
  for (std::size_t b = from * code_bits / 8; b < to * code_bits / 8; b += 64) __builtin_prefetch(codes + b, 1);
}

//! Squared norms and max |.| of a block, with sum_lanes independent float partial sums
//! (then summed in double): vectorizable, and accurate enough for blocks of a few thousand.
struct block_sums {
  double g_sq = 0;   //!< sum of g^2
  double u_sq = 0;   //!< sum of u^2
  double u_abs = 0;  //!< sum of |u|
  float u_max = 0;   //!< max |u|
};

//! A block whose float sum of u^2 is below this (and u not all zero) is summed again in
//! double: squares below the smallest normal float (|u| below about 1e-19) lose bits or
//! vanish, which would give a tiny bucket a zero QSGD norm (nothing ever sent).
inline constexpr double tiny_block_sq = 0x1p-100;

//! The sums of a block whose float partial sums did not stay finite: u (already in \p u)
//! and g over [0, m), each term added in double in index order. accumulate_block's rare
//! path: a finite |u| or |g| above about 1.8e19 has a square past the float maximum (and
//! a few |u| near it a float sum of |u| past it), while in double every sum of a block
//! stays finite; also a non-zero block whose squares underflow (tiny_block_sq). A NaN or
//! infinite element gives non-finite sums here too. Not inlined
//! into the kernels (it is not on their fast path); quantize_cuda_kernels.hpp's
//! accumulate_chunks repeats it in the same order, bit for bit.
inline block_sums exact_block_sums(const float* g, const float* u, std::size_t m, float u_max) noexcept {
  block_sums s;
  for (std::size_t i = 0; i < m; ++i) {
    const double gi = g[i], ui = u[i];
    s.g_sq += gi * gi;
    s.u_sq += ui * ui;
    s.u_abs += ui < 0 ? -ui : ui;
  }
  s.u_max = u_max;
  return s;
}

//! The largest scale a leveled (QSGD or TernGrad) bucket sends: one float ulp below the
//! float maximum, the largest value for which step_value(scale, s) * s, what the decoder
//! computes for the top level, is finite for every level count s up to qsgd_max_levels
//! (test_quantizer_overflow checks every s). A bucket whose L2 norm exceeds it (finite
//! values, but a norm past the float maximum) sends this scale; the residual keeps the rest.
inline constexpr float max_level_scale = 0x1.fffffcp127f;

//! Computes u = g + e into e over [0, m) and returns its block sums.
GRAVAC_KERNEL_INLINE block_sums accumulate_block(const float* __restrict g, float* __restrict e,
                                                 std::size_t m) noexcept {
  constexpr std::size_t L = sum_lanes;
  float gs[L] = {}, us[L] = {}, ua[L] = {}, um[L] = {};
  std::size_t i = 0;
  for (; i + L <= m; i += L) {
    for (std::size_t k = 0; k < L; ++k) {
      const float gi = g[i + k];
      const float u = e[i + k] + gi;
      e[i + k] = u;
      const float a = std::fabs(u);
      gs[k] += gi * gi;
      us[k] += u * u;
      ua[k] += a;
      um[k] = um[k] > a ? um[k] : a;
    }
  }
  block_sums s;
  for (; i < m; ++i) {
    const float gi = g[i];
    const float u = e[i] + gi;
    e[i] = u;
    const float a = u < 0 ? -u : u;
    s.g_sq += static_cast<double>(gi) * gi;
    s.u_sq += static_cast<double>(u) * u;
    s.u_abs += a;
    s.u_max = s.u_max > a ? s.u_max : a;
  }
  for (std::size_t k = 0; k < L; ++k) {
    s.g_sq += gs[k];
    s.u_sq += us[k];
    s.u_abs += ua[k];
    s.u_max = s.u_max > um[k] ? s.u_max : um[k];
  }
  // A float lane overflowed (or the block is not finite), or the squares of a tiny
  // non-zero block underflowed: the block again, in double.
  if (!(std::isfinite(s.g_sq) && std::isfinite(s.u_sq) && std::isfinite(s.u_abs)) ||
      (s.u_sq < tiny_block_sq && s.u_max > 0)) [[unlikely]]
    s = exact_block_sums(g, e, m, s.u_max);
  return s;
}

}  // namespace gravac::detail
