#pragma once
//! \file
//! \brief The checkpoint file's framing: its header, length-prefixed blobs, and whole-file reads
//! (writes: atomic_file.hpp).

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "gravac/core/error.hpp"
#include "gravac/core/layout.hpp"
#include "gravac/packet/format.hpp"

namespace gravac::detail {

//! Fixed header of a checkpoint file (32 bytes).
struct checkpoint_header {
  char magic[8] = {};               //!< checkpoint_magic
  std::uint32_t version = 0;        //!< checkpoint_version
  std::uint32_t header_bytes = 0;   //!< sizeof(checkpoint_header)
  std::uint64_t payload_bytes = 0;  //!< bytes after the header
  std::uint64_t checksum = 0;       //!< FNV-1a 64 of the payload
};
static_assert(sizeof(checkpoint_header) == 32);

//! Upper bound on the elements of one tensor dimension list, against absurd counts in a
//! corrupted file (a real tensor has a handful of dimensions).
inline constexpr std::uint64_t checkpoint_max_rank = 64;

inline void put_blob(byte_writer& w, std::span<const std::byte> b) {
  w.put<std::uint64_t>(b.size());
  w.put_array(b);
}

inline bool get_blob(byte_reader& r, std::vector<std::byte>& out) {
  std::uint64_t n = 0;
  std::span<const std::byte> s;
  if (!r.get(n) || n > r.remaining() || !r.take(static_cast<std::size_t>(n), s)) return false;
  out.assign(s.begin(), s.end());
  return true;
}

inline std::size_t blob_bytes(std::size_t n) { return 8 + pad8(n); }

//! Reads the whole file at \p path.
inline std::vector<std::byte> read_file(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) throw error(status::io_failure, "cannot open checkpoint '" + path + "'", -1, backend::io);
  std::vector<std::byte> out;
  std::byte buf[1 << 16];
  std::size_t n = 0;
  while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) out.insert(out.end(), buf, buf + n);
  const bool failed = std::ferror(f) != 0;
  std::fclose(f);
  if (failed) throw error(status::io_failure, "cannot read checkpoint '" + path + "'", -1, backend::io);
  return out;
}

}  // namespace gravac::detail
