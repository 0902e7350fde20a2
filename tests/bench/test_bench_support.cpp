// The benchmarks' support code (bench/): the steady-state detector and the loader of
// recorded gradients reject bad input with a clear error; and the selection passes that
// learn from earlier steps (top-k's adaptive guess) select exactly what the sort-based
// reference selects, step after step, with the residual carried, on all three data kinds
// of the dynamic benchmarks (Gaussian, Laplace, gradients recorded from Fashion-MNIST).
#include <catch2/catch.hpp>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "dynamic_steps.hpp"
#include "gradient_data.hpp"
#include "gravac/compress/threshold.hpp"
#include "gravac/compress/topk.hpp"
#include "model_layouts.hpp"
#include "topk_reference.hpp"

using namespace gravac_bench;
using Catch::Matchers::Contains;

namespace {

std::string temp_path(const std::string& name) {
  return (std::filesystem::temp_directory_path() / ("gravac_test_bench_support_" + name)).string();
}

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// A .npy v1 file with header dict \p dict and \p data_bytes bytes of data.
std::string npy(const std::string& dict, std::size_t data_bytes) {
  std::string h = dict;
  while ((10 + h.size() + 1) % 64 != 0) h.push_back(' ');
  h.push_back('\n');
  std::string s("\x93NUMPY\x01\x00", 8);
  s.push_back(static_cast<char>(h.size() & 0xff));
  s.push_back(static_cast<char>(h.size() >> 8));
  return s + h + std::string(data_bytes, '\0');
}

bool bit_equal(float a, float b) { return std::memcmp(&a, &b, sizeof a) == 0; }

std::string sample_path() { return std::string(GRAVAC_BENCH_SOURCE_DIR) + "/data/fmnist_mlp_sample.npy"; }

}  // namespace

TEST_CASE("steady_detector rejects bad settings and bad norms with a clear error", "[bench]") {
  CHECK_THROWS_WITH(steady_detector(0.0), Contains("tolerance must be in (0, 1)"));
  CHECK_THROWS_WITH(steady_detector(1.0), Contains("tolerance must be in (0, 1)"));
  CHECK_THROWS_WITH(steady_detector(std::nan("")), Contains("tolerance must be in (0, 1)"));
  CHECK_THROWS_WITH(steady_detector(0.01, 0), Contains("window must be at least 1"));
  steady_detector d;
  d.add(1.0);
  CHECK_THROWS_WITH(d.add(std::nan("")), Contains("after step 1 is not a finite norm"));
  CHECK_THROWS_WITH(d.add(-1.0), Contains("is not a finite norm"));
  CHECK_THROWS_WITH(d.add(HUGE_VAL), Contains("is not a finite norm"));
}

TEST_CASE("steady_detector: steady when the norm changes by less than the tolerance per step", "[bench]") {
  steady_detector grow(0.01, 8);
  double x = 1;
  for (int i = 0; i < 50; ++i) CHECK_FALSE(grow.add(x *= 1.02));  // 2% a step: never steady
  steady_detector settle(0.01, 8);
  std::vector<bool> steady;
  for (int i = 0; i < 60; ++i) steady.push_back(settle.add(2.0 - std::pow(0.8, i)));  // converges geometrically
  CHECK_FALSE(steady[5]);
  CHECK(steady.back());
  CHECK(settle.change_per_step() < 0.01);
  steady_detector short_window(0.01, 8);
  for (int i = 0; i < 8; ++i) CHECK_FALSE(short_window.add(1.0));  // a window of 8 changes needs 9 norms
  CHECK(short_window.add(1.0));
  steady_detector zero(0.01, 2);
  CHECK_FALSE(zero.add(0.0));
  CHECK_FALSE(zero.add(0.0));
  CHECK(zero.add(0.0));        // a residual that stays zero (identity) is steady
  CHECK_FALSE(zero.add(1.0));  // one that leaves zero is not
}

TEST_CASE("run_dynamic rejects bad options", "[bench]") {
  const auto s = gradient_stream::generated(64, data_kind::gaussian, 1);
  std::vector<float> e(64);
  const step_function step = [&](std::size_t, std::span<float>) { return std::size_t{0}; };
  CHECK_THROWS_WITH(run_dynamic(s, e, step, {.samples = 0}), Contains("samples must be at least 1"));
  CHECK_THROWS_WITH(run_dynamic(s, e, step, {.max_warmup = 4, .min_warmup = 5}), Contains("min_warmup exceeds"));
}

TEST_CASE("load_gradients reads what save_npy wrote, and raw float32", "[bench]") {
  const std::string path = temp_path("ok.npy");
  std::vector<float> v(3 * 5);
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(i) * 0.25f - 1.0f;
  save_npy(path, v, 3, 5);
  const auto r = load_gradients(path);
  CHECK(r.steps == 3);
  CHECK(r.params == 5);
  CHECK(r.values == v);
  const std::string raw = temp_path("ok.raw");
  write_bytes(raw, std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float)));
  const auto q = load_gradients(raw, 5);
  CHECK(q.steps == 3);
  CHECK(q.values == v);
  std::filesystem::remove(path);
  std::filesystem::remove(raw);
}

TEST_CASE("load_gradients rejects bad files with a clear error", "[bench]") {
  const std::string path = temp_path("bad.npy");
  auto fails = [&](const std::string& bytes, const std::string& what) {
    write_bytes(path, bytes);
    CHECK_THROWS_WITH(load_gradients(path), Contains("gradient file " + path) && Contains(what));
  };
  const std::string good = "{'descr': '<f4', 'fortran_order': False, 'shape': (4, 8), }";
  fails(npy(good, 4 * 8 * 4 - 1), "truncated: shape (4, 8) needs 128 bytes of data, the file has 127");
  fails(npy(good, 0).substr(0, 30), "truncated .npy header");
  fails(npy("{'descr': '<f8', 'fortran_order': False, 'shape': (4, 8), }", 256), "dtype '<f8', expected float32");
  fails(npy("{'descr': '>f4', 'fortran_order': False, 'shape': (4, 8), }", 128), "dtype '>f4'");
  fails(npy("{'descr': '<i4', 'fortran_order': False, 'shape': (4, 8), }", 128), "dtype '<i4'");
  fails(npy("{'descr': '<f4', 'fortran_order': True, 'shape': (4, 8), }", 128), "Fortran order");
  fails(npy("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 4, 8), }", 256), "expected (steps, params)");
  fails(npy("{'descr': '<f4', 'fortran_order': False, 'shape': (0, 8), }", 0), "holds no gradient");
  fails(npy("{'descr': '<f4', 'fortran_order': False, }", 128), "no 'shape'");
  fails("not a numpy file at all", "not a .npy file");
  std::string nan_file = npy("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 2), }", 16);
  const float nan = std::nanf("");
  std::memcpy(nan_file.data() + nan_file.size() - 4, &nan, 4);
  fails(nan_file, "value 3 (step 1) is not finite");
  CHECK_THROWS_WITH(load_gradients(temp_path("missing.npy")), Contains("cannot be opened"));
  const std::string raw = temp_path("bad.raw");
  write_bytes(raw, std::string(10, '\0'));
  CHECK_THROWS_WITH(load_gradients(raw), Contains("multiple of 4 bytes, the file has 10"));
  write_bytes(raw, std::string(12, '\0'));
  CHECK_THROWS_WITH(load_gradients(raw, 2), Contains("truncated: 3 floats are not whole rows of 2"));
  std::filesystem::remove(path);
  std::filesystem::remove(raw);
}

TEST_CASE("the checked-in sample of recorded gradients loads", "[bench]") {
  const auto r = load_gradients(sample_path());
  CHECK(r.steps >= 8);
  CHECK(r.params >= 1000);
  // A truncated copy of it fails, naming the shape.
  const std::string bytes = read_bytes(sample_path());
  const std::string cut = temp_path("cut.npy");
  write_bytes(cut, bytes.substr(0, bytes.size() - 100));
  CHECK_THROWS_WITH(load_gradients(cut), Contains("truncated: shape ("));
  std::filesystem::remove(cut);
}

TEST_CASE("gradient_stream: a fresh gradient every step, deterministic", "[bench]") {
  const auto a = gradient_stream::generated(4096, data_kind::laplace, 7),
             b = gradient_stream::generated(4096, data_kind::laplace, 7);
  std::vector<float> g0(4096), g1(4096), h0(4096);
  a.fill(0, g0);
  a.fill(1, g1);
  b.fill(0, h0);
  CHECK(g0 == h0);
  CHECK(g0 != g1);
  a.fill(4, g1);  // the same draw as step 0, rotated and scaled otherwise
  CHECK(g0 != g1);
  CHECK_THROWS_WITH(gradient_stream::generated(0, data_kind::gaussian, 1), Contains("n must be positive"));
  CHECK_THROWS_WITH(a.fill(0, std::span<float>(g0.data(), 10)), Contains("buffer size differs"));
}

namespace {

// Steps of top-k with the residual carried, each checked against the reference selection
// over u = g + e of that step (per layer, or over the whole buffer). With \p jumps, every
// tenth step keeps 3 times and every 25th 20 times the fraction (a policy's change): the
// learnt guess is then too high, and the step collects again from the floor the pass
// counted, or from a histogram of the layer.
void check_topk_sequence(const gradient_stream& s, const gravac::layout& lay, const gravac::topk_options& opt,
                         double base_fraction, int steps, bool jumps = false) {
  gravac::topk c(lay, opt);
  const std::size_t n = lay.numel();
  std::vector<float> g(n), e(n, 0.0f), u(n), dense(n);
  std::vector<std::byte> packet(c.max_packet_bytes());
  gravac::step_params p;
  std::vector<std::uint64_t> order, selected;
  for (int t = 0; t < steps; ++t) {
    const double fraction = base_fraction * (!jumps ? 1.0 : t % 25 == 24 ? 20.0 : t % 10 == 9 ? 3.0 : 1.0);
    p.kept_fraction.assign(lay.size(), fraction);
    p.global_fraction = fraction;
    s.fill(static_cast<std::size_t>(t), g);
    for (std::size_t i = 0; i < n; ++i) u[i] = g[i] + e[i];
    p.step = static_cast<std::uint64_t>(t);
    gravac::compress_stats st;
    const std::size_t bytes = c.compress(gravac::host_view(g), gravac::host_view(e), p, packet, st);
    std::fill(dense.begin(), dense.end(), 0.0f);
    c.decompress_add(std::span<const std::byte>(packet.data(), bytes), gravac::host_view(dense), 1.0f);
    std::vector<char> is_sel(n, 0);
    if (opt.whole_buffer) {
      gravac::test::select_topk_reference(u, gravac::kept_count(n, fraction), order, selected);
      for (auto ix : selected) is_sel[ix] = 1;
    } else {
      for (const auto& l : lay.layers()) {
        gravac::test::select_topk_reference(std::span<const float>(u.data() + l.offset, l.numel),
                                            gravac::kept_count(l.numel, fraction), order, selected);
        for (auto ix : selected) is_sel[l.offset + ix] = 1;
      }
    }
    for (std::size_t i = 0; i < n; ++i) {
      const float want_dense = is_sel[i] ? u[i] : 0.0f, want_e = is_sel[i] ? 0.0f : u[i];
      if (!bit_equal(dense[i], want_dense) || !bit_equal(e[i], want_e)) {
        INFO("step " << t << " element " << i << " selected by the reference " << int(is_sel[i]));
        REQUIRE(bit_equal(dense[i], want_dense));
        REQUIRE(bit_equal(e[i], want_e));
      }
    }
  }
}

gradient_stream stream_of(int kind, std::size_t n) {
  if (kind == 2) return gradient_stream::recorded(load_gradients(sample_path()), n);
  return gradient_stream::generated(n, static_cast<data_kind>(kind), 11);
}

}  // namespace

TEST_CASE("top-k with its adaptive guess equals the reference selection over sequences of steps",
          "[bench][topk][fused]") {
  gravac::layout lay;
  lay.add("a", {40000}, gravac::layer_kind::dense);
  lay.add("b", {9000}, gravac::layer_kind::dense);
  lay.add("c", {700}, gravac::layer_kind::bias_or_norm);
  for (int kind = 0; kind < 3; ++kind) {
    const auto s = stream_of(kind, lay.numel());
    for (double f : {0.01, 0.001}) {
      INFO("data " << data_name(static_cast<data_kind>(kind)) << " fraction " << f);
      check_topk_sequence(s, lay, {}, f, 80);
      check_topk_sequence(s, lay, {.whole_buffer = true}, f, 80);
      check_topk_sequence(s, lay, {}, f, 80, /*jumps=*/true);
      check_topk_sequence(s, lay, {.whole_buffer = true}, f, 80, /*jumps=*/true);
    }
  }
}

TEST_CASE("top-k on 2 threads equals the reference selection over sequences of steps", "[bench][topk][fused]") {
  const auto lay = gravac::layout::flat(std::size_t{1} << 19);  // two chunks of 2^18: the threaded pass
  for (int kind = 0; kind < 3; ++kind) {
    INFO("data " << data_name(static_cast<data_kind>(kind)));
    check_topk_sequence(stream_of(kind, lay.numel()), lay, {.threads = 2}, 0.01, 30);
  }
}

TEST_CASE("threshold over sequences of steps: every value sent is at least every value kept, bit for bit",
          "[bench][threshold]") {
  const auto lay = gravac::layout::flat(60000);
  for (int kind = 0; kind < 3; ++kind) {
    INFO("data " << data_name(static_cast<data_kind>(kind)));
    const auto s = stream_of(kind, lay.numel());
    gravac::threshold c(lay);
    const std::size_t n = lay.numel();
    std::vector<float> g(n), e(n, 0.0f), u(n), dense(n);
    std::vector<std::byte> packet(c.max_packet_bytes());
    gravac::step_params p;
    p.kept_fraction.assign(1, 0.01);
    p.global_fraction = 0.01;
    for (int t = 0; t < 60; ++t) {
      s.fill(static_cast<std::size_t>(t), g);
      for (std::size_t i = 0; i < n; ++i) u[i] = g[i] + e[i];
      p.step = static_cast<std::uint64_t>(t);
      gravac::compress_stats st;
      const std::size_t bytes = c.compress(gravac::host_view(g), gravac::host_view(e), p, packet, st);
      std::fill(dense.begin(), dense.end(), 0.0f);
      c.decompress_add(std::span<const std::byte>(packet.data(), bytes), gravac::host_view(dense), 1.0f);
      float least_sent = HUGE_VALF, most_kept = 0;
      std::size_t sent = 0;
      for (std::size_t i = 0; i < n; ++i) {
        const bool is_sent = dense[i] != 0.0f;                // random data: no sent value is zero
        REQUIRE(bit_equal(is_sent ? dense[i] : e[i], u[i]));  // error feedback, bit for bit
        REQUIRE(bit_equal(is_sent ? e[i] : dense[i], 0.0f));
        if (is_sent) {
          least_sent = std::min(least_sent, std::fabs(u[i]));
          ++sent;
        } else {
          most_kept = std::max(most_kept, std::fabs(u[i]));
        }
      }
      INFO("step " << t);
      CHECK(sent == st.layers[0].kept);
      CHECK(most_kept < least_sent);
    }
  }
}

TEST_CASE("the model layouts have their models' tensors and parameter counts", "[bench]") {
  // torchvision's resnet50() and Hugging Face's gpt2 (tied output projection), as their
  // parameter lists give them.
  const auto r = gravac_bench::resnet50_layout();
  CHECK(r.size() == 161);
  CHECK(r.numel() == 25557032);
  CHECK(r[0].name == "conv1.weight");
  CHECK(r[0].numel == 64 * 3 * 7 * 7);
  CHECK(r[r.size() - 2].numel == 1000 * 2048);
  const auto g = gravac_bench::gpt2_small_layout();
  CHECK(g.size() == 148);
  CHECK(g.numel() == 124439808);
  CHECK(g[0].numel == 50257 * 768);
}
