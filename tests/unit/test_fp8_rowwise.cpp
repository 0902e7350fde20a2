// fp8_rowwise (compress/fp8_rowwise.hpp), the peer of the block-scaled formats: the row
// scale, the error-feedback invariant when it is on and a zero residual when it is off, the
// coding error bound, non-finite u kept off the wire, malformed packets, exact sizes,
// options, and the compressed allreduce on thread ranks against the serial reference.
#include <algorithm>
#include <bit>
#include <catch2/catch.hpp>
#include <cmath>
#include <functional>
#include <limits>
#include <vector>

#include "compressed_allreduce_check.hpp"
#include "gravac/compress/fp8_rowwise.hpp"
#include "packet_battery.hpp"
#include "reliability_util.hpp"

using namespace gravac;

namespace fp8_rowwise_test {

constexpr std::size_t head = sizeof(packet_header) + sizeof(segment_header);

std::vector<std::byte> compress(fp8_rowwise& c, std::vector<float> g, std::vector<float>& e, const step_params& p) {
  std::vector<std::byte> packet(c.max_packet_bytes());
  compress_stats st;
  packet.resize(c.compress(host_view(g), host_view(e), p, packet, st));
  return packet;
}

std::vector<float> decode(const fp8_rowwise& c, std::span<const std::byte> packet, std::size_t n) {
  std::vector<float> out(n, 0.0f);
  const validation v = c.validate(packet);
  INFO(v.reason);
  REQUIRE(v);
  c.decompress_add(packet, host_view(out), 1.0f);
  return out;
}

// Rows of very different magnitudes (1e-6 .. 1e4).
std::vector<float> spread(std::size_t n, std::uint64_t seed) {
  auto v = test::make_data(n, seed, test::distribution::laplace);
  for (std::size_t i = 0; i < n; ++i) v[i] *= std::pow(10.0f, static_cast<float>(static_cast<int>((i / 40) % 11) - 6));
  return v;
}

}  // namespace fp8_rowwise_test

using namespace fp8_rowwise_test;

TEST_CASE("fp8_rowwise: the row scale is max |u| / 448 and |u - d| is at most half an E4M3 step", "[fp8_rowwise][ef]") {
  const std::uint32_t row = 40;
  const auto lay = layout::flat(403);  // a partial last row
  const auto p = test::params_for(lay, 0.5);
  for (bool feedback : {true, false}) {
    fp8_rowwise c(lay, {.row = row, .error_feedback = feedback});
    const auto g = spread(lay.numel(), 3);
    std::vector<float> e(lay.numel(), 0.0f);
    const auto packet = compress(c, g, e, p);
    const auto d = decode(c, packet, lay.numel());
    for (std::size_t r = 0; r * row < lay.numel(); ++r) {
      const std::size_t lo = r * row, hi = std::min<std::size_t>(lo + row, lay.numel());
      float amax = 0;
      for (std::size_t i = lo; i < hi; ++i) amax = std::max(amax, std::fabs(g[i]));
      const float s = test::peek<float>(packet, head + quant_prefix_bytes + r * 4);
      CHECK(s == amax / 448.0f);
      for (std::size_t i = lo; i < hi; ++i) {
        INFO("row " << r << " element " << i);
        const double y = std::fabs(g[i]) / s;  // in element units
        const int ex = y > 0 ? std::max(static_cast<int>(std::floor(std::log2(y))), -6) : -6;
        CHECK(std::fabs(static_cast<double>(g[i]) - d[i]) <= 0.5 * std::ldexp(1.0, ex - 3) * s * (1 + 1e-6));
        // With error feedback the residual is what was not sent, bit for bit; without, zero.
        if (feedback)
          CHECK(std::bit_cast<std::uint32_t>(d[i] + e[i]) == std::bit_cast<std::uint32_t>(g[i]));
        else
          CHECK(e[i] == 0.0f);
      }
    }
  }
}

TEST_CASE("fp8_rowwise: zero rows, a non-finite u never reaches the wire", "[fp8_rowwise][non_finite]") {
  const auto lay = layout::flat(64);
  fp8_rowwise c(lay, {.row = 16, .error_feedback = true});
  auto g = test::make_data(64, 5);
  std::fill(g.begin(), g.begin() + 16, 0.0f);  // a zero row: scale 0, zeros sent
  g[20] = std::numeric_limits<float>::quiet_NaN();
  g[40] = std::numeric_limits<float>::infinity();
  g[41] = -std::numeric_limits<float>::max();
  std::vector<float> e(64, 0.0f);
  const auto packet = compress(c, g, e, test::params_for(lay, 0.5));
  const auto d = decode(c, packet, 64);
  CHECK(test::peek<float>(packet, head + quant_prefix_bytes) == 0.0f);
  for (float x : d) CHECK(std::isfinite(x));
  for (std::size_t i = 0; i < 16; ++i) CHECK(d[i] == 0.0f);
  CHECK(d[20] == 0.0f);  // NaN is sent as +0
  CHECK(d[40] > 0.0f);   // infinity saturates to the row's largest finite
  CHECK(d[41] == -std::numeric_limits<float>::max() / 448.0f * 448.0f);
}

TEST_CASE("packets: fp8_rowwise survives the battery", "[fp8_rowwise][reliability][packet]") {
  test::packet_battery<fp8_rowwise>({}, -1);
  test::packet_battery<fp8_rowwise>({.row = 7, .error_feedback = true}, -1);
}

TEST_CASE("fp8_rowwise validation rejects malformed packets before decoding anything", "[fp8_rowwise][validation]") {
  const std::size_t n = 75;
  const auto lay = layout::flat(n);
  fp8_rowwise c(lay, {.row = 16});
  const auto g = test::make_data(n, 4);
  std::vector<float> e(n, 0.0f);
  const auto good = compress(c, g, e, test::params_for(lay, 0.5));
  REQUIRE(c.validate(good));
  for (std::size_t cut = 0; cut < good.size(); ++cut)
    REQUIRE_FALSE(c.validate(std::span<const std::byte>(good.data(), cut)));
  const std::size_t scales = head + quant_prefix_bytes, rows = 5, codes = scales + 24;
  using edit = std::function<void(std::vector<std::byte>&)>;
  const std::vector<edit> edits{
      [](auto& b) { b[sizeof(packet_header) + 5] = std::byte{3}; },                  // another encoding
      [](auto& b) { b[sizeof(packet_header) + 4] = std::byte{4}; },                  // indices
      [](auto& b) { test::poke<std::uint64_t>(b, sizeof(packet_header) + 16, 5); },  // count != numel
      [](auto& b) { test::poke<std::uint32_t>(b, head, 32); },                       // another row length
      [](auto& b) { test::poke<std::uint32_t>(b, head + 4, 1); },                    // prefix word
      [&](auto& b) { test::poke<float>(b, scales + 4, std::numeric_limits<float>::quiet_NaN()); },
      [&](auto& b) { test::poke<float>(b, scales + 8, -1.0f); },
      [&](auto& b) { test::poke<float>(b, scales, std::numeric_limits<float>::max()); },  // 448 s overflows
      [&](auto& b) { test::poke<float>(b, scales + rows * 4, 1.0f); },                    // scale padding
      [&](auto& b) { b[codes + 3] = std::byte{0x7f}; },                                   // NaN code
      [&](auto& b) { b[codes + 70] = std::byte{0xff}; },                                  // -NaN code
      [&](auto& b) { b[codes + n] = std::byte{1}; },                                      // code padding
  };
  int k = 0;
  for (const auto& ed : edits) {
    auto bad = good;
    ed(bad);
    INFO("edit " << k++);
    REQUIRE(bad != good);
    const validation v = c.validate(bad);
    REQUIRE_FALSE(v);
    CHECK(v.code == status::malformed_packet);
  }
}

TEST_CASE("fp8_rowwise packet sizes are exact, scales included; options are checked", "[fp8_rowwise][size]") {
  layout lay;
  lay.add("a", {33, 17}, layer_kind::dense);
  lay.add("b", {0}, layer_kind::dense);
  lay.add("c", {5}, layer_kind::bias_or_norm);
  fp8_rowwise c(lay, {.row = 100});
  const auto g = test::make_data(lay.numel(), 2);
  std::vector<float> e(lay.numel(), 0.0f);
  const auto packet = compress(c, g, e, test::params_for(lay, 0.5));
  const std::size_t expected = sizeof(packet_header) + (sizeof(segment_header) + 8 + pad8(6 * 4) + pad8(561)) +
                               (sizeof(segment_header) + 8 + 8 + 8);
  CHECK(packet.size() == expected);
  CHECK(packet.size() <= c.max_packet_bytes());
  // 8 bits per element plus 32 per row of 256: 8.125 bits.
  CHECK(fp8_rowwise(layout::flat(1 << 16)).segment_bytes(1 << 16) == 40 + (1 << 16) + (1 << 10));
  CHECK_THROWS_WITH(fp8_rowwise(lay, {.row = 0}), Catch::Contains("row must be at least 1"));
  STATIC_REQUIRE(detail::composition_verdict<fp8_rowwise, compressed_allreduce, fixed_policy>() == rejection::none);
  STATIC_REQUIRE(detail::composition_verdict<fp8_rowwise, allreduce_compatible, fixed_policy>() ==
                 rejection::not_summable);
}

TEST_CASE("fp8_rowwise over the compressed allreduce on 1 to 4 thread ranks equals the two-stage reference",
          "[fp8_rowwise][compressed_allreduce][threads]") {
  for (int n = 1; n <= 4; ++n) {
    test::check_compressed_allreduce<fp8_rowwise>(n, {}, spread);
    test::check_compressed_allreduce<fp8_rowwise>(n, {.row = 33, .error_feedback = true}, spread);
  }
}
