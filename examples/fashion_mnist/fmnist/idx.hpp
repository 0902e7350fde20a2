#pragma once
//! \file idx.hpp
//! \brief A validating reader of IDX files (the format of MNIST and Fashion-MNIST),
//! gzip-compressed or plain: zlib's gzread reads both.
//!
//! An IDX file is a 4-byte magic (two zero bytes, a type code, the number of
//! dimensions), one big-endian 32-bit size per dimension, then the data. The reader
//! accepts unsigned-byte data (type 0x08) only, which is what the datasets use, and
//! refuses anything that does not add up: wrong magic, a dimension of zero, a size
//! that overflows, data shorter than the header promises (truncation) or longer
//! (trailing bytes), and gzip streams that zlib cannot decode.

#include <zlib.h>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

namespace fmnist {

//! A data file is missing, unreadable or malformed; what() says which file and why.
class data_error : public std::runtime_error {
 public:
  //! An error about \p file, explained by \p why.
  data_error(const std::string& file, const std::string& why) : std::runtime_error(file + ": " + why), file_(file) {}
  //! The file the error is about.
  [[nodiscard]] const std::string& file() const noexcept { return file_; }

 private:
  std::string file_;
};

//! The contents of one IDX file of unsigned bytes.
struct idx_array {
  std::vector<std::uint32_t> dims;  //!< sizes, outermost first (e.g. {60000, 28, 28})
  std::vector<std::uint8_t> data;   //!< the values, row-major

  //! Number of items (the outermost dimension).
  [[nodiscard]] std::size_t items() const noexcept { return dims.empty() ? 0 : dims.front(); }
  //! Values per item (product of the inner dimensions; 1 for a 1-D array).
  [[nodiscard]] std::size_t item_size() const noexcept {
    std::size_t s = 1;
    for (std::size_t i = 1; i < dims.size(); ++i) s *= dims[i];
    return s;
  }
};

namespace detail {

// Owns a gzFile so that every early return closes it.
class gz_file {
 public:
  explicit gz_file(const std::string& path) : f_(gzopen(path.c_str(), "rb")) {}
  gz_file(const gz_file&) = delete;
  gz_file& operator=(const gz_file&) = delete;
  ~gz_file() {
    if (f_) gzclose(f_);
  }
  [[nodiscard]] gzFile get() const noexcept { return f_; }

 private:
  gzFile f_;
};

// Reads up to n bytes; returns how many were read. A zlib error (corrupt stream,
// bad CRC, truncated gzip member) becomes a data_error naming zlib's message.
inline std::size_t gz_read(gzFile f, void* out, std::size_t n, const std::string& path) {
  auto* p = static_cast<unsigned char*>(out);
  std::size_t done = 0;
  while (done < n) {
    // gzread takes an unsigned count: read in chunks well below its limit.
    const auto chunk = static_cast<unsigned>(std::min<std::size_t>(n - done, 1u << 30));
    const int got = gzread(f, p + done, chunk);
    if (got < 0) {
      int code = 0;
      const char* msg = gzerror(f, &code);
      throw data_error(path, std::string("the gzip stream is corrupt (zlib: ") + (msg ? msg : "unknown error") + ")");
    }
    if (got == 0) break;
    done += static_cast<std::size_t>(got);
  }
  // gzread reports a gzip stream cut short as a short read with Z_BUF_ERROR pending.
  int code = Z_OK;
  const char* msg = gzerror(f, &code);
  if (code != Z_OK && code != Z_STREAM_END)
    throw data_error(path, std::string("the gzip stream is corrupt or truncated (zlib: ") + (msg ? msg : "?") + ")");
  return done;
}

inline std::uint32_t big_endian_u32(const unsigned char* b) noexcept {
  return (std::uint32_t{b[0]} << 24) | (std::uint32_t{b[1]} << 16) | (std::uint32_t{b[2]} << 8) | std::uint32_t{b[3]};
}

}  // namespace detail

//! Reads the IDX file at \p path (gzip or plain) whose data are unsigned bytes with
//! \p expected_rank dimensions. Throws data_error when the file is missing, is not an
//! IDX file of that kind, or holds fewer or more bytes than its header says.
inline idx_array read_idx_u8(const std::string& path, std::size_t expected_rank) {
  detail::gz_file f(path);
  if (!f.get()) throw data_error(path, "cannot open the file (missing or unreadable)");
  std::array<unsigned char, 4> magic{};
  if (detail::gz_read(f.get(), magic.data(), 4, path) != 4)
    throw data_error(path, "the file is too short to hold an IDX header");
  if (magic[0] != 0 || magic[1] != 0)
    throw data_error(path, "not an IDX file (the magic number must start with two zero bytes)");
  if (magic[2] != 0x08)
    throw data_error(path, "IDX data type " + std::to_string(magic[2]) + " is not unsigned byte (0x08)");
  if (magic[3] != expected_rank)
    throw data_error(
        path, "IDX file has " + std::to_string(magic[3]) + " dimensions, expected " + std::to_string(expected_rank));
  idx_array a;
  a.dims.resize(expected_rank);
  std::size_t total = 1;
  for (std::size_t d = 0; d < expected_rank; ++d) {
    std::array<unsigned char, 4> b{};
    if (detail::gz_read(f.get(), b.data(), 4, path) != 4)
      throw data_error(path, "the IDX header is truncated (dimension " + std::to_string(d) + " missing)");
    a.dims[d] = detail::big_endian_u32(b.data());
    if (a.dims[d] == 0) throw data_error(path, "IDX dimension " + std::to_string(d) + " is zero");
    // 2^31 bytes is far above any dataset this reader is meant for, and keeps the
    // product from overflowing whatever the header claims.
    if (total > (std::size_t{1} << 31) / a.dims[d])
      throw data_error(path, "IDX dimensions are implausibly large (more than 2^31 values)");
    total *= a.dims[d];
  }
  a.data.resize(total);
  const std::size_t got = detail::gz_read(f.get(), a.data.data(), total, path);
  if (got != total)
    throw data_error(path, "the file is truncated: the header promises " + std::to_string(total) + " values, found " +
                               std::to_string(got));
  unsigned char extra = 0;
  if (detail::gz_read(f.get(), &extra, 1, path) != 0)
    throw data_error(path, "the file holds more data than its header describes (trailing bytes)");
  return a;
}

}  // namespace fmnist
