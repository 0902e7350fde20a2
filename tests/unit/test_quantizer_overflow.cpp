// Finite inputs near the float maximum: every quantizer sends a valid packet, keeps a
// finite residual with u == decompress(packet) + e, and reports finite statistics. The
// fast kernels sum squares in float lanes, which overflow for |u| above about 1.8e19; the
// QSGD norm of finite values can pass the float maximum; bf16 times N can overflow.

#include <catch2/catch.hpp>
#include <cfloat>
#include <cmath>
#include <limits>
#include <string>

#include "gravac/compress/adacomp.hpp"
#include "gravac/compress/cast16.hpp"
#include "gravac/compress/qsgd.hpp"
#include "gravac/compress/sign.hpp"
#include "gravac/compress/terngrad.hpp"
#include "gravac_overflow_util.hpp"

using namespace gravac;
using test::overflow::data_kind;

namespace {

// Three steps of \p c on data of \p kind (see make_huge): the huge step, a small step on
// the residual it left, and the huge data again (see second_huge_step).
template <class C>
void check_kind(C& c, const layout& lay, data_kind kind, int ranks, bool must_send) {
  std::vector<float> e(lay.numel(), 0.0f);
  auto p = test::params_for(lay, 0.5, 1, 5);
  p.ranks = ranks;
  const auto huge = test::overflow::make_huge(lay.numel(), kind, 17);
  test::overflow::check_step(c, lay, huge, e, p, must_send);
  p.step = 2;
  test::overflow::check_step(c, lay, test::make_data(lay.numel(), 18), e, p, false);
  p.step = 3;
  test::overflow::check_step(c, lay, test::overflow::second_huge_step(huge, e), e, p, false);
}

// \p tiny_sends: whether values of 1e-30 are representable on the wire (not in fp16).
template <class C>
void check_all_kinds(const typename C::options& opt, int ranks = 1, bool tiny_sends = true) {
  for (const auto& lay : {test::mixed_layout(), layout::flat(5000)}) {
    for (auto kind : test::overflow::all_kinds) {
      INFO("data: " << test::overflow::kind_name(kind) << ", layout of " << lay.numel());
      C c(lay, opt);
      check_kind(c, lay, kind, ranks, kind != data_kind::tiny || tiny_sends);
    }
  }
}

}  // namespace

TEST_CASE("accumulate_block: float lanes that overflow are summed again in double", "[compress][quant][overflow]") {
  for (float big : {1e19f, 1e20f, 1e30f, 3.0e38f, FLT_MAX}) {
    for (std::size_t m : {1u, 15u, 16u, 100u, 1024u}) {
      INFO("value " << big << ", m = " << m);
      std::vector<float> g(m), e(m);
      for (std::size_t i = 0; i < m; ++i) {
        g[i] = (i % 3 ? big : -big * 0.5f) * (i % 5 == 4 ? 1e-30f : 1.0f);
        e[i] = i % 7 == 1 ? 1e-40f : 0.0f;
      }
      const auto e_old = e;
      const auto s = detail::accumulate_block(g.data(), e.data(), m);
      double gsq = 0, usq = 0, uabs = 0;
      float umax = 0;
      for (std::size_t i = 0; i < m; ++i) {
        const float u = e_old[i] + g[i];
        REQUIRE(e[i] == u);
        gsq += static_cast<double>(g[i]) * g[i];
        usq += static_cast<double>(u) * u;
        uabs += std::fabs(static_cast<double>(u));
        umax = std::max(umax, std::fabs(u));
      }
      REQUIRE(std::isfinite(s.g_sq));
      REQUIRE(std::isfinite(s.u_sq));
      REQUIRE(std::isfinite(s.u_abs));
      CHECK(s.g_sq == Approx(gsq).epsilon(1e-6));
      CHECK(s.u_sq == Approx(usq).epsilon(1e-6));
      CHECK(s.u_abs == Approx(uabs).epsilon(1e-6));
      CHECK(s.u_max == umax);
    }
  }
}

TEST_CASE("max_level_scale: the top level decodes finite for every level count", "[compress][quant][overflow]") {
  using codec = detail::leveled_codec<detail::level_scale::l2_norm>;
  std::uint32_t bad = 0;
  for (std::uint32_t s = 1; s <= qsgd_max_levels; ++s) {
    const float f = codec::step_value(detail::max_level_scale, s);
    bad += !std::isfinite(f * static_cast<float>(s));
  }
  CHECK(bad == 0);
  // It is the largest such scale: one ulp more (the float maximum) overflows for some s.
  std::uint32_t bad_above = 0;
  for (std::uint32_t s = 1; s <= qsgd_max_levels; ++s)
    bad_above += !std::isfinite(codec::step_value(FLT_MAX, s) * static_cast<float>(s));
  CHECK(bad_above > 0);
  CHECK(std::nextafter(detail::max_level_scale, INFINITY) == FLT_MAX);
}

TEST_CASE("cast16_limit_bits: the largest value of the format whose N-fold is finite", "[compress][cast16][overflow]") {
  CHECK(detail::cast16_limit_bits(cast16_format::fp16, 1.0f) == detail::float_bits(detail::fp16_max));
  CHECK(detail::cast16_limit_bits(cast16_format::fp16, 1e6f) == detail::float_bits(detail::fp16_max));
  CHECK(detail::cast16_limit_bits(cast16_format::bf16, 1.0f) == detail::float_bits(detail::bf16_max));
  for (int n : {2, 3, 5, 7, 8, 1000, 65536}) {
    INFO("N = " << n);
    const auto ranks = static_cast<float>(n);
    const std::uint32_t b = detail::cast16_limit_bits(cast16_format::bf16, ranks);
    CHECK((b & 0xffffu) == 0);  // a bf16 value
    CHECK(std::isfinite(detail::bits_float(b) * ranks));
    CHECK_FALSE(std::isfinite(detail::bits_float(b + 0x10000u) * ranks));
  }
}

TEST_CASE("QSGD with huge finite values: finite residual, valid packet, finite statistics",
          "[compress][quant][overflow]") {
  for (std::uint32_t levels : {1u, 7u, 127u, 1000u})
    for (std::uint32_t bucket : {512u, 64u, 0u, 2048u}) {
      INFO("levels " << levels << ", bucket " << bucket);
      check_all_kinds<qsgd>({.levels = levels, .bucket = bucket});
    }
}

TEST_CASE("TernGrad with huge finite values: finite residual, valid packet, finite statistics",
          "[compress][quant][overflow]") {
  for (std::uint32_t bucket : {512u, 0u, 3072u}) {
    INFO("bucket " << bucket);
    check_all_kinds<terngrad>({.bucket = bucket});
  }
}

TEST_CASE("EF-sign with huge finite values: finite mean |u| scale and residual", "[compress][quant][overflow]") {
  check_all_kinds<sign>({});
}

TEST_CASE("cast16 with huge finite values: fp16 and bf16 on 1 to 8 ranks", "[compress][cast16][overflow]") {
  for (auto f : {cast16_format::fp16, cast16_format::bf16})
    for (int ranks : {1, 2, 3, 8}) {
      INFO("format " << static_cast<int>(f) << ", ranks " << ranks);
      check_all_kinds<cast16>({.format = f}, ranks, f == cast16_format::bf16);
    }
}

TEST_CASE("AdaComp with huge finite values: finite residue and statistics", "[compress][adacomp][overflow]") {
  for (std::uint32_t bin : {50u, 500u}) {
    INFO("bin " << bin);
    check_all_kinds<adacomp>({.conv_bin = bin, .dense_bin = bin, .bias_bin = bin});
  }
}
