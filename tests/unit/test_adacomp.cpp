// AdaComp against a plain reference implementation of the six steps of docs/algorithms.md
// ("Compressors"),
// its error-feedback invariant, its wire size (about 33 bits per sent element) and the
// validation of corrupt packets.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <limits>

#include "gravac/compress/adacomp.hpp"
#include "gravac_test_util.hpp"

using namespace gravac;

namespace {

// The six steps, written plainly for one layer. Returns the decompressed layer (scale *
// sign at each sent index) and updates r in place.
struct reference_result {
  std::vector<float> decoded;
  std::vector<std::size_t> sent;
  float scale = 0;
};
reference_result reference_adacomp(std::span<const float> g, std::span<float> r, std::size_t bin) {
  const std::size_t n = g.size();
  reference_result out;
  out.decoded.assign(n, 0.0f);
  std::vector<float> h(n);
  for (std::size_t i = 0; i < n; ++i) {  // 1. R += g; H = R + g
    r[i] = r[i] + g[i];
    h[i] = r[i] + g[i];
  }
  const std::size_t bins = (n + bin - 1) / bin;
  std::vector<float> gmax(bins, 0.0f);
  for (std::size_t i = 0; i < n; ++i) gmax[i / bin] = std::max(gmax[i / bin], std::fabs(r[i]));  // 2.
  std::vector<int> sign(n, 0);
  for (std::size_t i = 0; i < n; ++i)  // 3. (R_i == 0 has no sign and is not sent)
    if (std::fabs(h[i]) >= gmax[i / bin] && r[i] != 0.0f) {
      out.sent.push_back(i);
      sign[i] = r[i] < 0 ? -1 : 1;
    }
  // 4. The sum of the maxima as adacomp computes it (docs/algorithms.md, "Compressors"; so the device
  // can reproduce it): exact integer sums of the significands per binary exponent, then
  // combined in double from the smallest exponent up.
  std::vector<std::uint64_t> per_exponent(256, 0);
  for (float m : gmax) {
    std::uint32_t bits;
    std::memcpy(&bits, &m, 4);
    const std::uint32_t e = bits >> 23, significand = bits & 0x7fffffu;
    if (e == 0)
      per_exponent[1] += significand;  // subnormal: no hidden bit, the exponent of the smallest normal
    else
      per_exponent[e] += significand | 0x800000u;
  }
  double sum = 0;
  for (int e = 1; e < 255; ++e) sum += static_cast<double>(per_exponent[e]) * std::ldexp(1.0, e - 150);
  out.scale = static_cast<float>(sum / static_cast<double>(bins));
  for (std::size_t i : out.sent) {  // 5. and 6.
    r[i] = sign[i] < 0 ? r[i] + out.scale : r[i] - out.scale;
    out.decoded[i] = sign[i] < 0 ? -out.scale : out.scale;
  }
  return out;
}

bool bit_equal(float a, float b) { return std::memcmp(&a, &b, sizeof a) == 0; }

std::vector<std::byte> compress_packet(adacomp& c, std::vector<float> g, std::vector<float>& e, const step_params& p,
                                       compress_stats& st) {
  std::vector<std::byte> packet(c.max_packet_bytes());
  packet.resize(c.compress(host_view(g), host_view(e), p, packet, st));
  return packet;
}

}  // namespace

TEST_CASE("adacomp equals the reference six steps, layer by layer", "[compress][adacomp]") {
  // A layer longer than the kernel's chunks (1024), so spans of many bins, bins that
  // straddle chunks (1500, 2000) and a bin longer than the layer are all exercised.
  auto lay = test::mixed_layout();
  lay.add("long", {5000 + 3}, layer_kind::dense);
  for (std::uint32_t override_bin : {0u, 1u, 7u, 64u, 1500u, 2000u, 10000u}) {
    for (auto dist : {test::distribution::gaussian, test::distribution::laplace, test::distribution::all_equal}) {
      INFO("bin override " << override_bin << " distribution " << static_cast<int>(dist));
      adacomp c(lay);
      auto p = test::params_for(lay, 0.5);
      c.set_step_settings({.bin_length = std::vector<std::uint32_t>(lay.size(), override_bin)});
      std::vector<float> r = test::make_data(lay.numel(), 3, dist);
      for (auto& x : r) x *= 0.3f;
      std::vector<float> r_ref = r;
      for (int step = 0; step < 3; ++step) {  // several steps: the residue carries over
        const auto g = test::make_data(lay.numel(), 10 + step, dist);
        compress_stats st;
        const auto packet = compress_packet(c, g, r, p, st);
        REQUIRE(c.validate(packet));
        std::vector<float> dec(lay.numel(), 0.0f);
        c.decompress_add(packet, host_view(dec), 1.0f);
        for (std::size_t li = 0; li < lay.size(); ++li) {
          const auto& l = lay[li];
          if (l.numel == 0) continue;
          const std::size_t bin = override_bin ? override_bin : c.bin_length(li);
          auto ref = reference_adacomp(std::span<const float>(g).subspan(l.offset, l.numel),
                                       std::span<float>(r_ref).subspan(l.offset, l.numel), bin);
          CHECK(st.layers[li].kept == ref.sent.size());
          for (std::size_t i = 0; i < l.numel; ++i) {
            INFO("layer " << l.name << " element " << i << " step " << step);
            REQUIRE(bit_equal(dec[l.offset + i], ref.decoded[i]));
            REQUIRE(bit_equal(r[l.offset + i], r_ref[l.offset + i]));
          }
        }
      }
    }
  }
}

TEST_CASE("adacomp bin lengths: option defaults by layer kind, policy override", "[compress][adacomp]") {
  const auto lay = test::mixed_layout();
  adacomp c(lay);
  CHECK(c.bin_length(0) == 50);   // conv
  CHECK(c.bin_length(1) == 50);   // bias_or_norm
  CHECK(c.bin_length(2) == 500);  // dense
  adacomp_settings s;
  s.bin_length.assign(lay.size(), 0);
  s.bin_length[2] = 9;
  c.set_step_settings(s);
  CHECK(c.bin_length(2) == 9);
  CHECK(c.bin_length(4) == 500);
  CHECK(c.settings().bin_length == s.bin_length);
  c.set_step_settings({});  // empty: the defaults again
  CHECK(c.bin_length(2) == 500);
  CHECK_THROWS_AS(adacomp(lay, {.conv_bin = 0}), gravac::error);
  layout rec;
  rec.add("lstm", {40, 10}, layer_kind::recurrent);
  CHECK(adacomp(rec).bin_length(0) == 500);
}

TEST_CASE("adacomp error feedback: decompress(sent) + R_new == R_old + g", "[compress][adacomp][ef]") {
  const auto lay = test::mixed_layout();
  adacomp c(lay);
  const auto g = test::make_data(lay.numel(), 21, test::distribution::laplace);
  auto r = test::make_data(lay.numel(), 22);
  const auto r_old = r;
  compress_stats st;
  const auto packet = compress_packet(c, g, r, test::params_for(lay, 0.5), st);
  std::vector<float> dec(lay.numel(), 0.0f);
  c.decompress_add(packet, host_view(dec), 1.0f);
  std::size_t sent = 0, exact = 0;
  for (std::size_t i = 0; i < lay.numel(); ++i) {
    const float target = r_old[i] + g[i];  // the accumulated residue, in float
    INFO("element " << i);
    if (dec[i] == 0.0f) {
      REQUIRE(bit_equal(r[i], target));  // unsent: bit for bit
    } else {
      ++sent;
      const float back = dec[i] + r[i];
      const float bound = std::ldexp(1.0f, std::ilogb(std::max(std::fabs(target), std::fabs(dec[i]))) - 23);
      REQUIRE(std::fabs(back - target) <= bound);  // sent: within one ulp of the larger magnitude
      exact += back == target;
    }
  }
  CHECK(sent > 0);
  CHECK(exact > 0);
}

TEST_CASE("adacomp sends about 33 bits per element", "[compress][adacomp][size]") {
  const std::size_t n = 200000;
  layout lay;
  lay.add("conv", {n / 50, 50}, layer_kind::conv);
  adacomp c(lay);
  const auto g = test::make_data(n, 5);
  std::vector<float> r(n, 0.0f);
  compress_stats st;
  const auto packet = compress_packet(c, g, r, test::params_for(lay, 0.5), st);
  const std::size_t k = st.layers[0].kept;
  REQUIRE(k > 1000);
  CHECK(packet.size() == sizeof(packet_header) + adacomp_segment_bytes(n, k));
  const double bits = 8.0 * static_cast<double>(packet.size() - sizeof(packet_header) - sizeof(segment_header) - 8) / k;
  CHECK(bits >= 33.0);
  CHECK(bits < 33.1);
  // A layer at kept fraction 1 is sent raw.
  std::vector<float> r2(n, 0.0f);
  const auto dense = compress_packet(c, g, r2, test::params_for(lay, 1.0), st);
  CHECK(dense.size() == sizeof(packet_header) + raw_segment_bytes(n));
}

TEST_CASE("adacomp validation rejects malformed packets", "[compress][adacomp][validation]") {
  const auto lay = layout::flat(300);
  adacomp c(lay);
  const auto g = test::make_data(300, 8);
  std::vector<float> r(300, 0.0f);
  compress_stats st;
  auto p = test::params_for(lay, 0.5);
  c.set_step_settings({.bin_length = {10}});
  const auto good = compress_packet(c, g, r, p, st);
  REQUIRE(c.validate(good));
  const std::size_t k = st.layers[0].kept;
  REQUIRE(k >= 3);
  const std::size_t seg = sizeof(packet_header);
  const std::size_t pl = seg + sizeof(segment_header);
  auto corrupt = [&](auto&& edit) {
    auto bad = good;
    edit(bad);
    return c.validate(bad);
  };
  for (std::size_t cut = 0; cut < good.size(); cut += 3)
    CHECK_FALSE(c.validate(std::span<const std::byte>(good.data(), cut)));
  auto put32 = [](std::vector<std::byte>& b, std::size_t at, std::uint32_t v) { std::memcpy(b.data() + at, &v, 4); };
  auto putf = [](std::vector<std::byte>& b, std::size_t at, float v) { std::memcpy(b.data() + at, &v, 4); };
  CHECK_FALSE(corrupt([&](auto& b) { put32(b, pl + 8, 300); }));  // index out of range
  CHECK_FALSE(corrupt([&](auto& b) {
    put32(b, pl + 12, load_at<std::uint32_t>(std::span<const std::byte>(b).subspan(pl + 8), 0));
  }));                                                                 // repeat
  CHECK_FALSE(corrupt([&](auto& b) { putf(b, pl, std::nanf("")); }));  // NaN scale
  CHECK_FALSE(corrupt([&](auto& b) { putf(b, pl, -1.0f); }));          // negative scale
  CHECK_FALSE(corrupt([&](auto& b) { put32(b, pl + 4, 0); }));         // zero bin length
  CHECK_FALSE(corrupt([&](auto& b) { b[seg + 4] = std::byte{8}; }));   // index width 8 for a small layer
  CHECK_FALSE(corrupt([&](auto& b) {                                   // count larger than the payload
    std::uint64_t cnt = k + 1;
    std::memcpy(b.data() + seg + 16, &cnt, 8);
  }));
  if (detail::code_bytes(k, 1) % 8 != 0)
    CHECK_FALSE(corrupt([&](auto& b) { b.back() = std::byte{0x80}; }));  // padding bit of the signs set
  CHECK(c.validate(good));
}

TEST_CASE("adacomp: infinities and NaNs are never sent, do not count in a bin's maximum, and are reported",
          "[compress][adacomp][non_finite]") {
  const std::size_t n = 1000, bin = 50;
  const auto lay = layout::flat(n);
  adacomp c(lay);
  auto p = test::params_for(lay, 0.5);
  c.set_step_settings({.bin_length = {static_cast<std::uint32_t>(bin)}});
  auto g = test::make_data(n, 9);
  g[3] = std::numeric_limits<float>::infinity();
  g[60] = -std::numeric_limits<float>::infinity();
  g[120] = std::numeric_limits<float>::quiet_NaN();
  for (std::size_t i = 200; i < 250; ++i) g[i] = std::numeric_limits<float>::quiet_NaN();  // a bin of NaNs only
  std::vector<float> r(n, 0.0f), r_ref(n, 0.0f);
  compress_stats st;
  const auto packet = compress_packet(c, g, r, p, st);
  CHECK(st.non_finite);
  REQUIRE(c.validate(packet));  // the scale stays finite
  std::vector<float> dec(n, 0.0f);
  c.decompress_add(packet, host_view(dec), 1.0f);
  // The reference on the same data with the non-finite values replaced by 0: the same
  // maxima, the same scale, the same elements sent.
  auto g_finite = g;
  for (auto& x : g_finite)
    if (!std::isfinite(x)) x = 0.0f;
  const auto ref = reference_adacomp(g_finite, r_ref, bin);
  for (std::size_t i = 0; i < n; ++i) {
    INFO("element " << i);
    REQUIRE(bit_equal(dec[i], ref.decoded[i]));
    if (std::isfinite(g[i]))
      REQUIRE(bit_equal(r[i], r_ref[i]));
    else
      REQUIRE(!std::isfinite(r[i]));  // left in the residue
  }
  CHECK(st.layers[0].kept == ref.sent.size());
  compress_stats clean;
  std::vector<float> r2(n, 0.0f);
  (void)compress_packet(c, g_finite, r2, p, clean);
  CHECK_FALSE(clean.non_finite);
}
