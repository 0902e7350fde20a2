#pragma once
//! \file
//! \brief A small portable generator. std::uniform_*_distribution differ between
//! standard libraries, and ranks must draw identical streams from identical seeds.

#include <cstdint>

namespace gravac::detail {

//! SplitMix64: fast, portable, good enough for index sampling and stochastic rounding.
class splitmix64 {
 public:
  //! A generator seeded with \p seed.
  explicit constexpr splitmix64(std::uint64_t seed) noexcept : state_(seed) {}
  //! Next 64 random bits.
  constexpr std::uint64_t next() noexcept {
    std::uint64_t z = (state_ += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  //! Uniform double in [0, 1) with 53 random bits.
  constexpr double uniform() noexcept { return static_cast<double>(next() >> 11) * 0x1.0p-53; }
  //! Uniform float in [0, 1) with 24 random bits.
  constexpr float uniform_float() noexcept { return static_cast<float>(next() >> 40) * 0x1.0p-24f; }

 private:
  std::uint64_t state_;
};

//! Combines seeds (global seed, step, layer id) into one stream seed.
constexpr std::uint64_t mix_seed(std::uint64_t a, std::uint64_t b, std::uint64_t c = 0) noexcept {
  splitmix64 g(a ^ (b * 0x9e3779b97f4a7c15ull) ^ (c * 0xc2b2ae3d27d4eb4full));
  return g.next();
}

}  // namespace gravac::detail
