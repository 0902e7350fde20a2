// The block-scaled compressors mxfp8, mxfp4 and nvfp4 (compress/block_scaled.hpp): the error
// feedback invariant (bit for bit with rounding to nearest), error feedback off, per-block
// error bounds, the scale choice, zero and partial blocks, huge, tiny and non-finite u,
// stochastic rounding (unbiased, reproducible), malformed packets, exact sizes and wire
// bytes, the composition rules, and trainers on thread ranks against the serial reference.
#include <algorithm>
#include <atomic>
#include <bit>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <vector>

#include "compressed_allreduce_check.hpp"
#include "gravac/compress/block_scaled.hpp"
#include "packet_battery.hpp"
#include "reliability_util.hpp"
#include "two_stage_reference.hpp"
#include "wire_bytes_checks.hpp"

using namespace gravac;
using detail::block_format;
using detail::minifloat;

namespace {

constexpr std::size_t head = sizeof(packet_header) + sizeof(segment_header);  // first payload's offset

template <class C>
std::vector<std::byte> make_packet(C& c, std::vector<float> g, std::vector<float>& e, const step_params& p,
                                   compress_stats& st) {
  std::vector<std::byte> packet(c.max_packet_bytes());
  packet.resize(c.compress(host_view(g), host_view(e), p, packet, st));
  return packet;
}

template <class C>
std::vector<float> decode(const C& c, std::span<const std::byte> packet, std::size_t n) {
  std::vector<float> out(n, 0.0f);
  const validation v = c.validate(packet);
  INFO(v.reason);
  REQUIRE(v);
  c.decompress_add(packet, host_view(out), 1.0f);
  return out;
}

// One compressor of each format, with the given rounding and error feedback.
struct config {
  const char* name;
  block_format format;
  std::function<std::vector<std::byte>(const layout&, std::vector<float>, std::vector<float>&, const step_params&,
                                       std::vector<float>&)>
      run;  // packet; the decoded values into the last argument
};

template <class C>
config make_config(const char* name, block_format f, typename C::options opt) {
  return {name, f,
          [opt](const layout& lay, std::vector<float> g, std::vector<float>& e, const step_params& p,
                std::vector<float>& dec) {
            C c(lay, opt);
            compress_stats st;
            auto packet = make_packet(c, std::move(g), e, p, st);
            dec = decode(c, packet, lay.numel());
            return packet;
          }};
}

std::vector<config> configs(block_rounding r, bool feedback = true) {
  return {make_config<mxfp8>("mxfp8 e4m3", block_format::mxfp8_e4m3,
                             {.element = mxfp8_element::e4m3, .rounding = r, .error_feedback = feedback}),
          make_config<mxfp8>("mxfp8 e5m2", block_format::mxfp8_e5m2,
                             {.element = mxfp8_element::e5m2, .rounding = r, .error_feedback = feedback}),
          make_config<mxfp4>("mxfp4", block_format::mxfp4, {.rounding = r, .error_feedback = feedback}),
          make_config<nvfp4>("nvfp4", block_format::nvfp4, {.rounding = r, .error_feedback = feedback})};
}

// Gradients with blocks of very different magnitudes (1e-6 .. 1e4), signs of both kinds.
std::vector<float> spread_data(std::size_t n, std::uint64_t seed) {
  auto v = test::make_data(n, seed, test::distribution::laplace);
  for (std::size_t i = 0; i < n; ++i) v[i] *= std::pow(10.0f, static_cast<float>(static_cast<int>((i / 16) % 11) - 6));
  return v;
}

// The scale byte of block b and the per-layer word of the (single) segment of a flat layout.
std::uint8_t scale_code(const std::vector<std::byte>& p, std::size_t b) {
  return static_cast<std::uint8_t>(p[head + quant_prefix_bytes + b]);
}
float layer_scale(const std::vector<std::byte>& p) { return test::peek<float>(p, head + 4); }

// The float a block's elements are multiplied by, read back from a flat layout's packet.
float block_multiplier(block_format f, const std::vector<std::byte>& p, std::size_t b) {
  if (f == block_format::nvfp4) return detail::decode_minifloat<minifloat::e4m3>(scale_code(p, b)) * layer_scale(p);
  return detail::e8m0_value(scale_code(p, b));
}

// One ulp of the element format at |y| (the code spacing of its binade), in element units.
double element_ulp(minifloat f, double y) {
  const auto s = detail::spec_of(f);
  const int emin = 1 - s.bias;
  const int e = y > 0 ? std::max(static_cast<int>(std::floor(std::log2(y))), emin) : emin;
  return std::ldexp(1.0, e - static_cast<int>(s.mantissa_bits));
}

}  // namespace

TEST_CASE("block-scaled: decompress(sent) + e_new == g + e_old bit for bit (nearest even)", "[block_scaled][ef]") {
  const auto lay = test::mixed_layout();
  const auto p = test::params_for(lay, 0.5, 3, 11);
  for (const auto& cfg : configs(block_rounding::nearest_even)) {
    for (int variant = 0; variant < 3; ++variant) {
      auto g = variant == 2 ? spread_data(lay.numel(), 31) : test::make_data(lay.numel(), 31 + variant);
      auto e = test::make_data(lay.numel(), 40 + variant);
      for (auto& x : e) x *= 0.2f;
      const auto e_old = e;
      std::vector<float> dec;
      cfg.run(lay, g, e, p, dec);
      for (std::size_t i = 0; i < lay.numel(); ++i) {
        const float u = g[i] + e_old[i];
        INFO(cfg.name << " variant " << variant << " element " << i << " u " << u << " dec " << dec[i]);
        REQUIRE(std::bit_cast<std::uint32_t>(dec[i] + e[i]) == std::bit_cast<std::uint32_t>(u));
        REQUIRE(e[i] == u - dec[i]);
      }
    }
  }
}

TEST_CASE("block-scaled: stochastic rounding keeps the invariant to one rounding", "[block_scaled][ef][stochastic]") {
  const auto lay = test::mixed_layout();
  for (const auto& cfg : configs(block_rounding::stochastic)) {
    auto g = spread_data(lay.numel(), 5);
    std::vector<float> e(lay.numel(), 0.25f);
    const auto e_old = e;
    std::vector<float> dec;
    cfg.run(lay, g, e, test::params_for(lay, 0.5, 9, 11), dec);
    for (std::size_t i = 0; i < lay.numel(); ++i) {
      const float u = g[i] + e_old[i];
      const float m = std::max(std::fabs(u), std::fabs(dec[i]));
      INFO(cfg.name << " element " << i);
      REQUIRE(std::fabs((dec[i] + e[i]) - u) <= (m == 0 ? 0.0f : std::ldexp(1.0f, std::ilogb(m) - 23)));
    }
  }
}

TEST_CASE("block-scaled: error feedback off leaves the residual at zero and sends the same codes",
          "[block_scaled][ef]") {
  const auto lay = test::mixed_layout();
  const auto p = test::params_for(lay, 0.5, 1, 3);
  const auto on = configs(block_rounding::nearest_even, true), off = configs(block_rounding::nearest_even, false);
  for (std::size_t k = 0; k < on.size(); ++k) {
    INFO(on[k].name);
    const auto g = test::make_data(lay.numel(), 77);
    std::vector<float> e_on(lay.numel(), 0.0f), e_off(lay.numel(), 0.0f), dec_on, dec_off;
    const auto p_on = on[k].run(lay, g, e_on, p, dec_on);
    const auto p_off = off[k].run(lay, g, e_off, p, dec_off);
    CHECK(p_on == p_off);
    CHECK(std::all_of(e_off.begin(), e_off.end(), [](float x) { return std::bit_cast<std::uint32_t>(x) == 0; }));
    CHECK(std::any_of(e_on.begin(), e_on.end(), [](float x) { return x != 0.0f; }));
    // A second step with the same g: without error feedback it sends the same values again;
    // with it, the first step's error too.
    std::vector<float> dec2_on, dec2_off;
    off[k].run(lay, g, e_off, p, dec2_off);
    on[k].run(lay, g, e_on, p, dec2_on);
    CHECK(dec2_off == dec_off);
    CHECK(dec2_on != dec_on);
  }
}

TEST_CASE("block-scaled: per block |u - d| <= half an element ulp at the block's scale, unless saturated",
          "[block_scaled][bounds]") {
  const std::size_t n = 32 * 11 + 7;  // a partial last block for both block sizes
  const auto lay = layout::flat(n);
  for (const auto& cfg : configs(block_rounding::nearest_even)) {
    const auto shape = detail::shape_of(cfg.format);
    const auto u = spread_data(n, 123);
    std::vector<float> e(n, 0.0f), dec;
    const auto packet = cfg.run(lay, u, e, test::params_for(lay, 0.5), dec);
    const double maxv = detail::minifloat_value(shape.element, detail::spec_of(shape.element).max_code);
    const int emax = detail::spec_of(shape.element).emax;
    std::size_t zero_scaled = 0;
    for (std::size_t i = 0; i < n; ++i) {
      const std::size_t b = i / shape.block;
      const double x = block_multiplier(cfg.format, packet, b);
      if (x == 0) {
        // NVFP4: a block whose largest |u| is below about 2.2e-6 of the layer's (448 times
        // the ratio under half E4M3's smallest subnormal) gets the block scale 0 and sends
        // zeros; error feedback keeps its values.
        REQUIRE(cfg.format == block_format::nvfp4);
        REQUIRE(dec[i] == 0.0f);
        REQUIRE(e[i] == u[i]);
        ++zero_scaled;
        continue;
      }
      const double y = std::fabs(static_cast<double>(u[i])) / x;  // |u| in element units
      INFO(cfg.name << " element " << i << " u " << u[i] << " dec " << dec[i] << " scale " << x);
      if (y > maxv) {
        REQUIRE(dec[i] == static_cast<float>(std::copysign(maxv * x, static_cast<double>(u[i]))));
        // The scale choice bounds what saturates: below 2^(emax+1) (MX); at most 6 times the
        // E4M3 rounding of the block scale (NVFP4): 1 + 1/16 for a normal E4M3 scale, below 2
        // for a subnormal one (a scale under half the smallest subnormal is 0, above).
        const double s = detail::decode_minifloat<minifloat::e4m3>(scale_code(packet, b));
        REQUIRE(y < (shape.e8m0_scales ? std::ldexp(1.0, emax + 1) : s >= 0x1p-6 ? 6.0 * (1 + 1.0 / 16) : 12.0));
      } else {
        // NVFP4 divides in float first: one float rounding of y more.
        REQUIRE(std::fabs(static_cast<double>(u[i]) - dec[i]) <= (element_ulp(shape.element, y) / 2 + 0x1p-23 * y) * x);
      }
    }
    // MX: X = 2^(floor(log2 amax) - emax) puts every block's largest |u| in [2^emax, 2^(emax+1)).
    if (shape.e8m0_scales) {
      for (std::size_t b = 0; b * shape.block < n; ++b) {
        float amax = 0;
        for (std::size_t i = b * shape.block; i < std::min(n, (b + 1) * shape.block); ++i)
          amax = std::max(amax, std::fabs(u[i]));
        const double y = amax / block_multiplier(cfg.format, packet, b);
        CHECK(y >= std::ldexp(1.0, emax));
        CHECK(y < std::ldexp(1.0, emax + 1));
      }
    } else {
      // NVFP4: t = max |u| / 2688, and the layer's largest |u| lands on 6 * 448 * t.
      float amax = 0;
      for (float v : u) amax = std::max(amax, std::fabs(v));
      CHECK(layer_scale(packet) == amax / 2688.0f);
      CHECK(zero_scaled > 0);  // the data spans ten decades, beyond what E4M3 block scales reach
    }
  }
}

TEST_CASE("block-scaled: zero blocks, a partial last block, tiny and huge values", "[block_scaled][edge]") {
  const std::size_t n = 70;  // blocks of 32: two full and one of 6; of 16: four and one of 6
  const auto lay = layout::flat(n);
  for (const auto& cfg : configs(block_rounding::nearest_even)) {
    const auto shape = detail::shape_of(cfg.format);
    INFO(cfg.name);
    std::vector<float> g(n, 0.0f);
    for (std::size_t i = 32; i < 64; ++i) g[i] = 0x1p-140f * static_cast<float>(i % 5);  // subnormal floats
    for (std::size_t i = 64; i < n; ++i) g[i] = (i % 2 ? -1.0f : 1.0f) * std::numeric_limits<float>::max();
    std::vector<float> e(n, 0.0f), dec;
    const auto packet = cfg.run(lay, g, e, test::params_for(lay, 0.5), dec);
    CHECK(packet.size() ==
          sizeof(packet_header) + sizeof(segment_header) + block_scaled_payload_bytes(n, shape.block, shape.code_bits));
    // Zeros decode to zero and leave a zero residual; the zero block's scale is 2^-127 (MX) or 0 (NVFP4).
    for (std::size_t i = 0; i < 32; ++i) {
      CHECK(dec[i] == 0.0f);
      CHECK(e[i] == 0.0f);
    }
    CHECK(scale_code(packet, 0) == 0);
    // Huge values decode finite (at the format's largest value times the scale), the residual is finite.
    for (std::size_t i = 64; i < n; ++i) {
      CHECK(std::isfinite(dec[i]));
      CHECK(std::isfinite(e[i]));
      CHECK(std::fabs(dec[i]) > 0.5f * std::numeric_limits<float>::max());
      CHECK(std::bit_cast<std::uint32_t>(dec[i] + e[i]) == std::bit_cast<std::uint32_t>(g[i]));
    }
    // Subnormal floats: the scale is clamped to 2^-127 (MX) and the invariant holds exactly.
    for (std::size_t i = 32; i < 64; ++i)
      CHECK(std::bit_cast<std::uint32_t>(dec[i] + e[i]) == std::bit_cast<std::uint32_t>(g[i]));
    if (shape.e8m0_scales) CHECK(scale_code(packet, 1) == 0);
  }
}

TEST_CASE("block-scaled: a non-finite u never reaches the wire", "[block_scaled][non_finite]") {
  const auto lay = layout::flat(48);
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  for (const auto& cfg : configs(block_rounding::nearest_even)) {
    INFO(cfg.name);
    auto g = test::make_data(48, 8);
    g[1] = nan;
    g[2] = inf;
    g[3] = -inf;
    g[40] = -nan;
    std::vector<float> e(48, 0.0f), dec;
    const auto packet = cfg.run(lay, g, e, test::params_for(lay, 0.5), dec);  // run() validates it
    for (float x : dec) CHECK(std::isfinite(x));
    CHECK(dec[1] == 0.0f);    // a NaN is sent as +0 ...
    CHECK(std::isnan(e[1]));  // ... and stays in the residual, as every compressor's
    CHECK(dec[2] > 0.0f);     // an infinity saturates to the block's largest value
    CHECK(dec[3] == -dec[2]);
    CHECK(std::isinf(e[2]));
    CHECK(dec[40] == 0.0f);
    // The scale comes from the largest finite |u|: the finite elements decode as without the specials.
    auto clean = g;
    clean[1] = clean[2] = clean[3] = clean[40] = 0.0f;
    std::vector<float> e2(48, 0.0f), dec2;
    cfg.run(lay, clean, e2, test::params_for(lay, 0.5), dec2);
    for (std::size_t i = 4; i < 48; ++i)
      if (i != 40) CHECK(dec[i] == dec2[i]);
  }
}

TEST_CASE("block-scaled: stochastic rounding is unbiased over steps and reproducible from the seed",
          "[block_scaled][stochastic]") {
  const std::size_t n = 96;
  const auto lay = layout::flat(n);
  // Every block of 16 has its largest |u| at 6 * 2^j or at 2688 (the layer's largest): MX
  // scales it to 1.5 or 1.3125 times 2^emax and NVFP4 to exactly 6 (t = 1, an exact E4M3
  // block scale), so no element saturates (saturation is biased).
  auto u = test::make_data(n, 77, test::distribution::laplace);
  const float block_top[6] = {1.5f, 0.375f, 6.0f, 48.0f, 2688.0f, 0.75f};
  for (std::size_t i = 0; i < n; ++i) u[i] = block_top[i / 16] * std::clamp(u[i], -0.95f, 0.95f);
  for (std::size_t b = 0; b < 6; ++b) u[16 * b + 3] = -block_top[b];
  for (const auto& cfg : configs(block_rounding::stochastic)) {
    INFO(cfg.name);
    const auto shape = detail::shape_of(cfg.format);
    const int trials = 1500;
    std::vector<double> sum(n, 0.0);
    std::vector<std::byte> first;
    for (int t = 0; t < trials; ++t) {
      std::vector<float> e(n, 0.0f), dec;
      const auto packet = cfg.run(lay, u, e, test::params_for(lay, 0.5, static_cast<std::uint64_t>(t), 1234), dec);
      for (std::size_t i = 0; i < n; ++i) sum[i] += dec[i];
      if (t == 0) first = packet;
    }
    double z_sum = 0, z_max = 0;
    for (std::size_t i = 0; i < n; ++i) {
      const double x = block_multiplier(cfg.format, first, i / shape.block);
      const double y = std::fabs(static_cast<double>(u[i])) / x;
      REQUIRE(y <= detail::minifloat_value(shape.element, detail::spec_of(shape.element).max_code));
      const double sigma = element_ulp(shape.element, y) * x / 2 / std::sqrt(static_cast<double>(trials));
      const double z = (sum[i] / trials - u[i]) / sigma;
      z_sum += z;
      z_max = std::max(z_max, std::fabs(z));
    }
    INFO("max |z| " << z_max << " mean z " << z_sum / n);
    CHECK(z_max < 6.0);
    CHECK(std::fabs(z_sum / n) < 5.0 / std::sqrt(static_cast<double>(n)));
    // Same seed and step: the same bits, from a fresh compressor; another step or seed: others.
    std::vector<float> dec;
    const auto again = [&](std::uint64_t step, std::uint64_t seed) {
      std::vector<float> e(n, 0.0f);
      return cfg.run(lay, u, e, test::params_for(lay, 0.5, step, seed), dec);
    };
    CHECK(again(0, 1234) == first);
    CHECK(again(1, 1234) != first);
    CHECK(again(0, 1235) != first);
  }
}

TEST_CASE("packets: block-scaled (mxfp8, mxfp4, nvfp4) survive the battery", "[block_scaled][reliability][packet]") {
  test::packet_battery<mxfp8>({}, -1);
  test::packet_battery<mxfp8>({.element = mxfp8_element::e5m2, .rounding = block_rounding::stochastic}, -1);
  test::packet_battery<mxfp4>({}, -1);
  test::packet_battery<nvfp4>({.rounding = block_rounding::stochastic}, -1);
}

TEST_CASE("block-scaled validation rejects malformed packets before decoding anything", "[block_scaled][validation]") {
  const std::size_t n = 75;  // odd: the last FP4 byte has a padding nibble
  const auto lay = layout::flat(n);
  const auto g = test::make_data(n, 4);
  const auto p = test::params_for(lay, 0.5);
  using edit = std::function<void(std::vector<std::byte>&)>;
  const std::size_t scales = head + quant_prefix_bytes;
  auto check_all = [&](auto&& c, const std::vector<edit>& edits) {
    std::vector<float> e(n, 0.0f);
    compress_stats st;
    const auto good = make_packet(c, g, e, p, st);
    REQUIRE(c.validate(good));
    for (std::size_t cut = 0; cut < good.size(); ++cut)
      REQUIRE_FALSE(c.validate(std::span<const std::byte>(good.data(), cut)));
    int k = 0;
    for (const auto& ed : edits) {
      auto bad = good;
      ed(bad);
      INFO("edit " << k++);
      REQUIRE(bad != good);
      const validation v = c.validate(bad);
      REQUIRE_FALSE(v);
      CHECK(v.code == status::malformed_packet);
      // A collective validates before it decodes: the error is thrown, the output untouched.
      std::vector<float> out(n, 1.5f);
      try {
        throw_if_invalid(c.validate(bad), 2);
        c.decompress_add(bad, host_view(out), 1.0f);
        FAIL("accepted");
      } catch (const gravac::error& err) {
        CHECK(err.code() == status::malformed_packet);
      }
      CHECK(std::all_of(out.begin(), out.end(), [](float x) { return x == 1.5f; }));
    }
  };
  const std::vector<edit> common{
      [](auto& b) { b[sizeof(packet_header) + 5] = std::byte{3}; },                  // an encoding of another quantizer
      [](auto& b) { b[sizeof(packet_header) + 4] = std::byte{4}; },                  // indices in a quantized segment
      [](auto& b) { test::poke<std::uint64_t>(b, sizeof(packet_header) + 16, 5); },  // count != numel
      [](auto& b) { test::poke<std::uint32_t>(b, head, 64); },                       // wrong block size
      [](auto& b) { test::poke<std::uint32_t>(b, 0, 0x12345678u); },                 // bad magic
      [](auto& b) { test::poke<std::uint64_t>(b, 24, test::peek<std::uint64_t>(b, 24) + 8); },  // sizes disagree
  };
  auto with = [&](std::vector<edit> extra) {
    extra.insert(extra.end(), common.begin(), common.end());
    return extra;
  };
  const std::size_t nb32 = 3, nb16 = 5;
  // MXFP8 E4M3: a NaN scale, a scale that would decode to infinity, a NaN element, padding.
  const std::size_t c8 = scales + 8;
  check_all(mxfp8(lay),
            with({[&](auto& b) { b[scales + 1] = std::byte{0xff}; },
                  [&](auto& b) {
                    b[scales] = std::byte{static_cast<unsigned char>(detail::mx_max_scale_code(minifloat::e4m3) + 1)};
                  },
                  [&](auto& b) { b[scales + nb32] = std::byte{1}; },            // scale padding
                  [&](auto& b) { test::poke<std::uint32_t>(b, head + 4, 1); },  // prefix word
                  [&](auto& b) { b[c8 + 3] = std::byte{0x7f}; }, [&](auto& b) { b[c8 + 74] = std::byte{0xff}; },
                  [&](auto& b) { b[c8 + n] = std::byte{1}; }}));  // code padding
  check_all(
      mxfp8(lay, {.element = mxfp8_element::e5m2}),
      with({[&](auto& b) { b[scales] = std::byte{0xff}; }, [&](auto& b) { b[c8] = std::byte{0x7c}; },  // +infinity
            [&](auto& b) { b[c8 + 1] = std::byte{0xfc}; },                                             // -infinity
            [&](auto& b) { b[c8 + 2] = std::byte{0x7d}; },                                             // NaN
            [&](auto& b) {
              b[scales + 2] = std::byte{static_cast<unsigned char>(detail::mx_max_scale_code(minifloat::e5m2) + 1)};
            }}));
  check_all(mxfp4(lay), with({[&](auto& b) { b[scales + 2] = std::byte{0xff}; },
                              [&](auto& b) { b[c8 + n / 2] |= std::byte{0x10}; },  // the odd element's padding nibble
                              [&](auto& b) { b[c8 + 39] = std::byte{1}; }}));      // a padding byte
  check_all(
      nvfp4(lay),
      with({[&](auto& b) { test::poke<float>(b, head + 4, std::numeric_limits<float>::quiet_NaN()); },
            [&](auto& b) { test::poke<float>(b, head + 4, -1.0f); },
            [&](auto& b) { test::poke<float>(b, head + 4, std::numeric_limits<float>::infinity()); },
            [&](auto& b) { test::poke<float>(b, head + 4, std::numeric_limits<float>::max()); },  // 2688 t overflows
            [&](auto& b) { b[scales + 1] = std::byte{0x7f}; },                                    // NaN E4M3 scale
            [&](auto& b) { b[scales + 4] |= std::byte{0x80}; },                                   // negative scale
            [&](auto& b) { b[scales + nb16] = std::byte{2}; }}));
  // A packet of one format is not accepted by another.
  std::vector<float> e(n, 0.0f);
  compress_stats st;
  mxfp8 m8(lay);
  const auto pk = make_packet(m8, g, e, p, st);
  CHECK_FALSE(mxfp8(lay, {.element = mxfp8_element::e5m2}).validate(pk));
  CHECK_FALSE(mxfp4(lay).validate(pk));
  CHECK_FALSE(nvfp4(lay).validate(pk));
  CHECK_FALSE(cast16(lay).validate(pk));
}

TEST_CASE("block-scaled packet sizes are exact, scales included", "[block_scaled][size]") {
  layout lay;
  lay.add("a", {33, 17}, layer_kind::dense);  // 561: partial blocks of 32 and 16
  lay.add("b", {0}, layer_kind::dense);
  lay.add("c", {5}, layer_kind::bias_or_norm);
  lay.add("d", {4096}, layer_kind::dense);
  const auto g = test::make_data(lay.numel(), 2);
  auto expect = [&](std::size_t block, unsigned bits) {
    std::size_t bytes = sizeof(packet_header);
    for (std::size_t n : {561, 5, 4096})
      bytes += sizeof(segment_header) + 8 + pad8((n + block - 1) / block) + pad8((n * bits + 7) / 8);
    return bytes;
  };
  auto size_of = [&](auto&& c) {
    std::vector<float> e(lay.numel(), 0.0f);
    compress_stats st;
    const auto packet = make_packet(c, g, e, test::params_for(lay, 0.5), st);
    CHECK(packet.size() <= c.max_packet_bytes());
    return packet.size();
  };
  CHECK(size_of(mxfp8(lay)) == expect(32, 8));
  CHECK(size_of(mxfp8(lay, {.element = mxfp8_element::e5m2})) == expect(32, 8));
  CHECK(size_of(mxfp4(lay)) == expect(32, 4));
  CHECK(size_of(nvfp4(lay)) == expect(16, 4));
  CHECK(expect(32, 8) == 32 + (32 + 8 + 24 + 568) + (32 + 8 + 8 + 8) + (32 + 8 + 128 + 4096));
  // Bits per element on a large layer: 8 + 8/32, 4 + 8/32, 4 + 8/16 (plus the segment's 40
  // bytes of header and prefix, NVFP4's per-layer scale among them).
  const auto big = layout::flat(1 << 16);
  CHECK(mxfp8(big).segment_bytes(1 << 16) == 40 + (1 << 16) + (1 << 11));
  CHECK(mxfp4(big).segment_bytes(1 << 16) == 40 + (1 << 15) + (1 << 11));
  CHECK(nvfp4(big).segment_bytes(1 << 16) == 40 + (1 << 15) + (1 << 12));
}

TEST_CASE("block-scaled wire bytes: the report is the packet, and what the network counted", "[block_scaled][wire]") {
  const auto lay = test::mixed_layout();
  using T = trainer<mxfp8, allgather, fixed_policy>;
  test::check_wire_steps(test::wire_steps<T>(lay, {.policy = {.kept_fraction = 0.5}}, 3, 4),
                         collective_kind::allgather);
  using D = trainer<nvfp4, dense_allreduce, fixed_policy>;
  test::check_wire_steps(test::wire_steps<D>(lay, {.policy = {.kept_fraction = 0.5}}, 2, 2),
                         collective_kind::dense_allreduce);
  // bytes_sent: exactly the packet, scales included.
  std::vector<std::size_t> sent(2);
  run_ranks(2, [&](thread_communicator& comm) {
    trainer<mxfp4, allgather, fixed_policy> t(comm, lay, {.policy = {.kept_fraction = 0.5}});
    auto g = test::make_data(lay.numel(), 9 + static_cast<unsigned>(comm.rank()));
    sent[static_cast<std::size_t>(comm.rank())] = t.step(g).bytes_sent;
  });
  std::size_t expected = sizeof(packet_header);
  for (std::size_t i = 0; i < lay.size(); ++i)
    if (lay[i].numel) expected += sizeof(segment_header) + block_scaled_payload_bytes(lay[i].numel, 32, 4);
  CHECK(sent[0] == expected);
  CHECK(sent[1] == expected);
}

TEST_CASE("block-scaled compositions: allgather, dense_allreduce, flexible, compressed allreduce; not AR-Topk",
          "[block_scaled][composition]") {
  STATIC_REQUIRE(detail::composition_verdict<mxfp8, allgather, fixed_policy>() == rejection::none);
  STATIC_REQUIRE(detail::composition_verdict<mxfp4, dense_allreduce, fixed_policy>() == rejection::none);
  STATIC_REQUIRE(detail::composition_verdict<nvfp4, flexible, fixed_policy>() == rejection::none);
  STATIC_REQUIRE(detail::composition_verdict<mxfp8, allreduce_compatible, fixed_policy>() == rejection::not_summable);
  STATIC_REQUIRE(detail::composition_verdict<nvfp4, low_rank_allreduce, fixed_policy>() == rejection::not_low_rank);
  STATIC_REQUIRE(detail::composition_verdict<mxfp4, allgather, gravac_policy>() == rejection::decisions_ignored);
  // Host compressors with options run on shards: the compressed allreduce takes them.
  STATIC_REQUIRE(detail::composition_verdict<mxfp8, compressed_allreduce, fixed_policy>() == rejection::none);
  STATIC_REQUIRE(ShardableCompressor<nvfp4>);
  STATIC_REQUIRE(flexible::priced_by_packet<mxfp4>);  // a coded segment's size: the layer's size and the options
}

TEST_CASE("block-scaled options are checked at construction", "[block_scaled][options]") {
  const auto lay = layout::flat(10);
  CHECK_THROWS_AS(mxfp8(lay, {.element = static_cast<mxfp8_element>(7)}), gravac::error);
  CHECK_THROWS_AS(mxfp8(lay, {.rounding = static_cast<block_rounding>(5)}), gravac::error);
  CHECK_THROWS_AS(mxfp4(lay, {.rounding = static_cast<block_rounding>(5)}), gravac::error);
  CHECK_THROWS_AS(nvfp4(lay, {.rounding = static_cast<block_rounding>(5)}), gravac::error);
  CHECK(mxfp8(lay, {.element = mxfp8_element::e5m2}).get_options().element == mxfp8_element::e5m2);
}

namespace {
// Each rank trains `steps` steps on its own gradients through trainer<C, K, fixed_policy>;
// returns [step][rank] outputs and the residuals at the end. No Catch macros in the ranks.
// Spread data (blocks from 1e-6 to 1e4) or standard normal data: the dense Allreduce sums in
// the engine's order, which differs from the reference's by roundings of the largest terms.
std::vector<float> trainer_data(std::size_t n, std::uint64_t seed, bool spread) {
  return spread ? spread_data(n, seed) : test::make_data(n, seed);
}

template <class C, class K>
void run_trainer(int ranks, const typename C::options& copt, int steps, bool spread,
                 std::vector<std::vector<std::vector<float>>>& outputs, std::vector<std::vector<float>>& residuals) {
  const auto lay = test::mixed_layout();
  using T = trainer<C, K, fixed_policy>;
  typename T::options opt;
  opt.compressor = copt;
  opt.policy.kept_fraction = 0.5;
  opt.seed = 99;
  outputs.assign(static_cast<std::size_t>(steps), std::vector<std::vector<float>>(static_cast<std::size_t>(ranks)));
  residuals.assign(static_cast<std::size_t>(ranks), {});
  run_ranks(ranks, [&](thread_communicator& comm) {
    T t(comm, lay, opt);
    const auto r = static_cast<std::size_t>(comm.rank());
    for (int s = 0; s < steps; ++s) {
      auto g = trainer_data(lay.numel(), 1000 * static_cast<std::uint64_t>(s) + r + 1, spread);
      t.step(g);
      outputs[static_cast<std::size_t>(s)][r] = g;
    }
    const auto& ct = t;
    residuals[r].assign(ct.residual().begin(), ct.residual().end());
  });
}

template <class C, class K>
void check_against_reference(int ranks, const typename C::options& copt, bool bitwise) {
  const auto lay = test::mixed_layout();
  const int steps = 3;
  std::vector<std::vector<std::vector<float>>> outputs;
  std::vector<std::vector<float>> residuals;
  run_trainer<C, K>(ranks, copt, steps, bitwise, outputs, residuals);
  std::vector<std::vector<float>> ref_res(static_cast<std::size_t>(ranks), std::vector<float>(lay.numel(), 0.0f));
  for (int s = 0; s < steps; ++s) {
    std::vector<std::vector<float>> grads;
    for (int r = 0; r < ranks; ++r)
      grads.push_back(
          trainer_data(lay.numel(), 1000 * static_cast<std::uint64_t>(s) + static_cast<std::uint64_t>(r) + 1, bitwise));
    const auto ref = test::serial_reference<C>(lay, copt, test::params_for(lay, 0.5, static_cast<std::uint64_t>(s), 99),
                                               grads, ref_res);
    for (int r = 0; r < ranks; ++r) {
      INFO("ranks " << ranks << " step " << s << " rank " << r);
      const auto& out = outputs[static_cast<std::size_t>(s)][static_cast<std::size_t>(r)];
      if (bitwise)
        CHECK(test::bitwise_equal(out, ref));
      else
        CHECK(test::max_rel_diff(out, ref) < 1e-5);
      CHECK(test::bitwise_equal(out, outputs[static_cast<std::size_t>(s)][0]));  // the same bits on every rank
    }
  }
  for (int r = 0; r < ranks; ++r)
    CHECK(test::bitwise_equal(residuals[static_cast<std::size_t>(r)], ref_res[static_cast<std::size_t>(r)]));
}
}  // namespace

TEST_CASE("trainer<mxfp8, allgather, fixed_policy> on 2 and 3 thread ranks equals the serial reference",
          "[block_scaled][trainer][threads]") {
  for (int ranks : {2, 3}) {
    check_against_reference<mxfp8, allgather>(ranks, {}, true);
    check_against_reference<mxfp8, allgather>(
        ranks, {.element = mxfp8_element::e5m2, .rounding = block_rounding::stochastic}, true);
  }
  check_against_reference<mxfp4, allgather>(3, {.rounding = block_rounding::stochastic}, true);
  check_against_reference<nvfp4, allgather>(2, {}, true);
  check_against_reference<nvfp4, allgather>(3, {.error_feedback = false}, true);
  // dense_allreduce sums in the engine's order: equal to rounding, residuals bit for bit.
  check_against_reference<mxfp4, dense_allreduce>(3, {}, false);
  check_against_reference<nvfp4, dense_allreduce>(2, {}, false);
}

TEST_CASE("block-scaled in a trainer: a non-finite gradient throws on every rank; ignore stays valid",
          "[block_scaled][trainer][non_finite]") {
  const auto lay = test::mixed_layout();
  for (auto action : {non_finite_action::throw_error, non_finite_action::ignore}) {
    std::atomic<int> non_finite{0}, other{0};
    run_ranks(3, [&](thread_communicator& comm) {
      trainer<nvfp4, allgather, fixed_policy> t(comm, lay, {.policy = {.kept_fraction = 0.5}, .on_non_finite = action});
      auto g = test::make_data(lay.numel(), 3 + static_cast<unsigned>(comm.rank()));
      if (comm.rank() == 1) g[lay[2].offset + 3] = std::numeric_limits<float>::quiet_NaN();
      try {
        t.step(g);
      } catch (const gravac::error& err) {
        ++(err.code() == status::non_finite ? non_finite : other);
      }
    });
    INFO("action " << static_cast<int>(action));
    CHECK(other == 0);
    CHECK(non_finite == (action == non_finite_action::throw_error ? 3 : 0));
  }
}

TEST_CASE("block-scaled over the compressed allreduce on 1 to 5 thread ranks equals the two-stage reference",
          "[block_scaled][compressed_allreduce][threads]") {
  for (int n = 1; n <= 5; ++n) {
    test::check_compressed_allreduce<mxfp8>(n, {}, spread_data);
    test::check_compressed_allreduce<mxfp4>(n, {.rounding = block_rounding::stochastic}, spread_data);
    test::check_compressed_allreduce<nvfp4>(n, {}, spread_data);
  }
}
