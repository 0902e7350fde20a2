#pragma once
//! \file
//! \brief The wire format: a packet header, per-layer segments, and bounds-checked
//! readers and writers so that a malformed packet is rejected before any memory is touched.
//!
//! A packet is `packet_header` followed by `segment_count` segments. Each segment is a
//! `segment_header` followed by `payload_bytes` bytes whose meaning depends on the
//! packet kind. Every header and payload is padded to 8 bytes, so packets placed
//! back to back (as allgather delivers them) stay aligned.

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <type_traits>

#include "gravac/core/error.hpp"
#include "gravac/core/layout.hpp"

namespace gravac {

//! What a packet carries.
enum class packet_kind : std::uint8_t {
  dense = 1,             //!< raw float values
  sparse = 2,            //!< indices + float values (top-k, threshold)
  seeded = 3,            //!< float values at indices drawn from a shared seed (random-k)
  adacomp = 4,           //!< indices + packed signs + one scale per layer
  quantized = 5,         //!< QSGD / TernGrad / sign / cast16 codes
  low_rank = 6,          //!< PowerSGD factors
  sparse_quantized = 7,  //!< per-chunk offsets + 2-bit codes + one scale per chunk (SparseLoCo)
};

//! Fixed header of every packet (32 bytes, little-endian).
struct packet_header {
  std::uint32_t magic = 0;          //!< packet_magic
  std::uint16_t version = 0;        //!< packet_version
  std::uint8_t kind = 0;            //!< packet_kind
  std::uint8_t flags = 0;           //!< kind-specific
  std::uint32_t segment_count = 0;  //!< number of layer segments that follow
  std::uint32_t reserved = 0;       //!< zero
  std::uint64_t layout_hash = 0;    //!< layout::hash() of the sender
  std::uint64_t payload_bytes = 0;  //!< bytes after this header
};
static_assert(sizeof(packet_header) == 32 && std::is_trivially_copyable_v<packet_header>);

//! Header of one layer's segment (32 bytes).
struct segment_header {
  std::uint32_t layer = 0;          //!< layer index in the layout
  std::uint8_t index_width = 0;     //!< 0 (no indices), 4 or 8 bytes per index
  std::uint8_t encoding = 0;        //!< kind-specific (e.g. quantizer levels code)
  std::uint16_t reserved = 0;       //!< zero
  std::uint64_t numel = 0;          //!< the layer's element count, checked against the layout
  std::uint64_t count = 0;          //!< entries carried (kind-specific meaning)
  std::uint64_t payload_bytes = 0;  //!< bytes after this header, a multiple of 8
};
static_assert(sizeof(segment_header) == 32 && std::is_trivially_copyable_v<segment_header>);

//! "GRVC" in little-endian byte order.
inline constexpr std::uint32_t packet_magic = 0x43565247u;
//! Current wire-format version.
inline constexpr std::uint16_t packet_version = 1;

//! Rounds \p n up to a multiple of 8.
constexpr std::size_t pad8(std::size_t n) noexcept { return (n + 7u) & ~std::size_t{7}; }

//! Index width for a layer of \p numel elements: 32-bit where it fits, 64-bit otherwise.
constexpr std::uint8_t index_width_for(std::size_t numel) noexcept { return numel <= 0xffffffffull ? 4 : 8; }

//! Appends bytes to a caller-provided buffer; never writes past its end.
class byte_writer {
 public:
  //! Writes into \p out.
  explicit byte_writer(std::span<std::byte> out) noexcept : out_(out) {}

  //! Reserves \p n bytes (padded to 8) and returns where they start; throws when the buffer is too small.
  std::byte* reserve(std::size_t n) {
    const std::size_t padded = pad8(n);
    if (padded > out_.size() - pos_)
      throw error(status::invalid_argument, "packet buffer too small (needs " + std::to_string(pos_ + padded) +
                                                " bytes, has " + std::to_string(out_.size()) + ")");
    std::byte* p = out_.data() + pos_;
    if (padded > n) std::memset(p + n, 0, padded - n);
    pos_ += padded;
    return p;
  }
  //! Writes one trivially copyable value (padded to 8 bytes).
  template <class T>
  void put(const T& v) {
    static_assert(std::is_trivially_copyable_v<T>);
    std::memcpy(reserve(sizeof(T)), &v, sizeof(T));
  }
  //! Writes an array of trivially copyable values (padded to 8 bytes).
  template <class T>
  void put_array(std::span<const T> v) {
    static_assert(std::is_trivially_copyable_v<T>);
    if (!v.empty()) std::memcpy(reserve(v.size_bytes()), v.data(), v.size_bytes());
  }
  //! Bytes written so far.
  [[nodiscard]] std::size_t size() const noexcept { return pos_; }
  //! The whole destination buffer.
  [[nodiscard]] std::span<std::byte> buffer() const noexcept { return out_; }

 private:
  std::span<std::byte> out_;
  std::size_t pos_ = 0;
};

//! Reads from an untrusted byte buffer; every read is bounds-checked and reports failure
//! instead of reading past the end.
class byte_reader {
 public:
  //! Reads from \p in.
  explicit byte_reader(std::span<const std::byte> in) noexcept : in_(in) {}

  //! Copies one value out; false (and nothing read) when fewer than sizeof(T) bytes remain.
  template <class T>
  [[nodiscard]] bool get(T& v) noexcept {
    static_assert(std::is_trivially_copyable_v<T>);
    if (remaining() < pad8(sizeof(T))) return false;
    std::memcpy(&v, in_.data() + pos_, sizeof(T));
    pos_ += pad8(sizeof(T));
    return true;
  }
  //! Takes \p n bytes (padded to 8) as a sub-span; false when they are not all there.
  [[nodiscard]] bool take(std::size_t n, std::span<const std::byte>& out) noexcept {
    if (n > remaining()) return false;
    const std::size_t padded = pad8(n);
    if (padded > remaining()) return false;
    out = in_.subspan(pos_, n);
    pos_ += padded;
    return true;
  }
  //! Bytes not yet read.
  [[nodiscard]] std::size_t remaining() const noexcept { return in_.size() - pos_; }
  //! Bytes read so far.
  [[nodiscard]] std::size_t position() const noexcept { return pos_; }

 private:
  std::span<const std::byte> in_;
  std::size_t pos_ = 0;
};

//! Loads element \p i of type T from raw bytes without alignment assumptions.
template <class T>
[[nodiscard]] inline T load_at(std::span<const std::byte> bytes, std::size_t i) noexcept {
  T v;
  std::memcpy(&v, bytes.data() + i * sizeof(T), sizeof(T));
  return v;
}

//! Result of validating a packet: a status and, when not ok, why.
struct validation {
  status code = status::ok;  //!< ok or the failure class
  std::string reason;        //!< empty when ok

  //! True when the packet is valid.
  [[nodiscard]] explicit operator bool() const noexcept { return code == status::ok; }
  //! A failed validation with a reason.
  static validation fail(std::string why) { return {status::malformed_packet, std::move(why)}; }
};

//! Throws gravac::error(malformed_packet) when \p v is not ok, naming the sending rank.
inline void throw_if_invalid(const validation& v, int from_rank = -1) {
  if (!v)
    throw error(v.code, "packet" + (from_rank >= 0 ? " from rank " + std::to_string(from_rank) : std::string{}) +
                            " rejected: " + v.reason);
}

//! Starts a packet of \p kind; the header is completed by finish_packet().
inline std::byte* begin_packet(byte_writer& w) { return w.reserve(sizeof(packet_header)); }

//! Writes the final packet header at \p at once the segments are written.
inline void finish_packet(byte_writer& w, std::byte* at, packet_kind kind, std::uint32_t segments,
                          std::uint64_t layout_hash, std::uint8_t flags = 0) {
  packet_header h;
  h.magic = packet_magic;
  h.version = packet_version;
  h.kind = static_cast<std::uint8_t>(kind);
  h.flags = flags;
  h.segment_count = segments;
  h.layout_hash = layout_hash;
  h.payload_bytes = w.size() - static_cast<std::size_t>(at - w.buffer().data()) - sizeof(packet_header);
  std::memcpy(at, &h, sizeof h);
}

//! Validates a packet's header against the expected kind and layout, and walks its segment
//! headers (layer index in range and strictly increasing, numel equal to the layout's,
//! payload inside the packet). For each segment calls `check(segment_header, payload)`
//! which returns a validation for the kind-specific payload. No byte outside \p bytes is read.
template <class SegmentCheck>
[[nodiscard]] validation validate_packet(std::span<const std::byte> bytes, const layout& lay, packet_kind kind,
                                         SegmentCheck&& check) {
  byte_reader r(bytes);
  packet_header h;
  if (!r.get(h)) return validation::fail("truncated header (" + std::to_string(bytes.size()) + " bytes)");
  if (h.magic != packet_magic) return validation::fail("wrong magic");
  if (h.version != packet_version) return validation::fail("unsupported version " + std::to_string(h.version));
  if (h.kind != static_cast<std::uint8_t>(kind))
    return validation::fail("wrong kind " + std::to_string(h.kind) + ", expected " +
                            std::to_string(static_cast<int>(kind)));
  if (h.layout_hash != lay.hash()) return {status::layout_mismatch, "packet was built for another layout"};
  if (h.payload_bytes != r.remaining()) return validation::fail("payload size does not match the packet size");
  if (h.segment_count > lay.size()) return validation::fail("more segments than layers");
  std::int64_t last_layer = -1;
  for (std::uint32_t s = 0; s < h.segment_count; ++s) {
    segment_header sh;
    if (!r.get(sh)) return validation::fail("truncated segment header");
    if (sh.layer >= lay.size()) return validation::fail("segment layer index out of range");
    if (static_cast<std::int64_t>(sh.layer) <= last_layer)
      return validation::fail("segment layers not strictly increasing");
    last_layer = sh.layer;
    if (sh.numel != lay[sh.layer].numel) return validation::fail("segment numel does not match the layout");
    if (sh.payload_bytes % 8 != 0) return validation::fail("segment payload not padded");
    std::span<const std::byte> payload;
    if (!r.take(sh.payload_bytes, payload)) return validation::fail("segment payload truncated");
    validation v = check(sh, payload);
    if (!v) return v;
  }
  if (r.remaining() != 0) return validation::fail("trailing bytes after the last segment");
  return {};
}

//! Walks the segments of a packet that has already been validated.
template <class SegmentFn>
void for_each_segment(std::span<const std::byte> bytes, SegmentFn&& fn) {
  byte_reader r(bytes);
  packet_header h;
  (void)r.get(h);
  for (std::uint32_t s = 0; s < h.segment_count; ++s) {
    segment_header sh;
    std::span<const std::byte> payload;
    (void)r.get(sh);
    (void)r.take(sh.payload_bytes, payload);
    fn(sh, payload);
  }
}

//! Writes one segment: the header, then whatever \p fill writes into the writer.
//! \p fill must write exactly the payload; its padded size is recorded in the header.
template <class Fill>
void write_segment(byte_writer& w, segment_header sh, Fill&& fill) {
  std::byte* at = w.reserve(sizeof(segment_header));
  const std::size_t before = w.size();
  fill(w);
  sh.payload_bytes = w.size() - before;
  std::memcpy(at, &sh, sizeof sh);
}

}  // namespace gravac
