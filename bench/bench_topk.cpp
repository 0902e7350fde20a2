// CPU selection kernels against their baselines, measured in the same process:
// fused error-feedback top-k (compress, decompress), threshold selection, the gain curve
// on top of selection, a memcpy of the same buffer and copy + abs + std::nth_element.
//
// Each benchmark times its kernel per iteration and, after the loop, the baselines on the
// same buffers, and prints the ratios as counters:
//   ratio_to_memcpy        kernel time / memcpy time (the target for top-k is <= 2)
//   speedup_vs_nth_element nth_element time / kernel time (target >= 5)
//   gain_overhead          time with 5 gain candidates / time without - 1 (target <= 0.10)
//
// Arguments: log2 N, kept fraction in 1/10000 (1000 = 10%, 100 = 1%, 10 = 0.1%), data
// (0 Gaussian, 1 Laplace). Sizes 2^16, 2^20 and 2^24 run by default; 2^26 is registered
// with the prefix "large/" and runs only when selected, e.g.
//   bench_topk --benchmark_filter='large/BM_topk_compress/26/100/0'
// Build with CMAKE_BUILD_TYPE=Release for figures.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <functional>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "gravac/compress/threshold.hpp"
#include "gravac/compress/topk.hpp"

namespace {

using clock_type = std::chrono::steady_clock;

double seconds(clock_type::time_point a, clock_type::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// Gradient and residual of one (N, distribution), generated once per process.
struct dataset {
  std::vector<float> g, e0;
};

const dataset& data(std::size_t n, int dist) {
  static std::map<std::pair<std::size_t, int>, dataset> cache;
  auto& d = cache[{n, dist}];
  if (d.g.size() == n) return d;
  std::mt19937_64 rng(1234 + n + dist);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::exponential_distribution<float> expo(1.0f);
  auto draw = [&] { return dist == 0 ? normal(rng) : ((rng() & 1) ? 1.0f : -1.0f) * expo(rng); };
  d.g.resize(n);
  d.e0.resize(n);
  for (auto& x : d.g) x = draw();
  for (auto& x : d.e0) x = 0.3f * draw();  // a residual of a few earlier steps
  return d;
}

// Median time of fn over reps runs (at least 3, more for short ones, at most ~0.3 s).
double median_time(const std::function<void()>& fn) {
  std::vector<double> t;
  double total = 0;
  while (t.size() < 3 || (total < 0.3 && t.size() < 50)) {
    const auto a = clock_type::now();
    fn();
    const auto b = clock_type::now();
    t.push_back(seconds(a, b));
    total += t.back();
  }
  std::nth_element(t.begin(), t.begin() + static_cast<std::ptrdiff_t>(t.size() / 2), t.end());
  return t[t.size() / 2];
}

double memcpy_time(const std::vector<float>& src) {
  static std::vector<float> dst;
  dst.resize(src.size());
  return median_time([&] {
    std::memcpy(dst.data(), src.data(), src.size() * sizeof(float));
    benchmark::DoNotOptimize(dst.data());
    benchmark::ClobberMemory();
  });
}

// The naive baseline: |g + e| copied out, then std::nth_element for the k-th largest.
double nth_element_time(const dataset& d, std::size_t k) {
  static std::vector<float> tmp;
  tmp.resize(d.g.size());
  return median_time([&] {
    for (std::size_t i = 0; i < tmp.size(); ++i) tmp[i] = std::fabs(d.g[i] + d.e0[i]);
    std::nth_element(tmp.begin(), tmp.begin() + static_cast<std::ptrdiff_t>(k - 1), tmp.end(), std::greater<>());
    benchmark::DoNotOptimize(tmp.data());
  });
}

struct config {
  std::size_t n;
  double f;
  int dist;
};

config config_of(const benchmark::State& s) {
  return {std::size_t{1} << s.range(0), static_cast<double>(s.range(1)) / 10000.0, static_cast<int>(s.range(2))};
}

const std::vector<double> five_candidates{0.1, 0.033, 0.011, 0.004, 0.001};

// Runs `compress` once per iteration from the same residual (restored untimed), so each
// iteration sees the steady state of a training run: the previous step's threshold fits.
template <class C>
double run_compress(benchmark::State& state, C& c, const dataset& d, gravac::step_params& p,
                    std::vector<std::byte>& packet, std::vector<float>& g, std::vector<float>& e) {
  gravac::compress_stats st;
  double total = 0;
  std::size_t kept = 0;
  // One untimed step first: it sets the guess (a training run's steady state) and touches
  // the workspace's pages once, as every later step finds them.
  std::memcpy(e.data(), d.e0.data(), e.size() * sizeof(float));
  c.compress(gravac::host_view(g), gravac::host_view(e), p, packet, st);
  for (auto _ : state) {
    state.PauseTiming();
    std::memcpy(e.data(), d.e0.data(), e.size() * sizeof(float));
    state.ResumeTiming();
    const auto a = clock_type::now();
    const auto bytes = c.compress(gravac::host_view(g), gravac::host_view(e), p, packet, st);
    total += seconds(a, clock_type::now());
    benchmark::DoNotOptimize(bytes);
    kept = st.layers[0].kept;
  }
  state.counters["kept"] = static_cast<double>(kept);
  return total / static_cast<double>(state.iterations());
}

void set_bytes(benchmark::State& state, std::size_t n) {
  // What the kernel must move at least: read g and e, write e.
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) * static_cast<std::int64_t>(3 * n * sizeof(float)));
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
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) * static_cast<std::int64_t>(2 * cfg.n * sizeof(float)));
}

void BM_nth_element(benchmark::State& state) {
  const auto cfg = config_of(state);
  const auto& d = data(cfg.n, cfg.dist);
  const std::size_t k = gravac::kept_count(cfg.n, cfg.f);
  std::vector<float> tmp(cfg.n);
  for (auto _ : state) {
    for (std::size_t i = 0; i < cfg.n; ++i) tmp[i] = std::fabs(d.g[i] + d.e0[i]);
    std::nth_element(tmp.begin(), tmp.begin() + static_cast<std::ptrdiff_t>(k - 1), tmp.end(), std::greater<>());
    benchmark::DoNotOptimize(tmp.data());
  }
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
  const double t = run_compress(state, c, d, p, packet, g, e);
  const double tm = memcpy_time(d.g);
  const double tn = nth_element_time(d, gravac::kept_count(cfg.n, cfg.f));
  state.counters["ratio_to_memcpy"] = t / tm;
  state.counters["speedup_vs_nth_element"] = tn / t;
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
  const double t = run_compress(state, c, d, p, packet, g, e);
  // The same selection without the gain curve, timed the same way (median of runs).
  auto q = p;
  q.gain_candidates = {};
  gravac::compress_stats st;
  std::memcpy(e.data(), d.e0.data(), e.size() * sizeof(float));
  plain.compress(gravac::host_view(g), gravac::host_view(e), q, packet, st);  // sets the guess
  std::vector<double> with, without;
  for (int r = 0; r < 7; ++r) {
    for (int which = 0; which < 2; ++which) {
      std::memcpy(e.data(), d.e0.data(), e.size() * sizeof(float));
      const auto a = clock_type::now();
      if (which == 0)
        c.compress(gravac::host_view(g), gravac::host_view(e), p, packet, st);
      else
        plain.compress(gravac::host_view(g), gravac::host_view(e), q, packet, st);
      (which == 0 ? with : without).push_back(seconds(a, clock_type::now()));
    }
  }
  std::sort(with.begin(), with.end());
  std::sort(without.begin(), without.end());
  state.counters["gain_overhead"] = with[3] / without[3] - 1.0;
  state.counters["ratio_to_memcpy"] = t / memcpy_time(d.g);
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
  double total = 0;
  for (auto _ : state) {
    const auto a = clock_type::now();
    c.decompress_add(pk, gravac::host_view(out), 0.5f);
    total += seconds(a, clock_type::now());
    benchmark::DoNotOptimize(out.data());
  }
  const double t = total / static_cast<double>(state.iterations());
  state.counters["ratio_to_memcpy"] = t / memcpy_time(d.g);
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
  const double t = run_compress(state, c, d, p, packet, g, e);
  const double k = static_cast<double>(gravac::kept_count(cfg.n, cfg.f));
  state.counters["k_error"] = std::fabs(state.counters["kept"].value - k) / k;
  state.counters["ratio_to_memcpy"] = t / memcpy_time(d.g);
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
