#pragma once
// The malformed-packet battery every compressor's decoder must survive: valid packets at
// every kind of fraction, truncation at every length, corrupted packet and segment headers,
// indices out of range or repeated (for kinds that carry indices), and random byte flips.
// A packet that validates is decoded into a heap buffer of exactly the layout's size, so
// the sanitizer builds catch any access out of bounds. Used by test_reliability_packets*.

#include <catch2/catch.hpp>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "gravac_test_util.hpp"

namespace gravac::test {

// Byte offsets inside a packet (gravac/packet/format.hpp): the first segment header follows the
// 32-byte packet header; its payload follows its own 32-byte header.
inline constexpr std::size_t seg0 = sizeof(packet_header);
inline constexpr std::size_t payload0 = sizeof(packet_header) + sizeof(segment_header);

template <class T>
void poke(std::vector<std::byte>& p, std::size_t at, T v) {
  REQUIRE(at + sizeof v <= p.size());
  std::memcpy(p.data() + at, &v, sizeof v);
}
template <class T>
T peek(const std::vector<std::byte>& p, std::size_t at) {
  T v;
  REQUIRE(at + sizeof v <= p.size());
  std::memcpy(&v, p.data() + at, sizeof v);
  return v;
}

// Decodes a packet that validated: into an exact-size heap buffer (sanitizers watch it).
template <class C>
void decode_in_bounds(const C& c, const layout& lay, const std::vector<std::byte>& p) {
  std::vector<float> out(lay.numel(), 0.0f);
  c.decompress_add(p, host_view(out), 0.5f);
}

// A packet of compressor c for step parameters p, from fresh data.
template <class C>
std::vector<std::byte> make_packet(C& c, const layout& lay, const step_params& p, std::uint64_t seed) {
  std::vector<std::byte> packet(c.max_packet_bytes());
  auto g = make_data(lay.numel(), seed, seed % 2 ? distribution::laplace : distribution::gaussian);
  std::vector<float> e(lay.numel(), 0.0f);
  compress_stats st;
  packet.resize(c.compress(host_view(g), host_view(e), p, packet, st));
  return packet;
}

inline step_params battery_params(const layout& lay, double f, std::uint64_t step = 3) {
  auto p = params_for(lay, f, step, 11);
  p.ranks = 4;
  return p;
}

// index_offset: where the first segment's indices start inside its payload (sparse: 0,
// AdaComp: 8), or -1 for kinds without indices on the wire.
template <class C>
void packet_battery(const typename C::options& opt, std::ptrdiff_t index_offset) {
  const layout lay = mixed_layout();
  C c(lay, opt);

  SECTION("valid packets validate and decode at every fraction, k = 0 included") {
    for (double f : {0.0, 1e-4, 0.01, 0.1, 0.5, 0.999, 1.0}) {
      INFO("fraction " << f);
      const auto p = make_packet(c, lay, battery_params(lay, f), 5);
      const validation v = c.validate(p);
      INFO(v.reason);
      REQUIRE(v);
      decode_in_bounds(c, lay, p);
    }
    auto mixed = battery_params(lay, 0.05);
    for (std::size_t i = 0; i < lay.size(); i += 2) mixed.kept_fraction[i] = dense_fraction;
    const auto p = make_packet(c, lay, mixed, 6);
    REQUIRE(c.validate(p));
    decode_in_bounds(c, lay, p);
  }

  const auto good = make_packet(c, lay, battery_params(lay, 0.1), 7);
  REQUIRE(c.validate(good));

  SECTION("truncated at every length") {
    for (std::size_t len = 0; len < good.size(); ++len) {
      const std::vector<std::byte> cut(good.begin(), good.begin() + static_cast<std::ptrdiff_t>(len));
      INFO("length " << len);
      REQUIRE_FALSE(c.validate(cut));
    }
  }

  SECTION("packet header: magic, version, kind, layout, counts, sizes") {
    auto p = good;
    poke<std::uint32_t>(p, 0, 0x12345678u);
    CHECK(c.validate(p).reason == "wrong magic");
    p = good;
    poke<std::uint16_t>(p, 4, packet_version + 1);
    CHECK_THAT(c.validate(p).reason, Catch::Contains("unsupported version"));
    p = good;
    poke<std::uint8_t>(
        p, 6, static_cast<std::uint8_t>(C::kind == packet_kind::dense ? packet_kind::sparse : packet_kind::dense));
    CHECK_THAT(c.validate(p).reason, Catch::Contains("wrong kind"));
    p = good;
    poke<std::uint64_t>(p, 16, lay.hash() ^ 1);
    CHECK(c.validate(p).code == status::layout_mismatch);
    p = good;
    poke<std::uint32_t>(p, 8, static_cast<std::uint32_t>(lay.size() + 1));
    CHECK_FALSE(c.validate(p));
    p = good;
    poke<std::uint32_t>(p, 8, peek<std::uint32_t>(good, 8) + 1);  // one segment more than present
    CHECK_FALSE(c.validate(p));
    p = good;
    poke<std::uint64_t>(p, 24, peek<std::uint64_t>(good, 24) + 8);  // payload size lies
    CHECK_FALSE(c.validate(p));
    p = good;
    poke<std::uint64_t>(p, 24, ~std::uint64_t{0});
    CHECK_FALSE(c.validate(p));
    p = good;
    p.insert(p.end(), 8, std::byte{0});  // trailing bytes
    CHECK_FALSE(c.validate(p));
  }

  SECTION("segment header: layer, numel, count, payload size, encoding, order") {
    auto p = good;
    poke<std::uint32_t>(p, seg0, static_cast<std::uint32_t>(lay.size()));
    CHECK_THAT(c.validate(p).reason, Catch::Contains("out of range"));
    p = good;
    poke<std::uint64_t>(p, seg0 + 8, peek<std::uint64_t>(good, seg0 + 8) + 1);
    CHECK_THAT(c.validate(p).reason, Catch::Contains("numel"));
    for (std::uint64_t count : {peek<std::uint64_t>(good, seg0 + 8) + 1, std::uint64_t{1} << 40, ~std::uint64_t{0}}) {
      p = good;
      poke<std::uint64_t>(p, seg0 + 16, count);  // count beyond the buffer
      INFO("count " << count);
      CHECK_FALSE(c.validate(p));
    }
    for (std::uint64_t bytes :
         {peek<std::uint64_t>(good, seg0 + 24) + 1, peek<std::uint64_t>(good, seg0 + 24) + 8, std::uint64_t{1} << 62}) {
      p = good;
      poke<std::uint64_t>(p, seg0 + 24, bytes);
      INFO("payload bytes " << bytes);
      CHECK_FALSE(c.validate(p));
    }
    p = good;
    poke<std::uint8_t>(p, seg0 + 5, 0x7e);  // an encoding no compressor writes
    CHECK_FALSE(c.validate(p));
    // The second segment claims the first one's layer: layers must strictly increase.
    const std::size_t seg1 = payload0 + peek<std::uint64_t>(good, seg0 + 24);
    if (seg1 + sizeof(segment_header) <= good.size()) {
      p = good;
      poke<std::uint32_t>(p, seg1, peek<std::uint32_t>(good, seg0));
      CHECK_FALSE(c.validate(p));
    }
  }

  if (index_offset >= 0) {
    SECTION("indices out of range, repeated or decreasing") {
      const auto width = peek<std::uint8_t>(good, seg0 + 4);
      const auto count = peek<std::uint64_t>(good, seg0 + 16);
      const auto numel = peek<std::uint64_t>(good, seg0 + 8);
      REQUIRE(count >= 2);
      const std::size_t at = payload0 + static_cast<std::size_t>(index_offset);
      const auto put = [&](std::vector<std::byte>& p, std::size_t j, std::uint64_t v) {
        if (width == 4)
          poke<std::uint32_t>(p, at + 4 * j, static_cast<std::uint32_t>(v));
        else
          poke<std::uint64_t>(p, at + 8 * j, v);
      };
      const auto get = [&](std::size_t j) -> std::uint64_t {
        return width == 4 ? peek<std::uint32_t>(good, at + 4 * j) : peek<std::uint64_t>(good, at + 8 * j);
      };
      auto p = good;
      put(p, count - 1, numel);  // the last index one past the end
      CHECK_THAT(c.validate(p).reason, Catch::Contains("out of range"));
      p = good;
      put(p, 0, 0xffffffffu);
      CHECK_THAT(c.validate(p).reason, Catch::Contains("out of range"));
      p = good;
      put(p, 1, get(0));  // repeated
      CHECK_THAT(c.validate(p).reason, Catch::Contains("strictly increasing"));
      p = good;
      put(p, 0, get(1));
      put(p, 1, get(0));  // swapped
      if (get(0) != get(1)) CHECK_THAT(c.validate(p).reason, Catch::Contains("strictly increasing"));
      p = good;
      poke<std::uint8_t>(p, seg0 + 4, width == 4 ? 8 : 4);  // index width that does not fit the layer
      CHECK_FALSE(c.validate(p));
    }
  }

  SECTION("random byte flips never crash the decoder") {
    std::mt19937_64 rng(12345);
    int accepted = 0;
    for (int t = 0; t < 1500; ++t) {
      auto p = good;
      const int flips = 1 + static_cast<int>(rng() % 4);
      for (int k = 0; k < flips; ++k) p[rng() % p.size()] = static_cast<std::byte>(rng());
      if (c.validate(p)) {
        ++accepted;  // e.g. a flipped value byte: still a well-formed packet
        decode_in_bounds(c, lay, p);
      }
    }
    INFO("accepted " << accepted << " of 1500 mutated packets");
    SUCCEED();
  }
}

}  // namespace gravac::test
