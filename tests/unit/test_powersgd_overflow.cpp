// PowerSGD on finite data near the float maximum and far below 1: the float norms of
// Gram-Schmidt overflow (|x| above about 1.8e19) or underflow (|x| below about 1e-19)
// unless the columns are scaled; Q_local and the residual must stay finite.

#include <catch2/catch.hpp>
#include <cfloat>
#include <cmath>

#include "gravac/collective/low_rank_allreduce.hpp"
#include "gravac/compress/powersgd.hpp"
#include "gravac_overflow_util.hpp"

using namespace gravac;
using test::overflow::data_kind;

TEST_CASE("powersgd with huge and tiny finite values: finite residual, valid packet, finite statistics",
          "[compress][powersgd][overflow]") {
  layout big;
  big.add("w", {64, 80}, layer_kind::dense);
  big.add("b", {80}, layer_kind::bias_or_norm);
  for (const auto& lay : {test::mixed_layout(), big})
    for (std::uint32_t rank : {1u, 2u, 4u})
      for (auto kind : test::overflow::all_kinds) {
        INFO("data: " << test::overflow::kind_name(kind) << ", rank " << rank << ", layout of " << lay.numel());
        powersgd c(lay, {.rank = rank});
        std::vector<float> e(lay.numel(), 0.0f);
        auto p = test::params_for(lay, 0.5, 1, 5);
        const auto huge = test::overflow::make_huge(lay.numel(), kind, 23);
        // Near the float maximum the residual bound may leave nothing to send; elsewhere
        // the power iteration must send (before the fix, overflowing or underflowing norms
        // zeroed every column, so nothing was ever sent).
        const bool must_send = kind == data_kind::huge19 || kind == data_kind::huge30 || kind == data_kind::tiny;
        test::overflow::check_step(c, lay, huge, e, p, must_send);
        p.step = 2;  // the warm start from the huge step
        test::overflow::check_step(c, lay, test::make_data(lay.numel(), 24), e, p, false);
        p.step = 3;
        test::overflow::check_step(c, lay, test::overflow::second_huge_step(huge, e), e, p, must_send);
      }
}

TEST_CASE("powersgd: a power-of-two scale of the data scales P^ Q^T exactly", "[compress][powersgd][overflow]") {
  // Gram-Schmidt on columns brought to unit range gives the same P^ as on the original
  // data, so u and 2^k u (k moving the data across the prescale thresholds) decode to
  // exactly 2^k times the same values.
  const auto lay = test::mixed_layout();
  const auto g = test::make_data(lay.numel(), 41);
  std::vector<float> reference;
  for (int k : {0, 70, -70, 100}) {
    INFO("scale 2^" << k);
    powersgd c(lay, {.rank = 2});
    std::vector<float> gk(g), e(lay.numel(), 0.0f);
    for (auto& x : gk) x = std::ldexp(x, k);
    std::vector<std::byte> packet(c.max_packet_bytes());
    compress_stats st;
    packet.resize(c.compress(host_view(gk), host_view(e), test::params_for(lay, 0.5, 1, 5), packet, st));
    REQUIRE(c.validate(packet));
    std::vector<float> dec(lay.numel(), 0.0f);
    c.decompress_add(packet, host_view(dec), 1.0f);
    for (auto& x : dec) x = std::ldexp(x, -k);
    if (reference.empty()) {
      reference = dec;
      double sq = 0;
      for (float x : dec) sq += static_cast<double>(x) * x;
      REQUIRE(sq > 0);
    } else {
      std::size_t differ = 0;
      for (std::size_t i = 0; i < dec.size(); ++i) differ += dec[i] != reference[i];
      CHECK(differ == 0);
    }
  }
}
