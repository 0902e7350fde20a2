// The one summation order of the norms (core/detail/square_sum.hpp): the aligned tree over
// the leaves, the leaf's float lanes, and the host passes that must follow it bit for bit
// (the fused pass in every variant, the raw segment, AR-Topk's accumulate and gather, the
// quantizers' norms and kept energies), and square_sum_stream, which feeds it in runs.
#include <algorithm>
#include <bit>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "gravac/collective/detail/ar_topk_host_passes.hpp"
#include "gravac/compress/block_scaled.hpp"
#include "gravac/compress/cast16.hpp"
#include "gravac/compress/detail/fused_pass.hpp"
#include "gravac/compress/qsgd.hpp"
#include "gravac/compress/sign.hpp"
#include "gravac/compress/terngrad.hpp"
#include "gravac/core/detail/square_sum.hpp"
#include "gravac/packet/raw_segment.hpp"
#include "gravac_test_util.hpp"

using namespace gravac;

namespace {

bool same_bits(double a, double b) { return std::memcmp(&a, &b, sizeof a) == 0; }

// The tree by its definition: leaves padded with zeros to a power of two, halves added.
double tree_of(const std::vector<double>& leaves, std::size_t first, std::size_t size) {
  if (size == 1) return first < leaves.size() ? leaves[first] : 0.0;
  const std::size_t half = size / 2;
  return tree_of(leaves, first, half) + tree_of(leaves, first + half, half);
}
double tree_of(const std::vector<double>& leaves) {
  if (leaves.empty()) return 0.0;
  return tree_of(leaves, 0, std::bit_ceil(leaves.size()));
}

// A leaf by its definition: lane l sums the float squares of values 8j + l, a_l = lane_l +
// lane_(l+4), (a0 + a1) + (a2 + a3) in double, then the short group's exact squares.
double leaf_of(const float* x, std::size_t m) {
  float lane[8] = {};
  const std::size_t full = m / 8 * 8;
  for (std::size_t i = 0; i < full; ++i) lane[i % 8] += x[i] * x[i];
  const float a0 = lane[0] + lane[4], a1 = lane[1] + lane[5], a2 = lane[2] + lane[6], a3 = lane[3] + lane[7];
  double s = (double(a0) + a1) + (double(a2) + a3);
  for (std::size_t i = full; i < m; ++i) s += double(x[i]) * x[i];
  return s;
}
double square_sum_by_definition(const std::vector<float>& x) {
  std::vector<double> leaves;
  for (std::size_t a = 0; a < x.size(); a += 256)
    leaves.push_back(leaf_of(x.data() + a, std::min<std::size_t>(256, x.size() - a)));
  return tree_of(leaves);
}

const std::size_t sizes[] = {0, 1, 7, 8, 9, 255, 256, 257, 511, 4096 + 5, 8192 * 3 + 77, 70001};

}  // namespace

TEST_CASE("pairwise_sum streams the aligned tree: any count of leaves", "[square_sum]") {
  std::mt19937 rng(5);
  std::lognormal_distribution<double> dist(0.0, 3.0);  // wide magnitudes: any other order shows
  for (std::size_t n = 0; n <= 70; ++n) {
    std::vector<double> leaves(n);
    for (auto& v : leaves) v = dist(rng);
    detail::pairwise_sum t;
    for (double v : leaves) t.push(v);
    INFO(n << " leaves");
    CHECK(t.count() == n);
    CHECK(same_bits(t.total(), tree_of(leaves)));
  }
}

TEST_CASE("square_sum follows its definition; the fused pass and the raw segment follow square_sum", "[square_sum]") {
  for (std::size_t n : sizes) {
    INFO(n << " values");
    auto g = test::make_data(n, 7);
    auto e = test::make_data(n, 8);
    std::vector<float> u(n);
    for (std::size_t i = 0; i < n; ++i) u[i] = g[i] + e[i];
    CHECK(same_bits(detail::square_sum(g), square_sum_by_definition(g)));
    CHECK(same_bits(detail::square_sum(u), square_sum_by_definition(u)));

    // The fused pass, with and without collecting (every variant sums the same way).
    for (std::uint32_t guess : {detail::no_guess, 0x3f000000u}) {
      std::vector<float> ef = e;
      std::vector<std::uint32_t> idx(n + 8), bits(n + 8);
      const auto r = detail::fused_pass<detail::fused_lanes>(g.data(), ef.data(), n, 0, guess, idx.data(), bits.data(),
                                                             {}, detail::no_guess);
      CHECK(same_bits(r.grad_sq, detail::square_sum(g)));
      CHECK(same_bits(r.input_sq, detail::square_sum(u)));
    }

    // A raw segment: grad_sq, input_sq and kept_sq.
    std::vector<float> er = e;
    std::vector<std::byte> buf(raw_segment_bytes(n) + 64);
    byte_writer w(buf);
    layer_stats st;
    write_raw_segment(w, 0, g, er, st);
    CHECK(same_bits(st.grad_sq, detail::square_sum(g)));
    CHECK(same_bits(st.input_sq, detail::square_sum(u)));
    CHECK(same_bits(st.kept_sq, st.input_sq));
  }
}

TEST_CASE("square_sum: non-finite and huge values follow the same arithmetic", "[square_sum]") {
  std::vector<float> x(300, 1.0f);
  CHECK(detail::square_sum(x) == 300.0);
  x[3] = std::numeric_limits<float>::infinity();
  CHECK(std::isinf(detail::square_sum(x)));
  x[3] = std::numeric_limits<float>::quiet_NaN();
  CHECK(std::isnan(detail::square_sum(x)));
  x[3] = 1e20f;  // its float square overflows in a lane: the leaf is summed again in double
  CHECK(same_bits(detail::square_sum(x),
                  detail::leaf_square_sum_in_double(256, [&](std::size_t i) { return x[i]; }) +
                      detail::leaf_square_sum_in_double(44, [&](std::size_t i) { return x[256 + i]; })));
  CHECK(detail::square_sum(x) == Approx(1e40).epsilon(1e-6));
  x[3] = std::numeric_limits<float>::max();  // finite values give a finite norm
  CHECK(std::isfinite(detail::square_sum(x)));
  x[3] = 1.0f;
  x[299] = 1e20f;  // in the short last group: an exact double square
  CHECK(detail::square_sum(x) == Approx(1e40).epsilon(1e-6));
}

TEST_CASE("square_sum_stream: runs of any length, overwritten once added, give square_sum's bits", "[square_sum]") {
  std::mt19937 rng(17);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (const std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{255}, std::size_t{256}, std::size_t{1000},
                              std::size_t{4097}, std::size_t{70001}}) {
    std::vector<float> x(n);
    for (auto& v : x) v = normal(rng) * std::ldexp(1.0f, static_cast<int>(rng() % 40) - 20);
    if (n > 700) x[700] = 3e19f;  // leaves summed again in double
    if (n > 300) x[300] = -4e19f;
    const double want = detail::square_sum(x);
    // Runs of whole leaves go four, two and one at a time (whole_leaf_sums), others through
    // the stream's copy of a partial leaf.
    for (const std::size_t run : {1, 7, 256, 300, 512, 768, 1024, 5000}) {
      // Each run is copied to a scratch buffer that the next run overwrites (as a bucket's
      // u is overwritten by its residual), so a held partial leaf must be the stream's copy.
      detail::square_sum_stream s;
      std::vector<float> scratch(run);
      for (std::size_t at = 0; at < n; at += run) {
        const std::size_t m = std::min(run, n - at);
        std::copy_n(x.begin() + static_cast<std::ptrdiff_t>(at), m, scratch.begin());
        s.add(scratch.data(), m);
        std::fill(scratch.begin(), scratch.end(), -1.0f);
      }
      INFO("n = " << n << ", runs of " << run);
      CHECK(same_bits(s.finish(), want));
    }
  }
}

TEST_CASE("AR-Topk's host accumulate and gather sum in square_sum's order", "[square_sum][allreduce_compatible]") {
  layout lay;
  lay.add("a", {70001}, layer_kind::dense);
  lay.add("b", {9}, layer_kind::dense);
  lay.add("c", {4096 + 3}, layer_kind::dense);
  auto g = test::make_data(lay.numel(), 11);
  auto e = test::make_data(lay.numel(), 12);
  const auto e0 = e;
  detail::ar_topk_host_passes passes;
  step_params p;
  compress_stats st;
  st.layers.resize(lay.size());
  const double local = passes.accumulate(lay, host_view(g), host_view(e), p, st);
  double want_local = 0;
  for (std::size_t i = 0; i < lay.size(); ++i) {
    const auto& l = lay[i];
    const std::vector<float> gl(g.begin() + l.offset, g.begin() + l.offset + l.numel);
    std::vector<float> ul(l.numel);
    for (std::size_t j = 0; j < l.numel; ++j) ul[j] = g[l.offset + j] + e0[l.offset + j];
    INFO("layer " << i);
    CHECK(same_bits(st.layers[i].grad_sq, detail::square_sum(gl)));
    CHECK(same_bits(st.layers[i].input_sq, detail::square_sum(ul)));
    CHECK(std::memcmp(e.data() + l.offset, ul.data(), l.numel * sizeof(float)) == 0);  // u over e
    want_local += st.layers[i].grad_sq;
  }
  CHECK(same_bits(local, want_local));
  // Gather every layer dense: the kept energy is the sum of the values sent, in order.
  const std::vector<std::size_t> offsets(lay.size() + 1, 0);
  const std::vector<bool> dense(lay.size(), true);
  const auto u = e;
  passes.gather(lay, offsets, dense, host_view(e), lay.numel(), st);
  for (std::size_t i = 0; i < lay.size(); ++i) {
    const auto& l = lay[i];
    const std::vector<float> ul(u.begin() + l.offset, u.begin() + l.offset + l.numel);
    CHECK(st.layers[i].kept == l.numel);
    CHECK(same_bits(st.layers[i].kept_sq, detail::square_sum(ul)));
  }
}

namespace {

// One step of quantizer \p c over \p lay: every layer's ||g||^2 and ||u||^2 must be
// square_sum of g and u, and its kept energy square_sum of what the packet decodes to (EF
// sign's is n * scale^2, no sum).
template <class C>
void check_quantizer_sums(C& c, const layout& lay, bool kept_is_a_sum = true) {
  const auto g = test::make_data(lay.numel(), 41, test::distribution::laplace);
  auto e = test::make_data(lay.numel(), 42);
  for (auto& x : e) x *= 0.3f;
  std::vector<float> u(lay.numel());
  for (std::size_t i = 0; i < u.size(); ++i) u[i] = g[i] + e[i];
  const auto p = test::params_for(lay, 0.5, 3, 11);
  compress_stats st;
  std::vector<std::byte> packet(c.max_packet_bytes());
  std::vector<float> gc = g;
  packet.resize(c.compress(host_view(gc), host_view(e), p, packet, st));
  std::vector<float> dec(lay.numel(), 0.0f);
  REQUIRE(c.validate(packet));
  c.decompress_add(packet, host_view(dec), 1.0f);
  for (std::size_t i = 0; i < lay.size(); ++i) {
    const auto& l = lay[i];
    INFO("layer " << l.name << " (" << l.numel << " values)");
    const auto at = [&](const std::vector<float>& v) { return std::span<const float>(v).subspan(l.offset, l.numel); };
    CHECK(same_bits(st.layers[i].grad_sq, detail::square_sum(at(g))));
    CHECK(same_bits(st.layers[i].input_sq, detail::square_sum(at(u))));
    if (kept_is_a_sum) CHECK(same_bits(st.layers[i].kept_sq, detail::square_sum(at(dec))));
  }
}

}  // namespace

TEST_CASE("the quantizers' norms and kept energy follow square_sum (the device's order)", "[square_sum][quantizers]") {
  layout lay;
  lay.add("big", {70001}, layer_kind::dense);
  lay.add("empty", {0}, layer_kind::dense);
  lay.add("mid", {3, 1000}, layer_kind::dense);
  lay.add("tail", {13}, layer_kind::bias_or_norm);
  lay.add("leaf", {1024}, layer_kind::dense);
  for (std::uint32_t bucket : {0u, 512u, 576u}) {  // 576: buckets end inside leaves
    INFO("bucket " << bucket);
    qsgd q(lay, {127, bucket});
    check_quantizer_sums(q, lay);
    qsgd q2(lay, {3, bucket});
    check_quantizer_sums(q2, lay);
    terngrad t(lay, {bucket});
    check_quantizer_sums(t, lay);
  }
  sign sg(lay, {});
  check_quantizer_sums(sg, lay, false);
  for (auto f : {cast16_format::fp16, cast16_format::bf16}) {
    cast16 c(lay, {f});
    check_quantizer_sums(c, lay);
  }
  for (auto r : {block_rounding::nearest_even, block_rounding::stochastic}) {
    mxfp8 m8(lay, {mxfp8_element::e4m3, r, true});
    check_quantizer_sums(m8, lay);
    mxfp8 m5(lay, {mxfp8_element::e5m2, r, true});
    check_quantizer_sums(m5, lay);
    mxfp4 m4(lay, {r, true});
    check_quantizer_sums(m4, lay);
    nvfp4 nv(lay, {r, true});
    check_quantizer_sums(nv, lay);
  }
}
