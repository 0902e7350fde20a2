#pragma once
//! \file bit_codes.hpp
//! \brief Fixed-width bit codes packed little-endian into a byte stream (code i occupies
//! bits [i*W, (i+1)*W) counting from bit 0 of byte 0). Widths divide 64, so codes never
//! straddle a 64-bit word and packing is a shift and an or per code.

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace gravac::detail {

//! Bytes that \p n codes of \p width bits occupy (before padding to 8).
constexpr std::size_t code_bytes(std::size_t n, unsigned width) noexcept { return (n * width + 7) / 8; }

//! Writes W-bit codes one after the other; call flush() once at the end. The destination
//! must hold code_bytes(n, W) bytes; bits after the last code of the last byte are zero.
template <unsigned W>
class code_writer {
  static_assert(W == 1 || W == 2 || W == 4 || W == 8 || W == 16, "code width must divide 64");

 public:
  //! Writes to \p out.
  explicit code_writer(std::byte* out) noexcept : out_(out) {}
  //! Appends one code (only its low W bits are used).
  void put(std::uint64_t code) noexcept {
    acc_ |= (code & mask) << bits_;
    bits_ += W;
    if (bits_ == 64) {
      std::memcpy(out_, &acc_, 8);
      out_ += 8;
      acc_ = 0;
      bits_ = 0;
    }
  }
  //! Writes the last partial word (only the bytes that hold codes).
  void flush() noexcept {
    if (bits_ > 0) std::memcpy(out_, &acc_, (bits_ + 7) / 8);
    bits_ = 0;
    acc_ = 0;
  }

 private:
  static constexpr std::uint64_t mask = W == 64 ? ~0ull : ((1ull << W) - 1);
  std::byte* out_;
  std::uint64_t acc_ = 0;
  unsigned bits_ = 0;
};

//! Reads W-bit codes written by code_writer. Never reads past code_bytes(n, W) bytes when
//! at most n codes are taken.
template <unsigned W>
class code_reader {
 public:
  //! Reads \p n codes from \p in.
  code_reader(const std::byte* in, std::size_t n) noexcept : in_(in), left_bytes_(code_bytes(n, W)) {}
  //! The next code.
  std::uint64_t get() noexcept {
    if (bits_ == 0) refill();
    const std::uint64_t c = acc_ & mask;
    acc_ >>= W;
    bits_ -= W;
    return c;
  }

 private:
  static constexpr std::uint64_t mask = (1ull << W) - 1;
  void refill() noexcept {
    acc_ = 0;
    const std::size_t take = left_bytes_ < 8 ? left_bytes_ : 8;
    std::memcpy(&acc_, in_, take);
    in_ += take;
    left_bytes_ -= take;
    bits_ = 64;
  }
  const std::byte* in_;
  std::size_t left_bytes_;
  std::uint64_t acc_ = 0;
  unsigned bits_ = 0;
};

//! True when every bit of \p bytes (a code region of n codes of W bits, padded) after bit
//! n*W is zero: the encoders leave padding zero, so anything else is corruption.
inline bool code_padding_zero(const std::byte* bytes, std::size_t padded_bytes, std::size_t used_bits) noexcept {
  std::size_t first = used_bits / 8;
  if (used_bits % 8) {
    const auto b = static_cast<unsigned>(bytes[first]);
    if (b >> (used_bits % 8)) return false;
    ++first;
  }
  for (std::size_t i = first; i < padded_bytes; ++i)
    if (bytes[i] != std::byte{0}) return false;
  return true;
}

}  // namespace gravac::detail
