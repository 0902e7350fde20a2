#pragma once
//! \file
//! \brief FNV-1a hashing of bytes and 64-bit values (layout hashes, state hashes).

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "gravac/core/error.hpp"

namespace gravac::detail {

//! FNV-1a, 64 bit: a stable, platform-independent hash (std::hash is neither).
constexpr std::uint64_t fnv1a(const void* data, std::size_t n, std::uint64_t h = 0xcbf29ce484222325ull) noexcept {
  const auto* p = static_cast<const unsigned char*>(data);
  for (std::size_t i = 0; i < n; ++i) {
    h ^= p[i];
    h *= 0x100000001b3ull;
  }
  return h;
}
//! Mixes one integer into an FNV-1a hash, byte by byte (little-endian order).
constexpr std::uint64_t fnv1a_u64(std::uint64_t v, std::uint64_t h) noexcept {
  for (int i = 0; i < 8; ++i) {
    h ^= (v >> (8 * i)) & 0xffu;
    h *= 0x100000001b3ull;
  }
  return h;
}

}  // namespace gravac::detail
