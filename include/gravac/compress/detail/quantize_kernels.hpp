#pragma once
//! \file quantize_kernels.hpp
//! \brief Loops shared by the quantizers: counter-based random draws, chunked code
//! packing, and sums with independent partial accumulators (so the compiler can keep
//! them in vector lanes without -ffast-math).

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "gravac/compress/detail/bit_codes.hpp"

namespace gravac::detail {

//! Elements processed per chunk: codes and random draws of one chunk live on the stack.
inline constexpr std::size_t quant_chunk = 1024;

//! The (n+1)-th output of splitmix64(seed): splitmix64's state advances by a constant, so
//! any draw can be computed from its position. The loops use this form because its
//! iterations are independent (they vectorize); the stream is the same as
//! splitmix64(seed).next() called n+1 times.
constexpr std::uint64_t splitmix64_nth(std::uint64_t seed, std::uint64_t n) noexcept {
  std::uint64_t z = seed + (n + 1) * 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

//! Uniform float in [0, 1) from 24 of the 32 bits of \p half (exactly representable).
inline float uniform24(std::uint32_t half) noexcept {
  return static_cast<float>(static_cast<std::int32_t>(half >> 8)) * 0x1p-24f;
}

//! Fills \p u[0..m) with uniforms for the elements starting at element \p first of a layer
//! stream: element i uses half (i % 2) of draw i / 2. \p first must be even.
inline void fill_uniforms(std::uint64_t stream, std::size_t first, std::size_t m, float* u) noexcept {
  const std::uint64_t d0 = first / 2;
  const std::size_t pairs = (m + 1) / 2;
  for (std::size_t j = 0; j < pairs; ++j) {
    const std::uint64_t x = splitmix64_nth(stream, d0 + j);
    u[2 * j] = uniform24(static_cast<std::uint32_t>(x));
    u[2 * j + 1] = uniform24(static_cast<std::uint32_t>(x >> 32));
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

//! Squared norms and max |.| of a block, with 8 independent float partial sums (then
//! summed in double): vectorizable, and accurate enough for blocks of a few thousand.
struct block_sums {
  double g_sq = 0;  //!< sum of g^2
  double u_sq = 0;  //!< sum of u^2
  double u_abs = 0; //!< sum of |u|
  float u_max = 0;  //!< max |u|
};

//! Computes u = g + e into e over [0, m) and returns its block sums.
inline block_sums accumulate_block(const float* g, float* e, std::size_t m) noexcept {
  float gs[8] = {}, us[8] = {}, ua[8] = {}, um[8] = {};
  std::size_t i = 0;
  for (; i + 8 <= m; i += 8) {
    for (std::size_t k = 0; k < 8; ++k) {
      const float gi = g[i + k];
      const float u = e[i + k] + gi;
      e[i + k] = u;
      const float a = u < 0 ? -u : u;
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
  for (std::size_t k = 0; k < 8; ++k) {
    s.g_sq += gs[k];
    s.u_sq += us[k];
    s.u_abs += ua[k];
    s.u_max = s.u_max > um[k] ? s.u_max : um[k];
  }
  return s;
}

}  // namespace gravac::detail
