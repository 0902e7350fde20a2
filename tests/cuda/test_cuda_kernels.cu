// topk_cuda against the CPU gravac::topk on the same data: packets equal byte for byte
// (selection, values, ties to the lower index, padding), residuals equal bit for bit,
// statistics and the gain curve close; device validation and scatter-add against the
// host's. Sizes 1 .. 2^26, many fractions, adversarial data. Skipped without a GPU.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "cuda_test_util.hpp"
#include "gravac/compress/threshold.hpp"
#include "gravac/compress/topk.hpp"
#include "gravac/cuda/threshold_cuda.hpp"
#include "gravac/cuda/topk_cuda.hpp"
#include "gravac_test_util.hpp"

namespace {

using gravac::test::device_size;
using gravac::test::distribution;
using gravac::test::same_words;
using gravac::test::scaled;
using gravac::test::to_device;
using gravac::test::to_host;

// One layout, one host and one device compressor, and their buffers, stepped together:
// packets and residuals identical, statistics close, and (stricter than the default) no
// norm may be NaN.
template <class Host, class Dev>
struct pair_run_t : gravac::test::pair_run<Host, Dev> {
  explicit pair_run_t(gravac::layout l) : gravac::test::pair_run<Host, Dev>(std::move(l)) {
    this->nan_norms_equal = false;
  }
};

using pair_run = pair_run_t<gravac::topk, gravac::topk_cuda>;
using threshold_pair = pair_run_t<gravac::threshold, gravac::threshold_cuda>;

}  // namespace

TEST_CASE("topk_cuda selects exactly what topk selects, for sizes 1 .. 2^22 and all fractions") {
  const std::size_t sizes[] = {1, 2, 3, 31, 32, 33, 1000, 4097, 65539, device_size(1u << 20), device_size((1u << 22) + 5)};
  const double fractions[] = {0.0, 1e-6, 0.001, 0.01, 0.1, 0.3, 0.5, 0.9, 0.999999, 1.0};
  const distribution dists[] = {distribution::gaussian, distribution::laplace, distribution::all_equal,
                                distribution::narrow};
  for (auto n : sizes)
    for (auto d : dists)
      for (auto f : fractions) {
        if (n >= device_size(1u << 20) && (f == 1e-6 || f == 0.999999 || f == 0.3)) continue;  // keep the run short
        INFO("n = " << n << ", fraction = " << f << ", distribution = " << static_cast<int>(d));
        pair_run r(gravac::layout::flat(n));
        const auto p = gravac::test::params_for(r.lay, f);
        // Three steps: the first without a previous threshold, the second reuses it (the
        // candidate buffer hits), the third jumps in scale (the candidate buffer misses).
        r.step(gravac::test::make_data(n, 11, d), p);
        r.step(gravac::test::make_data(n, 12, d), p);
        r.step(scaled(gravac::test::make_data(n, 13, d), 1e-3f), p);
      }
}

TEST_CASE("topk_cuda at 2^26 values matches topk at 1% and 0.1%") {
  const std::size_t n = device_size(std::size_t{1} << 26);
  for (double f : {0.01, 0.001}) {
    INFO("fraction = " << f);
    pair_run r(gravac::layout::flat(n));
    const auto p = gravac::test::params_for(r.lay, f);
    r.step(gravac::test::make_data(n, 21, distribution::gaussian), p);
    r.step(gravac::test::make_data(n, 22, distribution::laplace), p);
  }
}

TEST_CASE("topk_cuda: ties go to the lower index (many equal magnitudes at the boundary)") {
  const std::size_t n = 100003;
  std::vector<float> g(n);
  for (std::size_t i = 0; i < n; ++i) g[i] = (i % 7 == 0 ? -1.0f : 1.0f) * static_cast<float>(1 + i % 5);
  for (double f : {0.05, 0.2, 0.21, 0.5, 0.77}) {
    pair_run r(gravac::layout::flat(n));
    r.step(g, gravac::test::params_for(r.lay, f));
  }
}

TEST_CASE("topk_cuda: mixed layout, dense layers, gain curve") {
  auto lay = gravac::test::mixed_layout();
  lay.add("big", {300000}, gravac::layer_kind::dense);
  pair_run r(lay);
  auto p = gravac::test::params_for(r.lay, 0.05);
  p.kept_fraction[1] = 1.0;  // a layer sent dense
  const double candidates[] = {0.5, 0.1, 0.01, 0.001};
  p.gain_candidates.assign(std::begin(candidates), std::end(candidates));
  for (std::uint64_t s = 0; s < 3; ++s) r.step(gravac::test::make_data(r.lay.numel(), 31 + s), p);
}

TEST_CASE("topk_cuda: infinities and NaNs are never selected and are reported") {
  const std::size_t n = 5000;
  auto g = gravac::test::make_data(n, 41);
  g[10] = std::numeric_limits<float>::infinity();
  g[20] = -std::numeric_limits<float>::infinity();
  g[30] = std::numeric_limits<float>::quiet_NaN();
  pair_run r(gravac::layout::flat(n));
  r.nan_norms_equal = true;  // the planted values make both sides' norms NaN
  r.step(g, gravac::test::params_for(r.lay, 0.01));
}

TEST_CASE("topk_cuda: a layer with fewer finite values than k sends them all; the others are intact") {
  // Layers before and after the short one prove that its smaller segment does not shift
  // theirs, and that no residual is corrupted (the packet and every residual equal the host's).
  gravac::layout lay;
  lay.add("before", {3000}, gravac::layer_kind::dense);
  lay.add("short", {200}, gravac::layer_kind::dense);       // 3 finite values, k = 100
  lay.add("none", {64}, gravac::layer_kind::bias_or_norm);  // no finite value at all
  lay.add("exact", {100}, gravac::layer_kind::dense);       // exactly k finite values
  lay.add("after", {70001}, gravac::layer_kind::conv);
  pair_run r(lay);
  r.nan_norms_equal = true;  // the planted values make both sides' norms NaN in their layers
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  for (std::uint64_t step = 0; step < 3; ++step) {
    auto g = gravac::test::make_data(lay.numel(), 61 + step);
    const auto& s = lay[1];
    for (std::size_t j = 0; j < s.numel; ++j) g[s.offset + j] = (j % 2) ? inf : -nan;
    g[s.offset + 5] = 1.5f;
    g[s.offset + 77] = -0.25f;
    g[s.offset + 199] = 3.0f;
    for (std::size_t j = 0; j < lay[2].numel; ++j) g[lay[2].offset + j] = j % 3 ? nan : -inf;
    for (std::size_t j = 50; j < lay[3].numel; ++j) g[lay[3].offset + j] = inf;  // 50 finite, k = 50
    auto p = gravac::test::params_for(r.lay, 0.5);
    if (step == 2) p.kept_fraction[4] = 1.0;  // and a raw layer after the short one
    r.step(g, p);
  }
}

TEST_CASE("topk_cuda: device validation agrees with the host's, and scatter-add with decompress_add") {
  auto lay = gravac::test::mixed_layout();
  pair_run r(lay);
  auto p = gravac::test::params_for(r.lay, 0.2);
  p.kept_fraction[0] = 1.0;
  r.step(gravac::test::make_data(r.lay.numel(), 51), p);
  const std::size_t bytes = r.bytes;
  std::vector<std::byte> good(r.packet_host.begin(), r.packet_host.begin() + static_cast<std::ptrdiff_t>(bytes));

  // Decompress: the same sums on host and device.
  std::vector<float> out_h(lay.numel(), 0.25f);
  r.host.decompress_add(good, gravac::host_view(out_h), 0.5f);
  auto out_d = to_device(std::vector<float>(lay.numel(), 0.25f));
  REQUIRE(r.dev.validate(r.packet_dev.span().first(bytes)));
  r.dev.decompress_add(r.packet_dev.span().first(bytes), gravac::device_view(out_d), 0.5f);
  r.dev.synchronize();
  const auto back = to_host(out_d.data(), out_d.size());
  // Equal up to the rounding of a fused multiply-add (the device contracts scale * v + o).
  REQUIRE(gravac::test::max_rel_diff(back, out_h) <= 1e-6);

  // Corruptions: the device rejects exactly what the host rejects.
  auto check = [&](std::vector<std::byte> bad, const char* what) {
    INFO(what);
    const bool host_ok = static_cast<bool>(r.host.validate(bad));
    gravac::device_buffer<std::byte> d(std::max<std::size_t>(bad.size(), 1));
    GRAVAC_TRY_CUDA(cudaMemcpy(d.data(), bad.data(), bad.size(), cudaMemcpyHostToDevice));
    const bool dev_ok = static_cast<bool>(r.dev.validate(d.span().first(bad.size())));
    CHECK(!host_ok);
    CHECK(dev_ok == host_ok);
  };
  auto flip = [&](std::size_t at, std::byte v) {
    auto b = good;
    b[at] = v;
    return b;
  };
  check(flip(0, std::byte{0}), "magic");
  check(flip(4, std::byte{9}), "version");
  check(std::vector<std::byte>(good.begin(), good.end() - 8), "truncated");
  check(std::vector<std::byte>(good.begin(), good.begin() + 16), "truncated header");
  // Find the first sparse segment and break its indices.
  std::size_t pos = sizeof(gravac::packet_header);
  gravac::segment_header sh;
  for (;;) {
    std::memcpy(&sh, good.data() + pos, sizeof sh);
    if (sh.encoding != gravac::raw_encoding && sh.count >= 2) break;
    pos += sizeof sh + sh.payload_bytes;
    REQUIRE(pos < good.size());
  }
  const std::size_t idx_at = pos + sizeof sh;
  {
    auto b = good;
    const std::uint32_t big = static_cast<std::uint32_t>(sh.numel);
    std::memcpy(b.data() + idx_at, &big, 4);
    check(b, "index out of range");
  }
  {
    auto b = good;
    std::uint32_t i0, i1;
    std::memcpy(&i0, b.data() + idx_at, 4);
    std::memcpy(&i1, b.data() + idx_at + 4, 4);
    std::memcpy(b.data() + idx_at, &i1, 4);
    std::memcpy(b.data() + idx_at + 4, &i0, 4);
    check(b, "indices not increasing");
  }
  {
    auto b = good;
    const std::uint64_t huge = sh.numel + 1;
    std::memcpy(b.data() + pos + offsetof(gravac::segment_header, count), &huge, 8);
    check(b, "count exceeds numel");
  }
  {
    auto b = good;
    std::uint64_t wrong_hash = 0;
    std::memcpy(b.data() + offsetof(gravac::packet_header, layout_hash), &wrong_hash, 8);
    check(b, "layout hash");
  }
}

TEST_CASE("device_buffer: zero-filled, grows, and storage_for<cuda_space> is it") {
  static_assert(std::is_same_v<gravac::storage_for<gravac::cuda_space>::type, gravac::device_buffer<float>>);
  gravac::device_buffer<float> b(1000);
  const auto h = to_host(b.data(), b.size());
  for (float x : h) REQUIRE(x == 0.0f);
  b.resize(10);
  REQUIRE(b.size() == 10);
  REQUIRE(b.capacity() == 1000);
  b.resize(5000);
  REQUIRE(b.capacity() >= 5000);
}

TEST_CASE("threshold_cuda sends exactly what threshold sends (the same estimate, sample and k_hat)") {
  // Small layers take the whole-layer histogram, large ones the seeded sample: both paths,
  // and the raise to the k-th largest (ties included) when the estimate collected more.
  const std::size_t sizes[] = {1, 2, 33, 1000, 4097, 65539, device_size(1u << 20), device_size((1u << 22) + 5)};
  const double fractions[] = {0.0, 0.001, 0.01, 0.1, 0.5, 1.0};
  const distribution dists[] = {distribution::gaussian, distribution::laplace, distribution::all_equal,
                                distribution::narrow};
  for (auto n : sizes)
    for (auto d : dists)
      for (auto f : fractions) {
        INFO("n = " << n << ", fraction = " << f << ", distribution = " << static_cast<int>(d));
        threshold_pair r(gravac::layout::flat(n));
        for (std::uint64_t step = 0; step < 3; ++step) {
          const auto p = gravac::test::params_for(r.lay, f, step);  // a new sample every step
          r.step(step == 2 ? scaled(gravac::test::make_data(n, 70 + step, d), 1e-3f)
                           : gravac::test::make_data(n, 70 + step, d),
                 p);
        }
      }
}

TEST_CASE("threshold_cuda at 2^26 values matches threshold at 1%, on a mixed layout with non-finite values") {
  {
    const std::size_t n = device_size(std::size_t{1} << 26);
    threshold_pair r(gravac::layout::flat(n));
    r.step(gravac::test::make_data(n, 81, distribution::laplace), gravac::test::params_for(r.lay, 0.01, 3));
  }
  auto lay = gravac::test::mixed_layout();
  lay.add("big", {300007}, gravac::layer_kind::dense);
  threshold_pair r(lay);
  r.nan_norms_equal = true;  // the planted values make both sides' norms NaN in their layers
  auto p = gravac::test::params_for(r.lay, 0.02);
  p.kept_fraction[0] = 1.0;
  const double candidates[] = {0.1, 0.01};
  p.gain_candidates.assign(std::begin(candidates), std::end(candidates));
  auto g = gravac::test::make_data(lay.numel(), 82);
  g[lay[1].offset] = std::numeric_limits<float>::infinity();
  g[lay.numel() - 1] = std::numeric_limits<float>::quiet_NaN();
  for (std::uint64_t step = 0; step < 2; ++step) r.step(g, p);
}
