// adacomp_cuda against the CPU gravac::adacomp, and topk_cuda with whole_buffer against
// gravac::topk with whole_buffer, on the same data: packets equal byte for byte, residuals
// equal bit for bit (several steps, so the residue carries over), statistics close; device
// validation and decoding against the host's. Skipped without a GPU.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "cuda_test_util.hpp"
#include "gravac/compress/adacomp.hpp"
#include "gravac/compress/topk.hpp"
#include "gravac/cuda/adacomp_cuda.hpp"
#include "gravac/cuda/topk_cuda.hpp"
#include "gravac_overflow_util.hpp"
#include "gravac_test_util.hpp"

namespace {

using gravac::test::distribution;
using gravac::test::same_words;
using gravac::test::scaled;
using gravac::test::to_device;
using gravac::test::to_host;

// A host and a device compressor for one layout, stepped together on the same data.
template <class Host, class Dev>
using pair_run = gravac::test::pair_run<Host, Dev>;

using ada_pair = pair_run<gravac::adacomp, gravac::adacomp_cuda>;
using whole_pair = pair_run<gravac::topk, gravac::topk_cuda>;

ada_pair make_ada(gravac::layout lay, gravac::adacomp_options bins = {}) {
  gravac::adacomp_cuda_options d;
  d.bins = bins;
  ada_pair r(std::move(lay), bins, d);
  r.norm_eps = 1e-5;
  return r;
}
whole_pair make_whole(gravac::layout lay) {
  gravac::topk_options h;
  h.whole_buffer = true;
  gravac::topk_cuda_options d;
  d.whole_buffer = true;
  return whole_pair(std::move(lay), h, d);
}

// Conv, bias, dense and recurrent layers, of sizes that are and are not multiples of the bins.
gravac::layout ada_layout() {
  auto lay = gravac::test::mixed_layout();
  lay.add("conv2.weight", {16, 8, 5, 5}, gravac::layer_kind::conv);  // 3200 = 64 bins of 50
  lay.add("lstm", {3, 1667}, gravac::layer_kind::recurrent);         // 5001: a partial bin of 1
  lay.add("fc3.weight", {70001}, gravac::layer_kind::dense);
  return lay;
}

}  // namespace

TEST_CASE("adacomp_cuda sends exactly what adacomp sends: layer kinds, bin lengths, partial bins") {
  const std::uint32_t bins[] = {0, 1, 2, 7, 31, 32, 33, 50, 500, 2047, 2048, 2049, 5000, 100000};
  const distribution dists[] = {distribution::gaussian, distribution::laplace, distribution::all_equal,
                                distribution::narrow};
  for (auto bin : bins)
    for (auto d : dists) {
      INFO("bin override " << bin << ", distribution " << static_cast<int>(d));
      auto r = make_ada(ada_layout());
      auto p = gravac::test::params_for(r.lay, 0.5);
      p.bin_length.assign(r.lay.size(), bin);  // 0: the option of the layer's kind
      // Several steps: the residue carries over, and a jump in scale changes every bin.
      r.step(gravac::test::make_data(r.lay.numel(), 1, d), p);
      r.step(gravac::test::make_data(r.lay.numel(), 2, d), p);
      r.step(scaled(gravac::test::make_data(r.lay.numel(), 3, d), 1e-3f), p);
    }
}

TEST_CASE("adacomp_cuda: other bin options, and per-layer bin lengths from the policy") {
  auto r = make_ada(ada_layout(), {.conv_bin = 9, .dense_bin = 1000, .bias_bin = 3});
  auto p = gravac::test::params_for(r.lay, 0.5);
  for (std::uint64_t s = 0; s < 2; ++s) r.step(gravac::test::make_data(r.lay.numel(), 5 + s), p);
  p.bin_length.assign(r.lay.size(), 0);
  p.bin_length[0] = 4;
  p.bin_length[6] = 1;  // shorter than any bin seen: the bin maxima grow once
  for (std::uint64_t s = 0; s < 2; ++s) r.step(gravac::test::make_data(r.lay.numel(), 7 + s), p);
}

TEST_CASE("adacomp_cuda at 2^22 + 5 and 2^26 values matches adacomp") {
  for (std::size_t n : {(std::size_t{1} << 22) + 5, std::size_t{1} << 26}) {
    gravac::layout lay;
    lay.add("conv", {n}, gravac::layer_kind::conv);
    auto r = make_ada(lay);
    auto p = gravac::test::params_for(r.lay, 0.5);
    INFO("n = " << n);
    r.step(gravac::test::make_data(n, 11, distribution::laplace), p);
    if (n < (std::size_t{1} << 26)) {
      r.step(gravac::test::make_data(n, 12, distribution::gaussian), p);
      p.bin_length = {500};
      r.step(gravac::test::make_data(n, 13, distribution::gaussian), p);
    }
  }
}

TEST_CASE("adacomp_cuda: all-zero bins, signed zeros and an all-zero layer") {
  auto lay = ada_layout();
  auto r = make_ada(lay);
  auto p = gravac::test::params_for(r.lay, 0.5);
  for (std::uint64_t step = 0; step < 3; ++step) {
    auto g = gravac::test::make_data(lay.numel(), 21 + step);
    for (std::size_t i = 0; i < g.size(); ++i)
      if ((i / 50) % 3 == 0) g[i] = (i % 2) ? -0.0f : 0.0f;                      // whole bins of (signed) zeros
    for (std::size_t j = 0; j < lay[0].numel; ++j) g[lay[0].offset + j] = 0.0f;  // a layer of zeros
    if (step == 2) std::fill(g.begin(), g.end(), 0.0f);                          // only the residue is left
    r.step(g, p);
  }
}

TEST_CASE("adacomp_cuda: infinities and NaNs are never sent, do not count, and are reported as adacomp does") {
  auto lay = ada_layout();
  auto r = make_ada(lay);
  auto p = gravac::test::params_for(r.lay, 0.5);
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  auto g = gravac::test::make_data(lay.numel(), 31);
  g[3] = inf;
  g[lay[2].offset + 1] = -inf;
  g[lay[6].offset + 7] = nan;
  for (std::size_t j = 0; j < 500; ++j) g[lay[7].offset + j] = nan;  // a bin of NaNs only
  r.step(g, p);
  r.step(gravac::test::make_data(lay.numel(), 32), p);  // the non-finite values stay in the residue
  auto clean = make_ada(lay);
  clean.step(gravac::test::make_data(lay.numel(), 33), p);
}

TEST_CASE("adacomp_cuda: finite values near the float maximum, huge and tiny: finite residues and statistics") {
  // The host sums squares in float lanes, which overflow for |R| above about 1.8e19 (and
  // underflow for tiny R): its rare path sums in double, as the device always does.
  const auto lay = ada_layout();
  for (auto kind : gravac::test::overflow::all_kinds) {
    INFO("data: " << gravac::test::overflow::kind_name(kind));
    auto r = make_ada(lay);
    auto p = gravac::test::params_for(r.lay, 0.5);
    const auto h = gravac::test::overflow::make_huge(lay.numel(), kind, 51);
    for (int step = 0; step < 3; ++step) {
      INFO("step " << step);
      r.step(step == 0   ? h
             : step == 1 ? gravac::test::make_data(lay.numel(), 52)
                         : gravac::test::overflow::second_huge_step(h, r.e_host),
             p);
      REQUIRE_FALSE(r.last_host.non_finite);
      for (float x : r.e_host) REQUIRE(std::isfinite(x));
      for (const auto& ls : r.last_host.layers) {
        CHECK(std::isfinite(ls.grad_sq));
        CHECK(std::isfinite(ls.input_sq));
        CHECK(std::isfinite(ls.kept_sq));
      }
      const std::vector<std::byte> pk(r.packet_host.begin(),
                                      r.packet_host.begin() + static_cast<std::ptrdiff_t>(r.bytes));
      REQUIRE(r.host.validate(pk));
      REQUIRE(r.dev.validate(r.packet_dev.span().first(r.bytes)));
    }
  }
}

TEST_CASE("adacomp_cuda: dense layers go raw, gain curve") {
  auto lay = ada_layout();
  auto r = make_ada(lay);
  auto p = gravac::test::params_for(r.lay, 0.5);
  p.kept_fraction[1] = 1.0;
  p.kept_fraction[6] = 1.0;
  const double candidates[] = {0.5, 0.1, 0.01, 0.001};
  p.gain_candidates.assign(std::begin(candidates), std::end(candidates));
  for (std::uint64_t s = 0; s < 3; ++s) r.step(gravac::test::make_data(r.lay.numel(), 41 + s), p);
  p.gain_candidates = {};
  r.step(gravac::test::make_data(r.lay.numel(), 44), p);
}

TEST_CASE("adacomp_cuda: device validation agrees with the host's, decoding equals decompress_add bit for bit") {
  auto lay = ada_layout();
  auto r = make_ada(lay);
  auto p = gravac::test::params_for(r.lay, 0.5);
  p.kept_fraction[1] = 1.0;
  r.step(gravac::test::make_data(r.lay.numel(), 51), p);
  const std::size_t bytes = r.bytes;
  std::vector<std::byte> good(r.packet_host.begin(), r.packet_host.begin() + static_cast<std::ptrdiff_t>(bytes));

  std::vector<float> out_h = gravac::test::make_data(lay.numel(), 52);
  auto out_d = to_device(out_h);
  r.host.decompress_add(good, gravac::host_view(out_h), 0.25f);
  REQUIRE(r.dev.validate(r.packet_dev.span().first(bytes)));
  r.dev.decompress_add(r.packet_dev.span().first(bytes), gravac::device_view(out_d), 0.25f);
  r.dev.synchronize();
  const auto back = to_host(out_d.data(), out_d.size());
  REQUIRE(same_words(back.data(), out_h.data(), back.size() * sizeof(float)));

  auto check = [&](std::vector<std::byte> bad, const char* what) {
    INFO(what);
    const bool host_ok = static_cast<bool>(r.host.validate(bad));
    gravac::device_buffer<std::byte> d(std::max<std::size_t>(bad.size(), 1));
    if (!bad.empty()) GRAVAC_TRY_CUDA(cudaMemcpy(d.data(), bad.data(), bad.size(), cudaMemcpyHostToDevice));
    const bool dev_ok = static_cast<bool>(r.dev.validate(d.span().first(bad.size())));
    CHECK(!host_ok);
    CHECK(dev_ok == host_ok);
  };
  auto put = [](std::vector<std::byte>& b, std::size_t at, auto v) { std::memcpy(b.data() + at, &v, sizeof v); };
  check(std::vector<std::byte>(good.begin(), good.end() - 8), "truncated");
  {
    auto b = good;
    put(b, 0, std::uint32_t{0});
    check(b, "magic");
  }
  // The first AdaComp segment with at least 3 elements sent, a partial last sign byte and
  // padding bytes after it.
  std::size_t pos = sizeof(gravac::packet_header);
  gravac::segment_header sh;
  for (;;) {
    REQUIRE(pos < good.size());
    std::memcpy(&sh, good.data() + pos, sizeof sh);
    if (sh.encoding != gravac::raw_encoding && sh.count >= 3 && sh.count % 8 != 0 && ((sh.count + 7) / 8) % 8 != 0)
      break;
    pos += sizeof sh + sh.payload_bytes;
  }
  const std::size_t pl = pos + sizeof sh;
  const std::size_t idx_at = pl + 8, bits_at = idx_at + gravac::pad8(sh.count * 4);
  auto with = [&](auto edit) {
    auto b = good;
    edit(b);
    return b;
  };
  check(with([&](auto& b) { put(b, idx_at, static_cast<std::uint32_t>(sh.numel)); }), "index out of range");
  check(with([&](auto& b) {
          std::uint32_t i1;
          std::memcpy(&i1, b.data() + idx_at + 4, 4);
          put(b, idx_at + 8, i1);
        }),
        "repeated index");
  check(with([&](auto& b) { put(b, pl, std::numeric_limits<float>::quiet_NaN()); }), "NaN scale");
  check(with([&](auto& b) { put(b, pl, std::numeric_limits<float>::infinity()); }), "infinite scale");
  check(with([&](auto& b) { put(b, pl, -1.0f); }), "negative scale");
  check(with([&](auto& b) { put(b, pl + 4, std::uint32_t{0}); }), "zero bin length");
  check(with([&](auto& b) { b[pos + 4] = std::byte{8}; }), "index width 8");
  check(with([&](auto& b) { b[pos + 5] = std::byte{1}; }), "unknown encoding");
  check(with([&](auto& b) { put(b, pos + 16, std::uint64_t{sh.count + 1}); }), "count larger than the payload");
  check(with([&](auto& b) { put(b, pos + 16, std::uint64_t{sh.numel + 1}); }), "count exceeds numel");
  check(with([&](auto& b) { b[bits_at + sh.count / 8] |= std::byte{0x80}; }), "padding bit of the signs set");
  check(with([&](auto& b) { b[bits_at + gravac::pad8((sh.count + 7) / 8) - 1] = std::byte{1}; }),
        "padding byte of the signs set");
  {
    auto b = good;
    put(b, offsetof(gravac::packet_header, layout_hash), std::uint64_t{0});
    check(b, "layout hash");
  }
}

TEST_CASE("adacomp_cuda: invalid options and buffers are rejected before anything is touched") {
  const auto lay = ada_layout();
  gravac::adacomp_cuda_options bad;
  bad.bins.dense_bin = 0;
  CHECK_THROWS_AS(gravac::adacomp_cuda(lay, bad), gravac::error);
  gravac::adacomp_cuda c(lay);
  gravac::device_buffer<float> g(lay.numel()), e(lay.numel());
  gravac::device_buffer<std::byte> small(64);
  gravac::compress_stats st;
  const auto p = gravac::test::params_for(lay, 0.5);
  CHECK_THROWS_AS(c.compress(gravac::device_view(g), gravac::device_view(e), p, small.span(), st), gravac::error);
  gravac::device_buffer<std::byte> out(c.max_packet_bytes());
  gravac::device_buffer<float> short_g(lay.numel() - 1);
  CHECK_THROWS_AS(c.compress(gravac::device_view(short_g), gravac::device_view(e), p, out.span(), st), gravac::error);
}

TEST_CASE("topk_cuda whole_buffer selects exactly what topk whole_buffer selects") {
  auto lay = ada_layout();
  const double fractions[] = {0.0, 1e-5, 0.001, 0.01, 0.1, 0.3, 0.5, 0.9, 1.0};
  const distribution dists[] = {distribution::gaussian, distribution::laplace, distribution::all_equal,
                                distribution::narrow};
  for (auto f : fractions)
    for (auto d : dists)
      for (bool some_dense : {false, true}) {
        INFO("global fraction " << f << ", distribution " << static_cast<int>(d) << ", dense layers " << some_dense);
        auto r = make_whole(lay);
        auto p = gravac::test::params_for(r.lay, 0.5);
        p.global_fraction = f;
        if (some_dense) {  // between compressed layers: the concatenation skips them
          p.kept_fraction[1] = 1.0;
          p.kept_fraction[6] = 1.0;
        }
        // The first step has no previous threshold, the second reuses it, the third misses.
        r.step(gravac::test::make_data(r.lay.numel(), 61, d), p);
        r.step(gravac::test::make_data(r.lay.numel(), 62, d), p);
        r.step(scaled(gravac::test::make_data(r.lay.numel(), 63, d), 1e-3f), p);
      }
}

TEST_CASE("topk_cuda whole_buffer: k over many sizes, one layer to many") {
  for (std::size_t n : {std::size_t{1}, std::size_t{2}, std::size_t{33}, std::size_t{4097}, std::size_t{65539},
                        (std::size_t{1} << 22) + 5}) {
    for (std::size_t parts : {std::size_t{1}, std::size_t{3}, std::size_t{17}}) {
      gravac::layout lay;
      for (std::size_t q = 0; q < parts; ++q) {
        const std::size_t lo = n * q / parts, hi = n * (q + 1) / parts;
        lay.add("part" + std::to_string(q), {hi - lo}, gravac::layer_kind::dense);
      }
      for (double f : {0.001, 0.01, 0.25}) {
        INFO("n = " << n << ", layers = " << parts << ", fraction = " << f);
        auto r = make_whole(lay);
        const auto p = gravac::test::params_for(r.lay, f);
        r.step(gravac::test::make_data(n, 71, distribution::laplace), p);
        r.step(gravac::test::make_data(n, 72, distribution::gaussian), p);
      }
    }
  }
}

TEST_CASE("topk_cuda whole_buffer: ties across layers go to the earlier layer, then the lower index") {
  gravac::layout lay;
  lay.add("a", {1001}, gravac::layer_kind::dense);
  lay.add("b", {64}, gravac::layer_kind::bias_or_norm);
  lay.add("c", {5003}, gravac::layer_kind::conv);
  lay.add("d", {999}, gravac::layer_kind::dense);
  std::vector<float> g(lay.numel());
  for (std::size_t i = 0; i < g.size(); ++i) g[i] = (i % 7 == 0 ? -1.0f : 1.0f) * static_cast<float>(1 + i % 4);
  for (double f : {0.05, 0.2, 0.25, 0.5, 0.77}) {
    INFO("fraction " << f);
    auto r = make_whole(lay);
    auto p = gravac::test::params_for(r.lay, f);
    r.step(g, p);
    p.kept_fraction[2] = 1.0;
    r.step(g, p);
  }
}

TEST_CASE("topk_cuda whole_buffer: non-finite values are never selected; fewer finite values than k") {
  auto lay = ada_layout();
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  for (double f : {0.01, 0.99}) {
    INFO("fraction " << f);
    auto r = make_whole(lay);
    auto g = gravac::test::make_data(lay.numel(), 81);
    for (std::size_t i = 0; i < g.size(); i += 3) g[i] = (i % 2) ? inf : nan;
    r.step(g, gravac::test::params_for(r.lay, f));
    r.step(gravac::test::make_data(lay.numel(), 82), gravac::test::params_for(r.lay, f));
  }
}

TEST_CASE("topk_cuda whole_buffer: gain curve and validation of its packets") {
  auto lay = ada_layout();
  auto r = make_whole(lay);
  auto p = gravac::test::params_for(r.lay, 0.02);
  p.kept_fraction[2] = 1.0;
  const double candidates[] = {0.1, 0.01};
  p.gain_candidates.assign(std::begin(candidates), std::end(candidates));
  for (std::uint64_t s = 0; s < 2; ++s) r.step(gravac::test::make_data(lay.numel(), 91 + s), p);
  REQUIRE(r.dev.validate(r.packet_dev.span().first(r.bytes)));
}
