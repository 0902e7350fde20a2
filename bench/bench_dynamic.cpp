// Stateful CPU compressors as training runs them (dynamic_steps.hpp): a fresh gradient
// every step, the residual carried by error feedback, timed after the residual has
// reached its steady state; baselines (memcpy, the error-feedback floor) timed beside
// every sample in the same process. bench_topk and bench_quantizers time the restored
// state instead (the same gradient and residual every call): their figures are the best
// case, these the expected one.
//
// Benchmarks (one iteration each: a whole sequence of steps; the reported time is the
// median time per timed step):
//   dynamic/topk           exact top-k per layer (one layer of N)
//   dynamic/topk_whole     exact top-k over the whole buffer (N in 8 layers of N/2, N/4, ...)
//   dynamic/topk_gain5     top-k with 5 gain candidates; gain_overhead against the same
//                          top-k without them, stepped on the same gradients
//   dynamic/topk_2threads  top-k with threads = 2; speedup_vs_1_thread against threads = 1
//   dynamic/threshold      threshold selection; k_error_max over the timed steps
//   dynamic/adacomp, qsgd_s127, qsgd_s7, terngrad, sign, cast16_fp16, cast16_bf16
//   dynamic/mxfp8_e4m3, mxfp4, nvfp4 (rounding to nearest even, error feedback on) and
//                          mxfp8_e4m3_sr, mxfp4_sr, nvfp4_sr (stochastic rounding)
//   bandwidth/memcpy_2threads  a memcpy split over two threads against one (the ceiling
//                          of a two-thread speedup of a memory-bound pass)
//
// Counters: ratio_to_memcpy, ratio_to_ef_floor, ef_floor_to_memcpy (medians over the
// samples of ratios of neighbouring timings), bits_per_element, steady (1 when the
// residual's norm changed by less than 1% per step over 8 steps before timing),
// warmup_steps, norm_change_timed (largest change per step while timed).
//
// Arguments: log2 N, kept fraction in 1/10000 (selection only), data (0 Gaussian,
// 1 Laplace, 2 gradients recorded from the Fashion-MNIST example: the file named by the
// environment variable GRAVAC_BENCH_GRADIENTS, else the small sample in bench/data; see
// bench/record_gradients). 2^16, 2^20 and 2^24 are registered; e.g.
//   bench_dynamic --benchmark_filter='dynamic/topk/24/100/0'
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <initializer_list>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "compressors.hpp"
#include "dynamic_steps.hpp"
#include "gradient_data.hpp"
#include "gravac/compress/block_scaled.hpp"

namespace {

using namespace gravac_bench;

#ifndef GRAVAC_BENCH_SOURCE_DIR
#define GRAVAC_BENCH_SOURCE_DIR "."
#endif

// The recorded gradients: GRAVAC_BENCH_GRADIENTS, else the sample checked in.
const recorded_gradients& recorded() {
  static const recorded_gradients r = [] {
    const char* env = std::getenv("GRAVAC_BENCH_GRADIENTS");
    return load_gradients(env != nullptr && *env != '\0'
                              ? std::string(env)
                              : std::string(GRAVAC_BENCH_SOURCE_DIR) + "/data/fmnist_mlp_sample.npy");
  }();
  return r;
}

// The gradients of (n, data), made once per process.
const gradient_stream& stream(std::size_t n, int data) {
  static std::map<std::pair<std::size_t, int>, std::unique_ptr<gradient_stream>> cache;
  auto& s = cache[{n, data}];
  if (!s) {
    if (cache.size() > 2) {  // keep at most the last two (2^24: 256 MiB each)
      for (auto it = cache.begin(); it != cache.end();)
        it = it->second && it->first != std::make_pair(n, data) ? cache.erase(it) : std::next(it);
    }
    s = std::make_unique<gradient_stream>(data == 2
                                              ? gradient_stream::recorded(recorded(), n)
                                              : gradient_stream::generated(n, static_cast<data_kind>(data), 2024));
  }
  return *s;
}

gravac::layout one_layer(std::size_t n) { return gravac::layout::flat(n); }

// N elements in 8 layers of N/2, N/4, ..., the last one the rest.
gravac::layout eight_layers(std::size_t n) {
  gravac::layout lay;
  std::size_t left = n;
  for (int i = 0; i < 8; ++i) {
    const std::size_t m = i == 7 ? left : std::max<std::size_t>(1, left / 2);
    lay.add("layer" + std::to_string(i), {m}, gravac::layer_kind::dense);
    left -= m;
  }
  return lay;
}

enum class extra { none, gain5, threads2, k_error };

// Builds a compressor of a layout by name (make_compressor: the runtime's option table).
using maker = bench_compressor (*)(const std::string&, const gravac::layout&, const compressor_settings&);

// The block-scaled compressors (gravac/compress/block_scaled.hpp), built here with their
// options until the runtime's option table names them: mxfp8_e4m3, mxfp4, nvfp4, each with
// the suffix _sr for stochastic rounding. Their residual is one step's coding error.
bench_compressor make_block_scaled(const std::string& name, const gravac::layout& lay, const compressor_settings& s) {
  const bool sr = name.ends_with("_sr");
  const auto rounding = sr ? gravac::block_rounding::stochastic : gravac::block_rounding::nearest_even;
  const std::string base = sr ? name.substr(0, name.size() - 3) : name;
  bench_compressor b;
  if (base == "mxfp8_e4m3")
    b = gravac_bench::detail::wrap<gravac::mxfp8>(
        name, lay, gravac::mxfp8_options{.element = gravac::mxfp8_element::e4m3, .rounding = rounding}, s);
  else if (base == "mxfp4")
    b = gravac_bench::detail::wrap<gravac::mxfp4>(name, lay, gravac::mxfp4_options{.rounding = rounding}, s);
  else if (base == "nvfp4")
    b = gravac_bench::detail::wrap<gravac::nvfp4>(name, lay, gravac::nvfp4_options{.rounding = rounding}, s);
  else
    throw std::invalid_argument("unknown block-scaled compressor '" + name + "'");
  b.one_step_residual = true;
  return b;
}

void run(benchmark::State& state, const std::string& name, compressor_settings s, extra x, bool whole = false,
         maker make = make_compressor) {
  const std::size_t n = std::size_t{1} << state.range(0);
  const int data = static_cast<int>(state.range(2));
  s.method.fixed.kept_fraction = static_cast<double>(state.range(1)) / 10000.0;
  s.method.topk.whole_buffer = whole;
  const gradient_stream* gs = nullptr;
  try {
    gs = &stream(n, data);
  } catch (const std::exception& ex) {
    state.SkipWithError(ex.what());
    return;
  }
  const auto lay = whole ? eight_layers(n) : one_layer(n);
  auto with = s;
  if (x == extra::gain5) with.gain_candidates = {0.1, 0.033, 0.011, 0.004, 0.001};
  auto c = make(name, lay, with);
  std::vector<float> e(n, 0.0f), e_other(n, 0.0f);
  bench_compressor other;
  if (x == extra::gain5) {
    other = make_compressor(name, lay, s);  // the same selection without the gain curve
  } else if (x == extra::threads2) {
    auto one = s;
    one.method.topk.threads = 1;
    other = make_compressor(name, lay, one);
  }
  std::vector<std::pair<std::size_t, double>> k_error;  // (step, |k_hat - k| / k)
  const double k = static_cast<double>(gravac::kept_count(n, s.fraction()));
  const step_function step = [&](std::size_t t, std::span<float> g) {
    const std::size_t bytes = c.compress(g, e);
    if (x == extra::k_error) k_error.emplace_back(t, std::fabs(static_cast<double>(c.stats().layers[0].kept) - k) / k);
    return bytes;
  };
  const step_function other_step =
      other.compress ? step_function([&](std::size_t, std::span<float> g) { return other.compress(g, e_other); })
                     : step_function{};
  dynamic_options opt;
  opt.floor_second_pass = c.floor_second_pass;
  if (c.one_step_residual) {
    opt.gradient_window = 1;
    opt.fixed_warmup = true;
  }
  dynamic_result r;
  for (auto _ : state) {
    r = run_dynamic(*gs, e, step, opt, other_step);
    state.SetIterationTime(r.seconds_per_step());
  }
  state.counters["ratio_to_memcpy"] = r.ratio_to_memcpy();
  state.counters["ratio_to_ef_floor"] = r.ratio_to_floor();
  state.counters["ef_floor_to_memcpy"] = r.floor_to_memcpy();
  state.counters["bits_per_element"] = 8.0 * static_cast<double>(r.packet_bytes) / static_cast<double>(n);
  state.counters["steady"] = r.steady ? 1 : 0;
  state.counters["warmup_steps"] = static_cast<double>(r.warmup_steps);
  state.counters["norm_change_timed"] = r.max_change_timed;
  if (x == extra::gain5) state.counters["gain_overhead"] = r.ratio_to_other() - 1.0;
  if (x == extra::threads2) state.counters["speedup_vs_1_thread"] = 1.0 / r.ratio_to_other();
  if (x == extra::k_error) {
    double worst = 0;
    for (const auto& [t, err] : k_error)
      if (t >= r.first_timed_step) worst = std::max(worst, err);
    state.counters["k_error_max"] = worst;
  }
  state.SetLabel(std::string(data_name(static_cast<data_kind>(data))) + (opt.fixed_warmup ? ", fixed warm-up"
                                                                         : r.steady       ? ""
                                                                                    : ", steady state NOT reached"));
}

// What a second core adds to memory bandwidth: a memcpy of the gradient buffer split over
// two threads (one half each) against the same memcpy on one, paired call by call
// (bench_common.hpp). The ceiling of any two-thread speedup of a memory-bound pass.
void BM_memcpy_2threads(benchmark::State& state) {
  const std::size_t n = std::size_t{1} << state.range(0);
  std::vector<float> src(n, 1.0f), dst(n);
  const auto half = [&](std::size_t a, std::size_t b) {
    std::memcpy(dst.data() + a, src.data() + a, (b - a) * sizeof(float));
  };
  const std::function<void()> two = [&] {
    std::thread other(half, n / 2, n);
    half(0, n / 2);
    other.join();
    benchmark::ClobberMemory();
  };
  const std::function<void()> one = [&] {
    half(0, n);
    benchmark::ClobberMemory();
  };
  for (auto _ : state) two();
  state.counters["speedup_vs_1_thread"] = 1.0 / paired_ratio([] {}, two, one, calls_for(n), 15);
}

void register_all() {
  benchmark::RegisterBenchmark("bandwidth/memcpy_2threads", BM_memcpy_2threads)
      ->Arg(20)
      ->Arg(24)
      ->UseRealTime()
      ->Unit(benchmark::kMillisecond);
  // An entry's options, by the option table's names (compressor_settings::set).
  const auto with = [](std::initializer_list<std::pair<std::string_view, std::string_view>> options) {
    compressor_settings s;
    for (const auto& [name, value] : options) s.set(name, value);
    return s;
  };
  struct entry {
    const char* name;
    const char* compressor;
    compressor_settings settings;
    extra x;
    bool whole;
    bool selection;  // takes a kept fraction
    maker make = make_compressor;
  };
  const std::vector<entry> entries{
      {"topk", "topk", {}, extra::none, false, true},
      {"topk_whole", "topk", {}, extra::none, true, true},
      {"topk_gain5", "topk", {}, extra::gain5, false, true},
      {"topk_2threads", "topk", with({{"topk_threads", "2"}}), extra::threads2, false, true},
      {"threshold", "threshold", {}, extra::k_error, false, true},
      {"adacomp", "adacomp", {}, extra::none, false, false},
      {"qsgd_s127", "qsgd", with({{"qsgd_levels", "127"}, {"qsgd_bucket", "512"}}), extra::none, false, false},
      {"qsgd_s7", "qsgd", with({{"qsgd_levels", "7"}, {"qsgd_bucket", "64"}}), extra::none, false, false},
      {"terngrad", "terngrad", {}, extra::none, false, false},
      {"sign", "sign", {}, extra::none, false, false},
      {"cast16_fp16", "cast16", {}, extra::none, false, false},
      {"cast16_bf16", "cast16", with({{"cast16_format", "bf16"}}), extra::none, false, false},
      {"mxfp8_e4m3", "mxfp8_e4m3", {}, extra::none, false, false, make_block_scaled},
      {"mxfp8_e4m3_sr", "mxfp8_e4m3_sr", {}, extra::none, false, false, make_block_scaled},
      {"mxfp4", "mxfp4", {}, extra::none, false, false, make_block_scaled},
      {"mxfp4_sr", "mxfp4_sr", {}, extra::none, false, false, make_block_scaled},
      {"nvfp4", "nvfp4", {}, extra::none, false, false, make_block_scaled},
      {"nvfp4_sr", "nvfp4_sr", {}, extra::none, false, false, make_block_scaled},
  };
  for (const auto& en : entries) {
    auto* b = benchmark::RegisterBenchmark((std::string("dynamic/") + en.name).c_str(), [en](benchmark::State& st) {
      run(st, en.compressor, en.settings, en.x, en.whole, en.make);
    });
    for (int lg : {16, 20, 24})
      for (int f : en.selection ? std::vector<int>{100, 10} : std::vector<int>{100})
        for (int data : {0, 1, 2}) b->Args({lg, f, data});
    b->Iterations(1)->UseManualTime()->Unit(benchmark::kMillisecond);
  }
}

}  // namespace

int main(int argc, char** argv) {
  register_all();
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
