#pragma once
//! \file
//! \brief The checkpoint blob of a state every bucket's compressor (or collective) has: the
//! one bucket's own blob as before buckets existed, or, with several, each bucket's blob
//! behind a small frame that says how many buckets there were.

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "gravac/core/error.hpp"

namespace gravac::detail {

//! Marks a multi-bucket state blob ("GVBUCKET").
inline constexpr std::uint64_t bucket_states_magic = 0x54454b4355425647ull;

//! Appends \p value's 8 bytes to \p out.
inline void put_u64(std::vector<std::byte>& out, std::uint64_t value) {
  const std::size_t at = out.size();
  out.resize(at + sizeof value);
  std::memcpy(out.data() + at, &value, sizeof value);
}

//! The blob of `save(part(b), blob_b)` for the \p buckets buckets.
template <class SaveBucket>
void save_bucket_states(std::size_t buckets, std::vector<std::byte>& out, SaveBucket&& save) {
  out.clear();
  if (buckets == 1) return save(std::size_t{0}, out);
  put_u64(out, bucket_states_magic);
  put_u64(out, buckets);
  std::vector<std::byte> one;
  for (std::size_t b = 0; b < buckets; ++b) {
    one.clear();
    save(b, one);
    put_u64(out, one.size());
    out.insert(out.end(), one.begin(), one.end());
  }
}

//! Hands each of the \p buckets buckets its part of \p blob (written by save_bucket_states):
//! `load(b, part)`. Checks the frame first (bucket count, lengths), so a blob of another
//! bucket split is rejected before any bucket loads anything.
template <class LoadBucket>
void load_bucket_states(std::size_t buckets, std::span<const std::byte> blob, const std::string& what,
                        LoadBucket&& load) {
  if (buckets == 1) return load(std::size_t{0}, blob);
  const auto u64_at = [&](std::size_t at) {
    std::uint64_t v = 0;
    std::memcpy(&v, blob.data() + at, sizeof v);
    return v;
  };
  const auto fail = [&](const std::string& why) {
    throw error(status::invalid_argument, "restore_checkpoint: the " + what + " state " + why);
  };
  if (blob.size() < 16 || u64_at(0) != bucket_states_magic)
    fail("was saved with one bucket; this trainer has " + std::to_string(buckets) +
         " (keep options::bucket_bytes between save and restore)");
  if (u64_at(8) != buckets)
    fail("was saved with " + std::to_string(u64_at(8)) + " buckets; this trainer has " + std::to_string(buckets) +
         " (keep options::bucket_bytes between save and restore)");
  std::vector<std::span<const std::byte>> parts;
  std::size_t at = 16;
  for (std::size_t b = 0; b < buckets; ++b) {
    if (blob.size() - at < 8) fail("is truncated");
    const std::uint64_t n = u64_at(at);
    at += 8;
    if (blob.size() - at < n) fail("is truncated");
    parts.push_back(blob.subspan(at, static_cast<std::size_t>(n)));
    at += static_cast<std::size_t>(n);
  }
  if (at != blob.size()) fail("has trailing bytes");
  for (std::size_t b = 0; b < buckets; ++b) load(b, parts[b]);
}

}  // namespace gravac::detail
