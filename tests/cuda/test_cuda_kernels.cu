// topk_cuda against the CPU gravac::topk on the same data: packets equal byte for byte
// (selection, values, ties to the lower index, padding), residuals equal bit for bit,
// statistics and the gain curve close; device validation and scatter-add against the
// host's. Sizes 1 .. 2^26, many fractions, adversarial data; layouts with no layers or only
// empty ones; the compressors on a non-blocking stream of the caller's; one layer of over
// 2 GiB (hidden: [.large]). Skipped without a GPU.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <iterator>
#include <limits>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "cuda_test_util.hpp"
#include "gravac/compress/threshold.hpp"
#include "gravac/compress/topk.hpp"
#include "gravac/cuda/detail/launch.hpp"
#include "gravac/cuda/stream.hpp"
#include "gravac/cuda/threshold_cuda.hpp"
#include "gravac/cuda/topk_cuda.hpp"
#include "gravac_test_util.hpp"
#include "pairwise_cases.hpp"

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

// Calls f(size, distribution, fraction) for each case of a sweep over the three: every case
// on a GPU, a pairwise cover on the host double.
template <std::size_t S, std::size_t D, std::size_t F, class Fn>
void for_each_sweep_case(const std::size_t (&sizes)[S], const distribution (&dists)[D], const double (&fractions)[F],
                         Fn&& f) {
  for (const auto& c : gravac::test::device_sweep_cases({int{S}, int{D}, int{F}}))
    f(sizes[c[0]], dists[c[1]], fractions[c[2]]);
}

}  // namespace

TEST_CASE("topk_cuda selects exactly what topk selects, for sizes 1 .. 2^22 and all fractions") {
  const std::size_t sizes[] = {
      1, 2, 3, 31, 32, 33, 1000, 4097, 65539, device_size(1u << 20), device_size((1u << 22) + 5)};
  const double fractions[] = {0.0, 1e-6, 0.001, 0.01, 0.1, 0.3, 0.5, 0.9, 0.999999, 1.0};
  const distribution dists[] = {distribution::gaussian, distribution::laplace, distribution::all_equal,
                                distribution::narrow};
  for_each_sweep_case(sizes, dists, fractions, [&](std::size_t n, distribution d, double f) {
    INFO("n = " << n << ", fraction = " << f << ", distribution = " << static_cast<int>(d));
    pair_run r(gravac::layout::flat(n));
    const auto p = gravac::test::params_for(r.lay, f);
    // Three steps: the first without a previous threshold, the second reuses it (the
    // candidate buffer hits), the third jumps in scale (the candidate buffer misses).
    r.step(gravac::test::make_data(n, 11, d), p);
    r.step(gravac::test::make_data(n, 12, d), p);
    r.step(scaled(gravac::test::make_data(n, 13, d), 1e-3f), p);
  });
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

// The small cases scripts/gpu-check runs under compute-sanitizer (memcheck and racecheck),
// which slows a kernel by 10 to 100 times: tagged [sanitize], one each of the hard parts.
TEST_CASE("topk_cuda: ties at the boundary, small (compute-sanitizer)", "[sanitize]") {
  const std::size_t n = 4099;
  std::vector<float> g(n);
  for (std::size_t i = 0; i < n; ++i) g[i] = (i % 7 == 0 ? -1.0f : 1.0f) * static_cast<float>(1 + i % 5);
  pair_run r(gravac::layout::flat(n));
  r.step(g, gravac::test::params_for(r.lay, 0.21));
  r.step(g, gravac::test::params_for(r.lay, 0.05));
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

TEST_CASE("topk_cuda and threshold_cuda: the gain curve of layers over 2^19 values is the host's sampled curve",
          "[gain]") {
  // Above 2^19 values the host's fused pass histograms one block in 2 or 4 and takes the
  // bins above the step's sending threshold's exactly (gain_sampling.hpp); the device samples
  // the same blocks. The phase turns with the step; one large layer goes raw (exact) at step
  // 1; at step 2 an infinity stays out of the curve, and a layer whose finite values are
  // fewer than k sends them all (threshold_cuda: every value at or above its estimate).
  gravac::layout lay;
  lay.add("small", {5000}, gravac::layer_kind::dense);
  lay.add("stride4", {(std::size_t{1} << 20) + 300}, gravac::layer_kind::dense);
  lay.add("stride2", {(std::size_t{1} << 19) + 1001}, gravac::layer_kind::conv);
  REQUIRE(gravac::detail::gain_sample_stride(lay[1].numel) == 4);
  REQUIRE(gravac::detail::gain_sample_stride(lay[2].numel) == 2);
  const double candidates[] = {0.5, 0.05, 0.01, 0.001};
  const auto run = [&](auto& r) {
    r.nan_norms_equal = true;  // the infinity makes both sides' norms of its layer infinite, then NaN
    for (std::uint64_t step = 0; step < 3; ++step) {
      INFO("step " << step);
      auto p = gravac::test::params_for(lay, step % 2 ? 0.01 : 0.002, step);
      if (step == 1) p.kept_fraction[2] = 1.0;
      p.gain_candidates.assign(std::begin(candidates), std::end(candidates));
      auto g =
          gravac::test::make_data(lay.numel(), 71 + step, step % 2 ? distribution::laplace : distribution::gaussian);
      if (step == 2) {
        g[lay[1].offset + 777] = std::numeric_limits<float>::infinity();
        p.kept_fraction[2] = 0.9;
        for (std::size_t j = 0; j < lay[2].numel; j += 5)
          g[lay[2].offset + j] = std::numeric_limits<float>::quiet_NaN();
      }
      r.step(g, p);
    }
  };
  SECTION("topk_cuda") {
    pair_run r(lay);
    run(r);
  }
  SECTION("threshold_cuda") {
    threshold_pair r(lay);
    run(r);
  }
  SECTION("topk_cuda whole_buffer") {  // the sampled layers' curves wait for the global threshold
    gravac::topk_options h;
    h.whole_buffer = true;
    gravac::topk_cuda_options d;
    d.whole_buffer = true;
    gravac::test::pair_run<gravac::topk, gravac::topk_cuda> r(lay, h, d);
    run(r);
  }
}

TEST_CASE("topk_cuda and threshold_cuda: same data, same statistics bit for bit, whatever the block order",
          "[same_bits]") {
  // Several blocks per layer (the big dense layer goes raw): the norms, the kept energy and
  // the gain curve are sums over blocks, which the twins see finish in different orders.
  auto lay = gravac::test::mixed_layout();
  lay.add("big", {300000}, gravac::layer_kind::dense);
  lay.add("wide", {200003}, gravac::layer_kind::dense);
  auto p = gravac::test::params_for(lay, 0.05);
  p.kept_fraction[1] = 1.0;  // a layer sent dense
  const double candidates[] = {0.5, 0.1, 0.01, 0.001};
  p.gain_candidates.assign(std::begin(candidates), std::end(candidates));
  SECTION("topk_cuda") {
    gravac::test::device_twins<gravac::topk_cuda> t(lay);
    for (std::uint64_t s = 0; s < 3; ++s) t.step(gravac::test::make_data(lay.numel(), 41 + s), p);
  }
  SECTION("threshold_cuda") {
    gravac::test::device_twins<gravac::threshold_cuda> t(lay);
    for (std::uint64_t s = 0; s < 3; ++s) t.step(gravac::test::make_data(lay.numel(), 51 + s), p);
  }
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
  for_each_sweep_case(sizes, dists, fractions, [&](std::size_t n, distribution d, double f) {
    INFO("n = " << n << ", fraction = " << f << ", distribution = " << static_cast<int>(d));
    threshold_pair r(gravac::layout::flat(n));
    for (std::uint64_t step = 0; step < 3; ++step) {
      const auto p = gravac::test::params_for(r.lay, f, step);  // a new sample every step
      r.step(step == 2 ? scaled(gravac::test::make_data(n, 70 + step, d), 1e-3f)
                       : gravac::test::make_data(n, 70 + step, d),
             p);
    }
  });
}

TEST_CASE(
    "threshold_cuda over many layers, sampled and whole-layer estimates and raw layers in one step, "
    "sends what threshold sends") {
  // The estimates of every layer share their launches (detail/estimate_jobs.hpp): small
  // options make most of these layers sample, the smallest take their whole histogram.
  gravac::layout lay;
  for (std::size_t i = 0; i < 40; ++i) lay.add("l" + std::to_string(i), {7 + 97 * (i % 9)}, gravac::layer_kind::dense);
  gravac::threshold_options ho;
  ho.expected_hits = 8;
  ho.run_length = 4;
  gravac::threshold_cuda_options dopt;
  dopt.expected_hits = ho.expected_hits;
  dopt.run_length = ho.run_length;
  gravac::test::pair_run<gravac::threshold, gravac::threshold_cuda> r(lay, ho, dopt);
  r.nan_norms_equal = false;
  for (std::uint64_t step = 0; step < 4; ++step) {
    auto p = gravac::test::params_for(lay, 0.05, step);
    for (std::size_t i = step; i < lay.size(); i += 5) p.kept_fraction[i] = 1.0;  // raw, a different set each step
    if (step % 2) p.gain_candidates = {0.2, 0.01};
    r.step(gravac::test::make_data(lay.numel(), 90 + step, distribution::laplace), p);
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

namespace {

// A layout with no layers, or with layers of 0 elements only, on a host and a device
// compressor: both constructors accept it or both refuse it alike; accepted, three steps
// give identical packets and residuals (pair_run), both validate the packet and refuse the
// same corruptions, and both decompress it into an empty gradient; the device refuses a
// gradient of the wrong size.
template <class Host, class Dev>
void empty_layout_agrees(const gravac::layout& lay) {
  std::optional<gravac::status> host_refused, dev_refused;
  try {
    Host h(lay);
  } catch (const gravac::error& e) {
    host_refused = e.code();
  }
  try {
    Dev d(lay);
  } catch (const gravac::error& e) {
    dev_refused = e.code();
  }
  REQUIRE(dev_refused == host_refused);
  if (host_refused) return;

  pair_run_t<Host, Dev> r(lay);
  REQUIRE(r.dev.max_packet_bytes() == r.host.max_packet_bytes());
  for (std::uint64_t step = 0; step < 3; ++step) {
    INFO("step " << step);
    auto p = gravac::test::params_for(r.lay, step == 2 ? 1.0 : 0.1, step);
    const double candidates[] = {0.5, 0.01};
    p.gain_candidates.assign(std::begin(candidates), std::end(candidates));
    r.step(std::vector<float>(lay.numel()), p);
  }
  const std::size_t bytes = r.bytes;
  REQUIRE(bytes >= sizeof(gravac::packet_header));
  const std::vector<std::byte> good(r.packet_host.begin(), r.packet_host.begin() + static_cast<std::ptrdiff_t>(bytes));
  REQUIRE(static_cast<bool>(r.host.validate(good)));
  REQUIRE(static_cast<bool>(r.dev.validate(r.packet_dev.span().first(bytes))));
  auto check = [&](const std::vector<std::byte>& bad, const char* what) {
    INFO(what);
    const bool host_ok = static_cast<bool>(r.host.validate(bad));
    gravac::device_buffer<std::byte> d(std::max<std::size_t>(bad.size(), 1));
    if (!bad.empty()) GRAVAC_TRY_CUDA(cudaMemcpy(d.data(), bad.data(), bad.size(), cudaMemcpyHostToDevice));
    const bool dev_ok = static_cast<bool>(r.dev.validate(d.span().first(bad.size())));
    CHECK(!host_ok);
    CHECK(dev_ok == host_ok);
  };
  {
    auto b = good;
    b[0] = std::byte{0};
    check(b, "magic");
  }
  check(std::vector<std::byte>(good.begin(), good.end() - 1), "truncated");
  check({}, "empty");
  {
    // A valid packet of another layout (one layer of 5 elements): the layout hash differs.
    const auto other = gravac::layout::flat(5);
    Host h(other);
    std::vector<float> g = gravac::test::make_data(5, 3), e(5, 0.0f);
    std::vector<std::byte> packet(h.max_packet_bytes());
    gravac::compress_stats st;
    packet.resize(
        h.compress(gravac::host_view(g), gravac::host_view(e), gravac::test::params_for(other, 0.5), packet, st));
    check(packet, "another layout's packet");
  }

  // Decompress into the empty gradient: nothing to add, nothing refused, on either side.
  std::vector<float> out_h;
  CHECK_NOTHROW(r.host.decompress_add(good, gravac::host_view(out_h), 0.5f));
  gravac::device_buffer<float> out_d;
  CHECK_NOTHROW(r.dev.decompress_add(r.packet_dev.span().first(bytes), gravac::device_view(out_d), 0.5f));
  r.dev.synchronize();
  // A gradient of the wrong size: the device compressor refuses it before queuing anything
  // (invalid_argument), the buffer untouched. (The host compressors' decompress_add does
  // not check the size: a validated packet of this layout writes nothing here.)
  auto one_d = to_device(std::vector<float>(1, 0.25f));
  std::optional<gravac::status> dev_size;
  try {
    r.dev.decompress_add(r.packet_dev.span().first(bytes), gravac::device_view(one_d), 0.5f);
  } catch (const gravac::error& e) {
    dev_size = e.code();
  }
  r.dev.synchronize();
  CHECK(dev_size == gravac::status::invalid_argument);
  CHECK(to_host(one_d.data(), 1)[0] == 0.25f);
}

// Layers of 0 elements only (dense, convolution, bias kinds), two of them adjacent.
gravac::layout all_empty_layout() {
  gravac::layout lay;
  lay.add("a", {0}, gravac::layer_kind::dense);
  lay.add("b", {4, 0}, gravac::layer_kind::conv);
  lay.add("c", {0}, gravac::layer_kind::bias_or_norm);
  return lay;
}

}  // namespace

TEST_CASE("topk_cuda and threshold_cuda on a layout with no layers or only empty ones agree with the host's") {
  SECTION("topk, no layers") { empty_layout_agrees<gravac::topk, gravac::topk_cuda>(gravac::layout{}); }
  SECTION("topk, empty layers") { empty_layout_agrees<gravac::topk, gravac::topk_cuda>(all_empty_layout()); }
  SECTION("threshold, no layers") { empty_layout_agrees<gravac::threshold, gravac::threshold_cuda>(gravac::layout{}); }
  SECTION("threshold, empty layers") {
    empty_layout_agrees<gravac::threshold, gravac::threshold_cuda>(all_empty_layout());
  }
}

namespace {

// Keeps a stream busy for a while, so that work queued after it on that stream is late: a
// compressor whose kernels were not ordered on the caller's stream would read the gradient
// (or decode into the output) before the copy that writes it.
__global__ void busy_kernel(long long cycles) {
  const long long t0 = clock64();
  while (clock64() - t0 < cycles) {
  }
}
void keep_busy(cudaStream_t s) {
#if defined(GRAVAC_CUDA_HOST_DOUBLE)
  // The double runs a stream only when something waits for it: anything not ordered after
  // the copy reads the old contents whatever the spin; its clock64 counts nanoseconds.
  gravac::detail::launch(&busy_kernel, 1, 1, s, 20'000LL);
#else
  gravac::detail::launch(&busy_kernel, 1, 1, s, 2'000'000LL);  // about a millisecond
#endif
}

// Host and device compressors stepped together on a non-blocking stream of the caller's,
// outside any trainer: every device buffer is allocated on that stream and every copy in
// and out is queued on it (nothing orders it with the legacy or per-thread default
// streams), after a kernel that keeps it busy. Three steps (the second with a raw layer
// and the gain curve): packets and residuals bit for bit, the same kept counts; validate
// accepts the packet and refuses a corrupted one; decompress_add equals the host's bit for
// bit (the scale is a power of two, so a fused multiply-add rounds as the host does).
template <class Host, class Dev>
void compressors_on_callers_stream(double fraction, std::uint64_t seed) {
  gravac::cuda_stream caller;
  const gravac::stream_ref s = caller.ref();
  auto lay = gravac::test::mixed_layout();
  lay.add("big", {300007}, gravac::layer_kind::dense);
  const std::size_t n = lay.numel();
  Host host(lay);
  typename Dev::options dopt;
  dopt.stream = s;
  Dev dev(lay, dopt);
  REQUIRE(dev.stream() == s);
  gravac::device_buffer<float> gd(n, s), ed(n, s), out_d(n, s);
  gravac::device_buffer<std::byte> packet_d(dev.max_packet_bytes(), s), bad_d(dev.max_packet_bytes(), s);
  gravac::pinned_buffer<float> staged(n);  // pinned: the upload is truly asynchronous
  std::vector<float> e_host(n, 0.0f);
  std::vector<std::byte> packet_h(host.max_packet_bytes());
  for (std::uint64_t step = 0; step < 3; ++step) {
    INFO("step " << step);
    auto p = gravac::test::params_for(lay, fraction, step);
    if (step == 1) {
      p.kept_fraction[0] = 1.0;  // a raw layer
      const double candidates[] = {0.1, 0.001};
      p.gain_candidates.assign(std::begin(candidates), std::end(candidates));
    }
    const auto g =
        step == 2 ? scaled(gravac::test::make_data(n, seed + step), 1e-3f) : gravac::test::make_data(n, seed + step);
    gravac::compress_stats sh, sd;
    std::vector<float> gh = g;
    const std::size_t bh = host.compress(gravac::host_view(gh), gravac::host_view(e_host), p, packet_h, sh);

    std::copy(g.begin(), g.end(), staged.data());
    keep_busy(s.get());
    GRAVAC_TRY_CUDA(cudaMemcpyAsync(gd.data(), staged.data(), n * sizeof(float), cudaMemcpyHostToDevice, s.get()));
    const std::size_t bd = dev.compress(gravac::device_view(gd), gravac::device_view(ed), p, packet_d.span(), sd);
    REQUIRE(bd == bh);
    std::vector<std::byte> packet_back(bd);
    std::vector<float> e_back(n);
    GRAVAC_TRY_CUDA(cudaMemcpyAsync(packet_back.data(), packet_d.data(), bd, cudaMemcpyDeviceToHost, s.get()));
    GRAVAC_TRY_CUDA(cudaMemcpyAsync(e_back.data(), ed.data(), n * sizeof(float), cudaMemcpyDeviceToHost, s.get()));
    s.synchronize();
    REQUIRE(std::memcmp(packet_back.data(), packet_h.data(), bh) == 0);
    REQUIRE(std::memcmp(e_back.data(), e_host.data(), n * sizeof(float)) == 0);
    REQUIRE(sd.non_finite == sh.non_finite);
    for (std::size_t i = 0; i < lay.size(); ++i) {
      INFO("layer " << lay[i].name);
      CHECK(sd.layers[i].kept == sh.layers[i].kept);
      CHECK(sd.layers[i].input_sq == Approx(sh.layers[i].input_sq).epsilon(1e-5).margin(1e-30));
    }

    // Validation on the caller's stream: the packet, then a copy with a broken magic.
    const std::span<const std::byte> good = std::span<const std::byte>(packet_h).first(bh);
    REQUIRE(static_cast<bool>(host.validate(good)));
    REQUIRE(static_cast<bool>(dev.validate(packet_d.span().first(bd))));
    GRAVAC_TRY_CUDA(cudaMemcpyAsync(bad_d.data(), packet_d.data(), bd, cudaMemcpyDeviceToDevice, s.get()));
    GRAVAC_TRY_CUDA(cudaMemsetAsync(bad_d.data(), 0, 1, s.get()));
    std::vector<std::byte> bad_h(good.begin(), good.end());
    bad_h[0] = std::byte{0};
    REQUIRE_FALSE(static_cast<bool>(host.validate(bad_h)));
    REQUIRE_FALSE(static_cast<bool>(dev.validate(bad_d.span().first(bd))));

    // decompress_add into a gradient uploaded on the same stream behind the busy kernel.
    const auto start = gravac::test::make_data(n, seed + 100 + step);
    std::vector<float> out_h = start;
    host.decompress_add(good, gravac::host_view(out_h), 0.5f);
    keep_busy(s.get());
    GRAVAC_TRY_CUDA(cudaMemcpyAsync(out_d.data(), start.data(), n * sizeof(float), cudaMemcpyHostToDevice, s.get()));
    dev.decompress_add(packet_d.span().first(bd), gravac::device_view(out_d), 0.5f);
    std::vector<float> out_back(n);
    GRAVAC_TRY_CUDA(cudaMemcpyAsync(out_back.data(), out_d.data(), n * sizeof(float), cudaMemcpyDeviceToHost, s.get()));
    s.synchronize();
    REQUIRE(std::memcmp(out_back.data(), out_h.data(), n * sizeof(float)) == 0);
  }
}

}  // namespace

TEST_CASE("topk_cuda and threshold_cuda on a non-blocking stream of the caller's equal the host's bit for bit") {
  SECTION("topk") { compressors_on_callers_stream<gravac::topk, gravac::topk_cuda>(0.01, 1100); }
  SECTION("threshold") { compressors_on_callers_stream<gravac::threshold, gravac::threshold_cuda>(0.01, 1200); }
}

namespace {

// MemAvailable of /proc/meminfo in bytes; 0 when it cannot be read.
std::size_t mem_available_bytes() {
  std::ifstream in("/proc/meminfo");
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream is(line);
    std::string key;
    std::size_t kb = 0;
    if (is >> key >> kb && key == "MemAvailable:") return kb * 1024;
  }
  return 0;
}

}  // namespace

TEST_CASE("topk_cuda on one layer of 2^29 + 3 floats (over 2 GiB) matches topk at 0.1% (needs 16 GiB)", "[.large]") {
  // Byte offsets of this layer pass 2^31: a 32-bit signed byte count or offset anywhere in
  // the kernels, the compaction or the copies would show. Not device_size: the size is the
  // point. About 10 GiB of host memory at the peak (the gradient, its copy, both residuals
  // and the host compressor's workspace of 8 bytes per element; on the host double of CUDA
  // device memory is host memory too).
  constexpr std::size_t need = std::size_t{16} << 30;
  const std::size_t avail = mem_available_bytes();
  if (avail < need) {
    WARN("skipped: MemAvailable is " << (avail >> 20) << " MiB, this case needs 16 GiB");
    return;
  }
  const std::size_t n = (std::size_t{1} << 29) + 3;
  const double f = 0.001;
  const auto lay = gravac::layout::flat(n);
  const auto p = gravac::test::params_for(lay, f);
  const std::size_t k = gravac::kept_count(n, f);
  // A packet buffer of this step's size, not max_packet_bytes() (8 bytes per element).
  const std::size_t packet_bytes = sizeof(gravac::packet_header) + gravac::sparse_segment_bytes(n, k);
  auto g = gravac::test::make_data(n, 91, distribution::gaussian);
  auto gd = to_device(g);
  std::vector<float> e_host(n, 0.0f);
  std::vector<std::byte> packet_h(packet_bytes);
  gravac::compress_stats sh;
  std::size_t bh = 0;
  {
    gravac::topk host(lay);
    bh = host.compress(gravac::host_view(g), gravac::host_view(e_host), p, packet_h, sh);
  }                              // its workspace freed
  std::vector<float>().swap(g);  // and the gradient (on the device now)
  REQUIRE(sh.layers[0].kept == k);

  gravac::topk_cuda dev(lay);
  gravac::device_buffer<float> ed(n);
  gravac::device_buffer<std::byte> packet_d(packet_bytes);
  gravac::compress_stats sd;
  const std::size_t bd = dev.compress(gravac::device_view(gd), gravac::device_view(ed), p, packet_d.span(), sd);
  gd = gravac::device_buffer<float>();  // freed before the residual comes back
  REQUIRE(bd == bh);
  CHECK(sd.layers[0].kept == k);
  const auto pd = to_host(packet_d.data(), bd);
  REQUIRE(std::memcmp(pd.data(), packet_h.data(), bh) == 0);
  // The residual, 64 Mi values at a time (the whole would be another 2 GiB).
  constexpr std::size_t chunk = std::size_t{1} << 26;
  for (std::size_t at = 0; at < n; at += chunk) {
    const std::size_t m = std::min(chunk, n - at);
    const auto ep = to_host(ed.data() + at, m);
    INFO("residual values " << at << " .. " << at + m);
    REQUIRE(std::memcmp(ep.data(), e_host.data() + at, m * sizeof(float)) == 0);
  }
}
