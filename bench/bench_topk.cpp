// CPU selection kernels against their baselines, measured in the same process:
// fused error-feedback top-k (compress, decompress), threshold selection, the gain curve
// on top of selection, a memcpy of the same buffer and copy + abs + std::nth_element.
// Every call starts from the same restored residual and gradient, so the previous step's
// threshold always fits: these are the best-case figures. bench_dynamic times the same
// kernels as training runs them (a fresh gradient every step, the residual carried).
//
// Each benchmark times its kernel per iteration and, after the loop, the kernel against
// its baselines on the same buffers, and prints the ratios as counters:
//   ratio_to_memcpy        kernel time / memcpy time (the target for top-k is <= 2)
//   speedup_vs_nth_element nth_element time / kernel time (target >= 5), the median over
//                          5 draws of the data (nth_element's time depends on the draw;
//                          speedup_vs_nth_element_min and _max give the range)
//   gain_overhead          time with 5 gain candidates / time without - 1 (target <= 0.10)
//   ef_floor_to_memcpy     the error-feedback floor (bench_common.hpp: read g and e, write
//                          e and a packet of the kernel's size) / memcpy time
//   ratio_to_ef_floor      kernel time / that floor (top-k and threshold compress)
// Each ratio is the median of ratios of neighbouring timings (bench_common.hpp's
// paired_ratio), which the drift of a shared machine's memory bandwidth does not bias.
//
// Arguments: log2 N, kept fraction in 1/10000 (1000 = 10%, 100 = 1%, 10 = 0.1%), data
// (0 Gaussian, 1 Laplace). Sizes 2^16, 2^20 and 2^24 run by default; 2^26 is registered
// with the prefix "large/" and runs only when selected, e.g.
//   bench_topk --benchmark_filter='large/BM_topk_compress/26/100/0'
// Build with CMAKE_BUILD_TYPE=Release for figures.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "bench_common.hpp"
#include "gravac/compress/threshold.hpp"
#include "gravac/compress/topk.hpp"

namespace {

using namespace gravac_bench;

// The data of this binary (its own seed).
constexpr std::uint64_t data_seed = 1234;
const dataset& data(std::size_t n, int dist) { return gravac_bench::data(n, dist, data_seed); }

// Draws of the data over which the nth_element baseline is taken (see BM_topk_compress).
constexpr int nth_draws = 5;

struct config {
  std::size_t n;
  double f;
  int dist;
};

config config_of(const benchmark::State& s) {
  return {std::size_t{1} << s.range(0), static_cast<double>(s.range(1)) / 10000.0, static_cast<int>(s.range(2))};
}

const std::vector<double> five_candidates{0.1, 0.033, 0.011, 0.004, 0.001};

// One compress call of a benchmark, with the untimed restore of the residual before it.
struct compress_call {
  std::function<void()> restore, call;
  std::size_t bytes = 0;  // the packet's size of the last call
};

// Runs `compress` once per iteration from the same residual (restored untimed), so each
// iteration finds the previous step's threshold exactly right: the best case.
// Sets the counters kept and ratio_to_memcpy, and with \p floor those of the
// error-feedback floor (bench_common.hpp).
template <class C>
compress_call run_compress(benchmark::State& state, C& c, const dataset& d, gravac::step_params& p,
                           std::vector<std::byte>& packet, std::vector<float>& g, std::vector<float>& e, bool floor) {
  auto st = std::make_shared<gravac::compress_stats>();
  compress_call cc;
  cc.restore = [&d, &e] { std::memcpy(e.data(), d.e0.data(), e.size() * sizeof(float)); };
  cc.call = [&c, &g, &e, &p, &packet, st] {
    benchmark::DoNotOptimize(c.compress(gravac::host_view(g), gravac::host_view(e), p, packet, *st));
  };
  // One untimed step first: it sets the guess (a training run's steady state) and touches
  // the workspace's pages once, as every later step finds them.
  cc.restore();
  cc.call();
  for (auto _ : state) {
    state.PauseTiming();
    cc.restore();
    state.ResumeTiming();
    cc.call();
  }
  cc.bytes = c.compress(gravac::host_view(g), gravac::host_view(e), p, packet, *st);
  state.counters["kept"] = static_cast<double>(st->layers[0].kept);
  set_ratio_counters(state, cc.restore, cc.call, d.g, floor ? std::optional<std::size_t>(cc.bytes) : std::nullopt);
  return cc;
}

void set_bytes(benchmark::State& state, std::size_t n) {
  // What the kernel must move at least: read g and e, write e.
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) *
                          static_cast<std::int64_t>(3 * n * sizeof(float)));
}

void BM_memcpy(benchmark::State& state) {
  const auto cfg = config_of(state);
  const auto& d = data(cfg.n, cfg.dist);
  std::vector<float> dst(cfg.n);
  for (auto _ : state) {
    std::memcpy(dst.data(), d.g.data(), cfg.n * sizeof(float));
    benchmark::DoNotOptimize(dst.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) *
                          static_cast<std::int64_t>(2 * cfg.n * sizeof(float)));
}

void BM_nth_element(benchmark::State& state) {
  const auto cfg = config_of(state);
  const auto& d = data(cfg.n, cfg.dist);
  const auto nth = nth_element_of(d, gravac::kept_count(cfg.n, cfg.f));
  for (auto _ : state) nth();
  set_bytes(state, cfg.n);
}

void BM_topk_compress(benchmark::State& state) {
  const auto cfg = config_of(state);
  const auto& d = data(cfg.n, cfg.dist);
  const auto lay = gravac::layout::flat(cfg.n);
  gravac::topk c(lay);
  std::vector<std::byte> packet(c.max_packet_bytes());
  std::vector<float> g = d.g, e = d.e0;
  auto p = gravac::step_params{};
  p.kept_fraction.assign(1, cfg.f);
  p.global_fraction = cfg.f;
  const auto cc = run_compress(state, c, d, p, packet, g, e, /*floor=*/true);
  // std::nth_element's time depends on its pivots' luck with the particular draw of the
  // data: at 2^24 it takes either about 70 ms or 150-200 ms, on Gaussian and Laplace data
  // alike (six draws of each, 2026-11-30). So the speedup is the median over nth_draws draws
  // of the same distribution (the first is the kernel's own data), each paired with the
  // kernel as the other ratios (3 pairs: nth_element is slow); min and max are printed too.
  std::vector<double> speedups;
  const std::size_t k = gravac::kept_count(cfg.n, cfg.f);
  const std::size_t calls = std::max<std::size_t>(1, calls_for(cfg.n) / 8);
  for (int draw = 0; draw < nth_draws; ++draw) {
    // The other draws are not cached: at 2^26 five draws of both laws would hold 5 GiB.
    const dataset other =
        draw == 0 ? dataset{} : make_dataset(cfg.n, cfg.dist, data_seed + 7919 * static_cast<std::uint64_t>(draw));
    speedups.push_back(1.0 / paired_ratio(cc.restore, cc.call, nth_element_of(draw == 0 ? d : other, k), calls, 3));
  }
  std::sort(speedups.begin(), speedups.end());
  state.counters["speedup_vs_nth_element"] = speedups[speedups.size() / 2];
  state.counters["speedup_vs_nth_element_min"] = speedups.front();
  state.counters["speedup_vs_nth_element_max"] = speedups.back();
  set_bytes(state, cfg.n);
}

void BM_topk_gain5(benchmark::State& state) {
  const auto cfg = config_of(state);
  const auto& d = data(cfg.n, cfg.dist);
  const auto lay = gravac::layout::flat(cfg.n);
  gravac::topk c(lay), plain(lay);
  std::vector<std::byte> packet(c.max_packet_bytes());
  std::vector<float> g = d.g, e = d.e0;
  auto p = gravac::step_params{};
  p.kept_fraction.assign(1, cfg.f);
  p.global_fraction = cfg.f;
  p.gain_candidates = five_candidates;
  const auto cc = run_compress(state, c, d, p, packet, g, e, /*floor=*/false);
  // The same selection without the gain curve, paired with it call by call (9 pairs).
  auto q = p;
  q.gain_candidates = {};
  gravac::compress_stats st;
  cc.restore();
  plain.compress(gravac::host_view(g), gravac::host_view(e), q, packet, st);  // sets the guess
  const std::function<void()> without = [&] {
    benchmark::DoNotOptimize(plain.compress(gravac::host_view(g), gravac::host_view(e), q, packet, st));
  };
  state.counters["gain_overhead"] = paired_ratio(cc.restore, cc.call, without, 1) - 1.0;
  set_bytes(state, cfg.n);
}

void BM_topk_decompress(benchmark::State& state) {
  const auto cfg = config_of(state);
  const auto& d = data(cfg.n, cfg.dist);
  const auto lay = gravac::layout::flat(cfg.n);
  gravac::topk c(lay);
  std::vector<std::byte> packet(c.max_packet_bytes());
  std::vector<float> g = d.g, e = d.e0, out(cfg.n, 0.0f);
  auto p = gravac::step_params{};
  p.kept_fraction.assign(1, cfg.f);
  p.global_fraction = cfg.f;
  gravac::compress_stats st;
  const auto bytes = c.compress(gravac::host_view(g), gravac::host_view(e), p, packet, st);
  const std::span<const std::byte> pk(packet.data(), bytes);
  auto call = [&] {
    c.decompress_add(pk, gravac::host_view(out), 0.5f);
    benchmark::DoNotOptimize(out.data());
  };
  for (auto _ : state) call();
  set_ratio_counters(
      state, [] {}, call, d.g, std::nullopt);
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) * static_cast<std::int64_t>(bytes));
}

void BM_threshold_compress(benchmark::State& state) {
  const auto cfg = config_of(state);
  const auto& d = data(cfg.n, cfg.dist);
  const auto lay = gravac::layout::flat(cfg.n);
  gravac::threshold c(lay);
  std::vector<std::byte> packet(c.max_packet_bytes());
  std::vector<float> g = d.g, e = d.e0;
  auto p = gravac::step_params{};
  p.kept_fraction.assign(1, cfg.f);
  p.global_fraction = cfg.f;
  run_compress(state, c, d, p, packet, g, e, /*floor=*/true);
  const double k = static_cast<double>(gravac::kept_count(cfg.n, cfg.f));
  state.counters["k_error"] = std::fabs(state.counters["kept"].value - k) / k;
  set_bytes(state, cfg.n);
}

void register_all() {
  struct entry {
    const char* name;
    void (*fn)(benchmark::State&);
  };
  const entry entries[] = {{"BM_memcpy", BM_memcpy},
                           {"BM_nth_element", BM_nth_element},
                           {"BM_topk_compress", BM_topk_compress},
                           {"BM_topk_gain5", BM_topk_gain5},
                           {"BM_topk_decompress", BM_topk_decompress},
                           {"BM_threshold_compress", BM_threshold_compress}};
  for (const auto& en : entries) {
    for (int lg : {16, 20, 24, 26}) {
      const std::string name = (lg == 26 ? std::string("large/") : std::string()) + en.name;
      auto* b = benchmark::RegisterBenchmark(name.c_str(), en.fn);
      for (int f : {1000, 100, 10})
        for (int dist : {0, 1}) b->Args({lg, f, dist});
      b->UseRealTime()->Unit(benchmark::kMillisecond)->MinTime(lg >= 24 ? 0.5 : 0.2);
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  register_all();
  // Without an explicit filter, leave out the 2^26 sizes (they need ~2 GiB and minutes).
  std::vector<char*> args(argv, argv + argc);
  bool filtered = false;
  for (int i = 1; i < argc; ++i) filtered = filtered || std::string(argv[i]).rfind("--benchmark_filter", 0) == 0;
  std::string default_filter = "--benchmark_filter=-large/";
  if (!filtered) args.push_back(default_filter.data());
  int n = static_cast<int>(args.size());
  benchmark::Initialize(&n, args.data());
  if (benchmark::ReportUnrecognizedArguments(n, args.data())) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
