// adacomp_cuda against the CPU gravac::adacomp, and topk_cuda with whole_buffer against
// gravac::topk with whole_buffer, on the same data: packets equal byte for byte, residuals
// equal bit for bit (several steps, so the residue carries over), statistics close; device
// validation and decoding against the host's. And AR-Topk (allreduce_compatible) on the
// device against the host's with topk / threshold: the same indices, averaged gradients and
// residuals bit for bit, STAR and VAR, ties included; the device's validation of a bad
// index list; trainer<topk_cuda, allreduce_compatible, moo_policy> (the design card's line)
// against trainer<topk, allreduce_compatible, moo_policy>. Skipped without a GPU.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "cuda_test_util.hpp"
#include "gravac/collective/allreduce_compatible.hpp"
#include "gravac/collective/flexible.hpp"
#include "gravac/compress/adacomp.hpp"
#include "gravac/compress/threshold.hpp"
#include "gravac/compress/topk.hpp"
#include "gravac/cuda/adacomp_cuda.hpp"
#include "gravac/cuda/threshold_cuda.hpp"
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
template <class Host, class Dev, bool ExactNorms = true>
using pair_run = gravac::test::pair_run<Host, Dev, ExactNorms>;

using ada_pair = pair_run<gravac::adacomp, gravac::adacomp_cuda>;
using whole_pair = pair_run<gravac::topk, gravac::topk_cuda>;

ada_pair make_ada(gravac::layout lay, gravac::adacomp_options bins = {}) {
  gravac::adacomp_cuda_options d;
  d.bins = bins;
  ada_pair r(std::move(lay), bins, d);
  return r;
}
// Both sides get the same step settings (the bin length per layer; 0: the option of the kind).
void set_bins(ada_pair& r, const std::vector<std::uint32_t>& bins) {
  r.host.set_step_settings({.bin_length = bins});
  r.dev.set_step_settings({.bin_length = bins});
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
      set_bins(r, std::vector<std::uint32_t>(r.lay.size(), bin));  // 0: the option of the layer's kind
      // Several steps: the residue carries over, and a jump in scale changes every bin.
      r.step(gravac::test::make_data(r.lay.numel(), 1, d), p);
      r.step(gravac::test::make_data(r.lay.numel(), 2, d), p);
      r.step(scaled(gravac::test::make_data(r.lay.numel(), 3, d), 1e-3f), p);
    }
}

// A small case for compute-sanitizer (scripts/gpu-check): bins that leave a partial bin.
TEST_CASE("adacomp_cuda: partial bins, small (compute-sanitizer)", "[sanitize]") {
  for (std::uint32_t bin : {7u, 33u}) {
    INFO("bin override " << bin);
    auto r = make_ada(ada_layout());
    auto p = gravac::test::params_for(r.lay, 0.5);
    set_bins(r, std::vector<std::uint32_t>(r.lay.size(), bin));
    r.step(gravac::test::make_data(r.lay.numel(), 1, distribution::gaussian), p);
    r.step(gravac::test::make_data(r.lay.numel(), 2, distribution::gaussian), p);
  }
}

TEST_CASE("adacomp_cuda: other bin options, and per-layer bin lengths from the policy") {
  auto r = make_ada(ada_layout(), {.conv_bin = 9, .dense_bin = 1000, .bias_bin = 3});
  auto p = gravac::test::params_for(r.lay, 0.5);
  for (std::uint64_t s = 0; s < 2; ++s) r.step(gravac::test::make_data(r.lay.numel(), 5 + s), p);
  std::vector<std::uint32_t> bins(r.lay.size(), 0);
  bins[0] = 4;
  bins[6] = 1;  // shorter than any bin seen: the bin maxima grow once
  set_bins(r, bins);
  for (std::uint64_t s = 0; s < 2; ++s) r.step(gravac::test::make_data(r.lay.numel(), 7 + s), p);
}

TEST_CASE("adacomp_cuda at 2^22 + 5 and 2^26 values matches adacomp") {
  const std::size_t largest = gravac::test::device_size(std::size_t{1} << 26);
  for (std::size_t n : {gravac::test::device_size((std::size_t{1} << 22) + 5), largest}) {
    gravac::layout lay;
    lay.add("conv", {n}, gravac::layer_kind::conv);
    auto r = make_ada(lay);
    auto p = gravac::test::params_for(r.lay, 0.5);
    INFO("n = " << n);
    r.step(gravac::test::make_data(n, 11, distribution::laplace), p);
    if (n < largest) {
      r.step(gravac::test::make_data(n, 12, distribution::gaussian), p);
      set_bins(r, {500});
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

TEST_CASE("adacomp_cuda and whole-buffer topk_cuda: same data, same statistics bit for bit, whatever the block order",
          "[same_bits]") {
  auto lay = ada_layout();
  lay.add("big", {300000}, gravac::layer_kind::dense);
  auto p = gravac::test::params_for(lay, 0.05);
  p.kept_fraction[1] = 1.0;  // a layer sent raw
  const double candidates[] = {0.5, 0.1, 0.01, 0.001};
  p.gain_candidates.assign(std::begin(candidates), std::end(candidates));
  SECTION("adacomp_cuda") {
    gravac::adacomp_cuda_options o;
    gravac::test::device_twins<gravac::adacomp_cuda> t(lay, o);
    for (std::uint64_t s = 0; s < 3; ++s) t.step(gravac::test::make_data(lay.numel(), 61 + s), p);
  }
  SECTION("topk_cuda whole_buffer") {
    gravac::topk_cuda_options o;
    o.whole_buffer = true;
    gravac::test::device_twins<gravac::topk_cuda> t(lay, o);
    for (std::uint64_t s = 0; s < 3; ++s) t.step(gravac::test::make_data(lay.numel(), 71 + s), p);
  }
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
                        gravac::test::device_size((std::size_t{1} << 22) + 5)}) {
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

// ---- AR-Topk on the device ---------------------------------------------------------------

namespace {

// One process, one rank, over device memory: AR-Topk with one rank calls no collective.
// With rank_ 1 of size_ 2 it plays a non-root rank whose broadcast delivers \p bad_index
// at the first entry (the root's list made invalid), to test the device's validation.
struct fake_device_comm {
  using communicator_tag = void;
  using memory_space = gravac::cuda_space;
  using byte_buffer = gravac::device_byte_buffer;
  int rank_ = 0, size_ = 1;
  std::uint32_t bad_index = 0;
  int rank() const { return rank_; }
  int size() const { return size_; }
  void allreduce_sum(std::span<float>) {}
  void allreduce_sum(std::span<double>) {}
  void allreduce_max(std::span<double>) {}
  void allgatherv(std::span<const std::byte> in, byte_buffer& out, std::vector<std::size_t>& sizes) {
    out.resize(in.size());
    // Default: the trainer's layout check passes host bytes, the collectives device bytes.
    if (!in.empty()) GRAVAC_TRY_CUDA(cudaMemcpy(out.data(), in.data(), in.size(), cudaMemcpyDefault));
    sizes.assign(1, in.size());
  }
  void broadcast(std::span<std::byte> d, int) {
    // Every entry 0: not strictly increasing (and bad_index at the first, out of range).
    GRAVAC_TRY_CUDA(cudaMemset(d.data(), 0, d.size()));
    if (d.size() >= sizeof bad_index)
      GRAVAC_TRY_CUDA(cudaMemcpy(d.data(), &bad_index, sizeof bad_index, cudaMemcpyHostToDevice));
  }
  void barrier() {}
};
static_assert(gravac::Communicator<fake_device_comm>);

// One host rank (the reference; AR-Topk with one rank calls no collective).
struct one_rank_host_comm {
  using communicator_tag = void;
  using memory_space = gravac::host_space;
  using byte_buffer = std::vector<std::byte>;
  int rank() const { return 0; }
  int size() const { return 1; }
  void allreduce_sum(std::span<float>) {}
  void allreduce_sum(std::span<double>) {}
  void allreduce_max(std::span<double>) {}
  void allgatherv(std::span<const std::byte> in, byte_buffer& out, std::vector<std::size_t>& sizes) {
    out.assign(in.begin(), in.end());
    sizes.assign(1, in.size());
  }
  void broadcast(std::span<std::byte>, int) {}
  void barrier() {}
};
static_assert(gravac::Communicator<one_rank_host_comm>);

// A layout with ties: mixed_layout, a large layer, and one whose values are few distinct
// magnitudes (the k-th largest has many copies on both sides of the boundary).
gravac::layout ar_layout() {
  auto lay = gravac::test::mixed_layout();
  lay.add("big", {100003}, gravac::layer_kind::conv);
  lay.add("ties", {4099}, gravac::layer_kind::dense);
  return lay;
}
// Gradients rounded to quarters (ties everywhere), signed zeros, and one all-equal layer.
std::vector<float> ar_data(const gravac::layout& lay, std::uint64_t seed) {
  auto g = gravac::test::make_data(lay.numel(), seed, seed % 2 ? distribution::laplace : distribution::gaussian);
  for (auto& x : g) x = std::round(x * 4.0f) / 4.0f;  // many exact ties, -0.0f among them
  const auto& t = lay[lay.size() - 1];
  for (std::size_t j = 0; j < t.numel; ++j) g[t.offset + j] = j % 3 == 0 ? 0.5f : -0.5f;
  return g;
}

// Host AR-Topk with HostC and device AR-Topk with DevC, stepped together: the hook's indices
// on the same u, then the averaged gradient, the residual (and after return_sent the
// residual again) bit for bit, the counts equal and the norms close.
template <class HostC, class DevC>
void ar_topk_pair(gravac::index_rank_rule rule, bool gain) {
  const auto lay = ar_layout();
  gravac::allreduce_compatible kh(lay, {rule}), kd(lay, {rule});
  HostC ch(lay);
  DevC cd(lay);
  kh.prepare(ch);
  kd.prepare(cd);
  one_rank_host_comm host_comm;
  fake_device_comm dev_comm;
  std::vector<float> eh(lay.numel(), 0.0f);
  gravac::device_buffer<float> ed(lay.numel());
  for (std::uint64_t s = 0; s < 4; ++s) {
    INFO("step " << s);
    auto p = gravac::test::params_for(lay, s % 2 ? 0.05 : 0.011, s);
    p.kept_fraction[1] = 1.0;  // one layer sent dense
    if (gain) p.gain_candidates = {0.1, 0.01, 0.001};
    const auto g0 = ar_data(lay, 900 + s);
    // The hook on the same u (g + e as both hold it now): the same indices.
    {
      std::vector<float> u(lay.numel());
      for (std::size_t j = 0; j < u.size(); ++j) u[j] = g0[j] + eh[j];
      auto ud = to_device(u);
      std::vector<std::uint64_t> want, scratch;
      for (std::size_t i = 0; i < lay.size(); ++i) {
        const auto& l = lay[i];
        const std::size_t k = gravac::kept_count(l.numel, p.kept_fraction[i]);
        if (k == 0) continue;
        INFO("layer " << l.name);
        ch.select_indices(std::span<const float>(u.data() + l.offset, l.numel), i, p, want, scratch);
        gravac::device_buffer<std::uint32_t> got_d(k);
        cd.select_indices(gravac::grad_view<gravac::cuda_space>(ud.data() + l.offset, l.numel), i, p, got_d.data());
        cd.finish_selection();
        const auto got = to_host(got_d.data(), k);
        REQUIRE(want.size() == k);
        REQUIRE(std::equal(got.begin(), got.end(), want.begin()));
      }
    }
    std::vector<float> gh = g0;
    auto gd = to_device(g0);
    gravac::step_buffers<gravac::host_space> bh{gravac::host_view(gh), gravac::host_view(eh), s == 0};
    gravac::step_buffers<gravac::cuda_space> bd{gravac::device_view(gd), gravac::device_view(ed), s == 0};
    gravac::compress_stats sh, sd;
    gravac::step_report rh, rd;
    kh.aggregate(ch, host_comm, bh, p, sh, rh);
    kd.aggregate(cd, dev_comm, bd, p, sd, rd);
    CHECK(kd.last_index_count() == kh.last_index_count());
    CHECK(kd.last_value_count() == kh.last_value_count());
    CHECK(kd.last_root() == kh.last_root());
    CHECK(rd.bytes_sent == rh.bytes_sent);
    const auto g_back = to_host(gd.data(), lay.numel());
    const auto e_back = to_host(ed.data(), lay.numel());
    REQUIRE(same_words(g_back.data(), gh.data(), gh.size() * sizeof(float), false));
    REQUIRE(same_words(e_back.data(), eh.data(), eh.size() * sizeof(float), false));
    CHECK(sd.non_finite == sh.non_finite);
    for (std::size_t i = 0; i < lay.size(); ++i) {
      INFO("layer " << i);
      CHECK(sd.layers[i].kept == sh.layers[i].kept);
      // The norms are summed in one tree on both sides (core/detail/square_sum.hpp): equal bits.
      CHECK(gravac::test::same_bits(sd.layers[i].grad_sq, sh.layers[i].grad_sq));
      CHECK(gravac::test::same_bits(sd.layers[i].input_sq, sh.layers[i].input_sq));
      CHECK(gravac::test::same_bits(sd.layers[i].kept_sq, sh.layers[i].kept_sq));
    }
    // The host's accumulate histograms every value: the gain curve is equal too.
    for (std::size_t c = 0; c < p.gain_candidates.size(); ++c)
      CHECK(gravac::test::same_bits(sd.candidate_kept_sq[c], sh.candidate_kept_sq[c]));
    if (s == 3) {  // the step abandoned: both residuals hold all of u again
      kh.return_sent(ch, bh);
      kd.return_sent(cd, bd);
      const auto e_undone = to_host(ed.data(), lay.numel());
      REQUIRE(same_words(e_undone.data(), eh.data(), eh.size() * sizeof(float), false));
    }
  }
}

}  // namespace

TEST_CASE("allreduce_compatible on the device: same data, same statistics bit for bit, whatever the block order",
          "[same_bits]") {
  // Two device runs of AR-Topk on one rank: the averaged gradient, the residual and the
  // statistics (the kept energy is a sum over the gather's blocks) repeat bit for bit.
  const auto lay = ar_layout();
  struct run {
    gravac::allreduce_compatible k;
    gravac::topk_cuda c;
    gravac::device_buffer<float> e;
  };
  run a{gravac::allreduce_compatible(lay, {gravac::index_rank_rule::var}), gravac::topk_cuda(lay),
        gravac::device_buffer<float>(lay.numel())};
  run b{gravac::allreduce_compatible(lay, {gravac::index_rank_rule::var}), gravac::topk_cuda(lay),
        gravac::device_buffer<float>(lay.numel())};
  a.k.prepare(a.c);
  b.k.prepare(b.c);
  fake_device_comm comm;
  for (std::uint64_t s = 0; s < 3; ++s) {
    INFO("step " << s);
    auto p = gravac::test::params_for(lay, 0.02, s);
    p.kept_fraction[1] = 1.0;  // one layer sent dense
    p.gain_candidates = {0.1, 0.01, 0.001};
    const auto g0 = gravac::test::make_data(lay.numel(), 950 + s);
    auto step = [&](run& r, gravac::compress_stats& st) {
      auto gd = to_device(g0);
      gravac::step_buffers<gravac::cuda_space> buf{gravac::device_view(gd), gravac::device_view(r.e), s == 0};
      gravac::step_report rep;
      r.k.aggregate(r.c, comm, buf, p, st, rep);
      return to_host(gd.data(), lay.numel());
    };
    gravac::compress_stats sa, sb;
    const auto ga = step(a, sa), gb = step(b, sb);
    REQUIRE(same_words(ga.data(), gb.data(), ga.size() * sizeof(float), false));
    const auto ea = to_host(a.e.data(), lay.numel()), eb = to_host(b.e.data(), lay.numel());
    REQUIRE(same_words(ea.data(), eb.data(), ea.size() * sizeof(float), false));
    gravac::test::require_same_statistics(sa, sb);
  }
}

TEST_CASE("allreduce_compatible on the device equals the host's: topk_cuda, STAR and VAR, ties included") {
  ar_topk_pair<gravac::topk, gravac::topk_cuda>(gravac::index_rank_rule::star, false);
  ar_topk_pair<gravac::topk, gravac::topk_cuda>(gravac::index_rank_rule::var, true);
}

TEST_CASE("allreduce_compatible on the device equals the host's: threshold_cuda, STAR and VAR, ties included") {
  ar_topk_pair<gravac::threshold, gravac::threshold_cuda>(gravac::index_rank_rule::star, true);
  ar_topk_pair<gravac::threshold, gravac::threshold_cuda>(gravac::index_rank_rule::var, false);
}

// The index list AR-Topk's root sends, computed plainly: the k largest finite |u| (ties to
// the lower index), or, with fewer than k finite values, every finite one and the lowest
// non-finite indices; ascending.
static std::vector<std::uint32_t> reference_list(const float* u, std::size_t n, std::size_t k) {
  std::vector<std::uint32_t> finite, non_finite;
  for (std::size_t i = 0; i < n; ++i)
    (std::isfinite(u[i]) ? finite : non_finite).push_back(static_cast<std::uint32_t>(i));
  std::vector<std::uint32_t> list;
  if (finite.size() >= k) {
    std::stable_sort(finite.begin(), finite.end(),
                     [&](std::uint32_t a, std::uint32_t b) { return std::fabs(u[a]) > std::fabs(u[b]); });
    list.assign(finite.begin(), finite.begin() + static_cast<std::ptrdiff_t>(k));
  } else {
    list = finite;
    list.insert(list.end(), non_finite.begin(), non_finite.begin() + static_cast<std::ptrdiff_t>(k - finite.size()));
  }
  std::sort(list.begin(), list.end());
  return list;
}

TEST_CASE("topk_cuda select_indices: every layer's list in one batch, non-finite values and out-of-order calls") {
  const auto lay = ar_layout();
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  auto u = ar_data(lay, 31);
  // Layer 0: more non-finite values than its k leaves room for; layer 2: a few, k is met.
  for (std::size_t j = 0; j < lay[0].numel; j += 2) u[lay[0].offset + j] = j % 4 ? inf : nan;
  for (std::size_t j = 0; j < lay[2].numel; j += 97) u[lay[2].offset + j] = -inf;
  auto ud = to_device(u);
  auto p = gravac::test::params_for(lay, 0.6);
  p.kept_fraction[1] = 0.003;
  gravac::topk_cuda cd(lay);
  for (const bool reversed : {false, true}) {
    INFO((reversed ? "layers listed last to first" : "layers listed in order"));
    std::vector<gravac::device_buffer<std::uint32_t>> lists;
    std::vector<std::size_t> order;
    for (std::size_t i = 0; i < lay.size(); ++i)
      if (gravac::kept_count(lay[i].numel, p.kept_fraction[i]) > 0) order.push_back(i);
    if (reversed) std::reverse(order.begin(), order.end());
    for (std::size_t i : order) {
      lists.emplace_back(gravac::kept_count(lay[i].numel, p.kept_fraction[i]));
      cd.select_indices(gravac::grad_view<gravac::cuda_space>(ud.data() + lay[i].offset, lay[i].numel), i, p,
                        lists.back().data());
    }
    cd.finish_selection();
    for (std::size_t q = 0; q < order.size(); ++q) {
      const auto& l = lay[order[q]];
      INFO("layer " << l.name);
      const std::size_t k = gravac::kept_count(l.numel, p.kept_fraction[order[q]]);
      CHECK(to_host(lists[q].data(), k) == reference_list(u.data() + l.offset, l.numel, k));
    }
  }
}

TEST_CASE("allreduce_compatible on the device: a bad index list from the root throws, the residual keeps u") {
  const auto lay = ar_layout();
  for (std::uint32_t bad : {0u, 0xffffffffu}) {  // not increasing; out of range
    INFO("first index " << bad);
    gravac::allreduce_compatible k(lay);
    gravac::topk_cuda c(lay);
    k.prepare(c);
    fake_device_comm comm;
    comm.rank_ = 1;  // step 0's root (STAR) is rank 0: this rank receives its list
    comm.size_ = 2;
    comm.bad_index = bad;
    const auto g0 = ar_data(lay, 5);
    const auto e0 = gravac::test::make_data(lay.numel(), 6);
    auto gd = to_device(g0);
    auto ed = to_device(e0);
    gravac::step_buffers<gravac::cuda_space> b{gravac::device_view(gd), gravac::device_view(ed), false};
    gravac::compress_stats st;
    gravac::step_report r;
    const auto p = gravac::test::params_for(lay, 0.05, 0);
    try {
      k.aggregate(c, comm, b, p, st, r);
      FAIL("no error");
    } catch (const gravac::error& err) {
      CHECK(err.code() == gravac::status::malformed_packet);
      CHECK(err.rank() == 0);
      CHECK(std::string(err.what()).find("rank 0") != std::string::npos);
    }
    std::vector<float> u(lay.numel());
    for (std::size_t j = 0; j < u.size(); ++j) u[j] = g0[j] + e0[j];
    const auto e_back = to_host(ed.data(), lay.numel());
    REQUIRE(same_words(e_back.data(), u.data(), u.size() * sizeof(float), false));
  }
}

TEST_CASE(
    "trainer<topk_cuda, allreduce_compatible, moo_policy> equals trainer<topk, allreduce_compatible, "
    "moo_policy>") {
  const auto lay = ar_layout();
  gravac::moo_policy_options pol;
  pol.warmup_steps = 6;  // the warm-up's fractions: the same on both, whatever the timings
  pol.warmup_start = 0.3;
  pol.warmup_end = 0.02;
  std::vector<std::vector<float>> host_out;
  {
    one_rank_host_comm comm;
    gravac::trainer<gravac::topk, gravac::allreduce_compatible, gravac::moo_policy> t(comm, lay,
                                                                                      {.policy = pol, .seed = 3});
    for (std::uint64_t s = 0; s < 4; ++s) {
      auto g = ar_data(lay, 300 + s);
      t.step(std::span<float>(g));
      host_out.push_back(g);
    }
  }
  fake_device_comm comm;
  gravac::trainer<gravac::topk_cuda, gravac::allreduce_compatible, gravac::moo_policy> t(comm, lay,
                                                                                         {.policy = pol, .seed = 3});
  for (std::uint64_t s = 0; s < 4; ++s) {
    INFO("step " << s);
    auto g = to_device(ar_data(lay, 300 + s));
    const auto& rep = t.step(gravac::grad_view<gravac::cuda_space>(g.data(), lay.numel()));
    CHECK(rep.collective == gravac::collective_kind::allreduce_compatible);
    const auto back = to_host(g.data(), lay.numel());
    REQUIRE(same_words(back.data(), host_out[s].data(), back.size() * sizeof(float), false));
  }
}

TEST_CASE("flexible's AR-Topk path on the device equals the host's (topk_cuda against topk)") {
  const auto lay = ar_layout();
  gravac::flexible kh(lay), kd(lay);
  gravac::topk ch(lay);
  gravac::topk_cuda cd(lay);
  kh.prepare(ch);
  kd.prepare(cd);
  one_rank_host_comm host_comm;
  fake_device_comm dev_comm;
  std::vector<float> eh(lay.numel(), 0.0f);
  gravac::device_buffer<float> ed(lay.numel());
  for (std::uint64_t s = 0; s < 3; ++s) {
    INFO("step " << s);
    auto p = gravac::test::params_for(lay, 0.02, s);
    p.collective = gravac::collective_kind::allreduce_compatible;  // the path under test, whatever the costs
    const auto g0 = ar_data(lay, 700 + s);
    std::vector<float> gh = g0;
    auto gd = to_device(g0);
    gravac::step_buffers<gravac::host_space> bh{gravac::host_view(gh), gravac::host_view(eh), s == 0};
    gravac::step_buffers<gravac::cuda_space> bd{gravac::device_view(gd), gravac::device_view(ed), s == 0};
    gravac::compress_stats sh, sd;
    gravac::step_report rh, rd;
    kh.aggregate(ch, host_comm, bh, p, sh, rh);
    kd.aggregate(cd, dev_comm, bd, p, sd, rd);
    CHECK(rd.collective == gravac::collective_kind::allreduce_compatible);
    const auto g_back = to_host(gd.data(), lay.numel());
    const auto e_back = to_host(ed.data(), lay.numel());
    REQUIRE(same_words(g_back.data(), gh.data(), gh.size() * sizeof(float), false));
    REQUIRE(same_words(e_back.data(), eh.data(), eh.size() * sizeof(float), false));
  }
}
