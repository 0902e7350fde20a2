// AdaComp, the quantizers (QSGD, TernGrad, EF-sign, cast16, the block-scaled mxfp8 E4M3,
// mxfp4 and nvfp4 with rounding to nearest even) and PowerSGD: compress and
// decompress against a memcpy of the same buffer, measured in the same process (and
// BM_nth_element, copy + abs + std::nth_element at 1%, the selection baseline, for scale).
// Every call compresses the same gradient: the best case. bench_dynamic times the
// error-feedback path as training runs it (a fresh gradient every step).
//
// Counters: ratio_to_memcpy = kernel time per call / memcpy time of the gradient buffer
// (N floats), the median of 9 ratios of neighbouring timings (bench_common.hpp's
// paired_ratio: the VM's bandwidth drifts over seconds). Target for the quantizers:
// <= 1.5 at N = 2^24, one thread. Compress also prints ef_floor_to_memcpy, the
// error-feedback floor (bench_common.hpp: read g and e, write e and a packet of the
// kernel's size) against memcpy, and ratio_to_ef_floor, the kernel against that floor:
// what no kernel of this packet size can go below, and how far above it this one is
// (EF-sign's floor passes over e twice, as its layer-wide scale requires).
// On a processor with AVX2, compress of the dispatched quantizers also prints
// avx2_speedup: the same compress with the baseline (SSE2) kernels / with the AVX2 ones
// (see gravac/core/detail/isa_dispatch.hpp), medians in the same run.
//
// Arguments: log2 N, data (0 Gaussian, 1 Laplace). Sizes 2^16, 2^20 and 2^24 run by
// default; 2^26 is registered with the prefix "large/" and runs only when selected, e.g.
//   bench_quantizers --benchmark_filter='large/BM_compress_qsgd'
// Build with CMAKE_BUILD_TYPE=Release for figures.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include "bench_common.hpp"
#include "gravac/compress/adacomp.hpp"
#include "gravac/compress/block_scaled.hpp"
#include "gravac/compress/cast16.hpp"
#include "gravac/compress/qsgd.hpp"
#include "gravac/compress/sign.hpp"
#include "gravac/compress/terngrad.hpp"
#include "gravac/core/detail/isa_dispatch.hpp"
#if __has_include(<Eigen/Core>)
#include "gravac/compress/powersgd.hpp"
#define GRAVAC_BENCH_POWERSGD 1
#endif

namespace {

using namespace gravac_bench;

// The data of this binary (its own seed).
const dataset& data(std::size_t n, int dist) { return gravac_bench::data(n, dist, 4321); }

// One layer of N elements; PowerSGD gets a matrix of about sqrt(N) x sqrt(N).
gravac::layout layout_for(std::size_t n, bool matrix) {
  gravac::layout lay;
  if (matrix) {
    std::size_t rows = 1;
    while (rows * rows * 4 <= n) rows *= 2;
    lay.add("w", {rows, n / rows}, gravac::layer_kind::dense);
  } else {
    lay.add("w", {n}, gravac::layer_kind::dense);
  }
  return lay;
}

// EF-sign needs its layer's one scale (the mean |u|) before any residual: a second pass
// over e on a layer larger than the cache, which its floor has too. (AdaComp's scale comes
// first as well, but only its sent elements are revisited.)
template <class C>
constexpr bool layer_scale_first = std::is_same_v<C, gravac::sign>;

// The compressors whose kernels run through with_best_isa (AdaComp and PowerSGD do not).
template <class C>
constexpr bool isa_dispatched = std::is_same_v<C, gravac::qsgd> || std::is_same_v<C, gravac::terngrad> ||
                                std::is_same_v<C, gravac::sign> || std::is_same_v<C, gravac::cast16>;

template <class C>
void run(benchmark::State& state, typename C::options opt, bool decompress, bool matrix = false) {
  const std::size_t n = std::size_t{1} << state.range(0);
  const auto& d = data(n, static_cast<int>(state.range(1)));
  const auto lay = layout_for(n, matrix);
  C c(lay, opt);
  std::vector<float> g = d.g, e = d.e0, out(n, 0.0f);
  std::vector<std::byte> packet(c.max_packet_bytes());
  gravac::step_params p;
  p.kept_fraction = {0.01};
  p.ranks = 4;
  p.seed = 1;
  gravac::compress_stats st;
  std::size_t bytes = c.compress(gravac::host_view(g), gravac::host_view(e), p, packet, st);
  auto call = [&] {
    if (decompress) {
      c.decompress_add(std::span<const std::byte>(packet.data(), bytes), gravac::host_view(out), 0.25f);
      benchmark::DoNotOptimize(out.data());
    } else {
      ++p.step;
      bytes = c.compress(gravac::host_view(g), gravac::host_view(e), p, packet, st);
      benchmark::DoNotOptimize(packet.data());
    }
    benchmark::ClobberMemory();
  };
  for (auto _ : state) call();
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * n * sizeof(float)));
  state.counters["bits_per_element"] = 8.0 * static_cast<double>(bytes) / static_cast<double>(n);
  set_ratio_counters(
      state, [] {}, call, d.g, decompress ? std::nullopt : std::optional<std::size_t>(bytes), layer_scale_first<C>);
  if (isa_dispatched<C> && !decompress && gravac::detail::runs_avx2_kernels()) {
    // The same compress with the kernels built for the baseline instruction set (what a
    // processor without AVX2 runs), against the AVX2 ones, paired in this run.
    const double best_to_memcpy = state.counters["ratio_to_memcpy"].value;
    gravac::detail::kernel_isa_choice().store(gravac::detail::kernel_isa::baseline);
    const double base_to_memcpy = paired_ratio([] {}, call, memcpy_of(d.g), calls_for(n), 5);
    gravac::detail::kernel_isa_choice().store(gravac::detail::kernel_isa::best);
    state.counters["avx2_speedup"] = base_to_memcpy / best_to_memcpy;
  }
}

void sizes(benchmark::internal::Benchmark* b) {
  for (int k : {16, 20, 24})
    for (int dist : {0, 1}) b->Args({k, dist});
  b->ArgNames({"log2N", "laplace"})->UseRealTime()->Unit(benchmark::kMillisecond);
}
void large(benchmark::internal::Benchmark* b) {
  for (int dist : {0, 1}) b->Args({26, dist});
  b->ArgNames({"log2N", "laplace"})->UseRealTime()->Unit(benchmark::kMillisecond);
}

void BM_memcpy(benchmark::State& state) {
  const std::size_t n = std::size_t{1} << state.range(0);
  const auto& d = data(n, static_cast<int>(state.range(1)));
  std::vector<float> dst(n);
  for (auto _ : state) {
    std::memcpy(dst.data(), d.g.data(), n * sizeof(float));
    benchmark::DoNotOptimize(dst.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * n * sizeof(float)));
}

// The naive selection baseline of bench_topk (copy + abs + std::nth_element, 1% kept), in
// this binary too for scale: what a hand-written top-k costs beside the quantizers.
void BM_nth_element(benchmark::State& state) {
  const std::size_t n = std::size_t{1} << state.range(0);
  const auto& d = data(n, static_cast<int>(state.range(1)));
  const auto nth = nth_element_of(d, gravac::kept_count(n, 0.01));
  for (auto _ : state) nth();
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * n * sizeof(float)));
}

#define GRAVAC_QBENCH(name, type, opts, matrix)                                                \
  void BM_compress_##name(benchmark::State& s) { run<gravac::type>(s, opts, false, matrix); }  \
  void BM_decompress_##name(benchmark::State& s) { run<gravac::type>(s, opts, true, matrix); } \
  BENCHMARK(BM_compress_##name)->Apply(sizes);                                                 \
  BENCHMARK(BM_decompress_##name)->Apply(sizes);                                               \
  BENCHMARK(BM_compress_##name)->Name("large/BM_compress_" #name)->Apply(large);               \
  BENCHMARK(BM_decompress_##name)->Name("large/BM_decompress_" #name)->Apply(large);

BENCHMARK(BM_memcpy)->Apply(sizes);
BENCHMARK(BM_memcpy)->Name("large/BM_memcpy")->Apply(large);
BENCHMARK(BM_nth_element)->Apply(sizes);
BENCHMARK(BM_nth_element)->Name("large/BM_nth_element")->Apply(large);
GRAVAC_QBENCH(adacomp, adacomp, gravac::adacomp_options{}, false)
GRAVAC_QBENCH(qsgd_s127, qsgd, (gravac::qsgd_options{.levels = 127, .bucket = 512}), false)
GRAVAC_QBENCH(qsgd_s7, qsgd, (gravac::qsgd_options{.levels = 7, .bucket = 64}),
              false)  // s >= sqrt(B): bounded residual
GRAVAC_QBENCH(terngrad, terngrad, gravac::terngrad_options{}, false)
GRAVAC_QBENCH(sign, sign, gravac::sign_options{}, false)
GRAVAC_QBENCH(cast16_fp16, cast16, gravac::cast16_options{.format = gravac::cast16_format::fp16}, false)
GRAVAC_QBENCH(cast16_bf16, cast16, gravac::cast16_options{.format = gravac::cast16_format::bf16}, false)
GRAVAC_QBENCH(mxfp8_e4m3, mxfp8, gravac::mxfp8_options{.element = gravac::mxfp8_element::e4m3}, false)
GRAVAC_QBENCH(mxfp4, mxfp4, gravac::mxfp4_options{}, false)
GRAVAC_QBENCH(nvfp4, nvfp4, gravac::nvfp4_options{}, false)
#ifdef GRAVAC_BENCH_POWERSGD
GRAVAC_QBENCH(powersgd_r4, powersgd, gravac::powersgd_options{.rank = 4}, true)
#endif

}  // namespace

BENCHMARK_MAIN();
