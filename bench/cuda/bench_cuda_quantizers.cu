// The device quantizers (qsgd_cuda, terngrad_cuda, sign_cuda, cast16_cuda) against the
// device's copy bandwidth measured in the same binary (cudaMemcpy device to device of the
// same n floats). Timed with CUDA events (UseManualTime); one compress per iteration, the
// residual carried over as in training.
//
// Counters: copy_fraction = (bytes a quantizer must move: read g and e, write e, write the
// packet) per second over the copy's bytes per second of the same run.
#include <benchmark/benchmark.h>

#include <cstdio>
#include <random>
#include <vector>

#include "gravac/cuda/cast16_cuda.hpp"
#include "gravac/cuda/qsgd_cuda.hpp"
#include "gravac/cuda/sign_cuda.hpp"
#include "gravac/cuda/terngrad_cuda.hpp"

namespace {

// Copy times of this run, by log2 N (so the ratios compare like with like).
double copy_seconds[64] = {};

int log2_of(std::size_t n) {
  int b = 0;
  while ((std::size_t{1} << b) < n) ++b;
  return b;
}

struct events {
  cudaEvent_t a{}, b{};
  events() {
    GRAVAC_TRY_CUDA(cudaEventCreate(&a));
    GRAVAC_TRY_CUDA(cudaEventCreate(&b));
  }
  ~events() {
    cudaEventDestroy(a);
    cudaEventDestroy(b);
  }
  double seconds() {
    GRAVAC_TRY_CUDA(cudaEventSynchronize(b));
    float ms = 0;
    GRAVAC_TRY_CUDA(cudaEventElapsedTime(&ms, a, b));
    return ms * 1e-3;
  }
};

gravac::device_buffer<float> gaussian(std::size_t n, std::uint64_t seed, float scale) {
  std::vector<float> h(n);
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> d(0.0f, scale);
  for (auto& x : h) x = d(rng);
  gravac::device_buffer<float> b(n);
  GRAVAC_TRY_CUDA(cudaMemcpy(b.data(), h.data(), n * sizeof(float), cudaMemcpyHostToDevice));
  return b;
}

// Baseline: copy of the n floats (device to device); bytes moved = read + write.
void BM_copy(benchmark::State& state) {
  const auto n = static_cast<std::size_t>(state.range(0));
  auto src = gaussian(n, 1, 1.0f);
  gravac::device_buffer<float> dst(n);
  events ev;
  double total = 0;
  for (auto _ : state) {
    GRAVAC_TRY_CUDA(cudaEventRecord(ev.a, cudaStreamPerThread));
    GRAVAC_TRY_CUDA(cudaMemcpyAsync(dst.data(), src.data(), n * sizeof(float), cudaMemcpyDeviceToDevice, cudaStreamPerThread));
    GRAVAC_TRY_CUDA(cudaEventRecord(ev.b, cudaStreamPerThread));
    const double s = ev.seconds();
    state.SetIterationTime(s);
    total += s;
  }
  copy_seconds[log2_of(n)] = total / static_cast<double>(state.iterations());
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * 2 * n * sizeof(float)));
}

// One quantizer on one layer of n elements.
template <class C>
void run(benchmark::State& state, typename C::options opt) {
  const auto n = static_cast<std::size_t>(state.range(0));
  auto lay = gravac::layout::flat(n);
  opt.stream = cudaStreamPerThread;
  C c(lay, opt);
  auto g = gaussian(n, 3, 1.0f);
  auto e = gaussian(n, 4, 0.1f);
  gravac::device_buffer<std::byte> packet(c.max_packet_bytes());
  gravac::step_params p;
  p.kept_fraction.assign(1, 0.5);  // below 1: quantized
  gravac::compress_stats st;
  std::size_t bytes = c.compress(gravac::device_view(g), gravac::device_view(e), p, packet.span(), st);  // warm-up
  events ev;
  double total = 0;
  for (auto _ : state) {
    ++p.step;
    GRAVAC_TRY_CUDA(cudaEventRecord(ev.a, cudaStreamPerThread));
    bytes = c.compress(gravac::device_view(g), gravac::device_view(e), p, packet.span(), st);
    GRAVAC_TRY_CUDA(cudaEventRecord(ev.b, cudaStreamPerThread));
    const double s = ev.seconds();
    state.SetIterationTime(s);
    total += s;
  }
  const double per = total / static_cast<double>(state.iterations());
  const double moved = 3.0 * static_cast<double>(n) * sizeof(float) + static_cast<double>(bytes);
  state.SetBytesProcessed(static_cast<std::int64_t>(static_cast<double>(state.iterations()) * moved));
  const int b = log2_of(n);
  if (copy_seconds[b] > 0) {
    const double copy_rate = 2.0 * static_cast<double>(n) * sizeof(float) / copy_seconds[b];
    state.counters["copy_fraction"] = (moved / per) / copy_rate;
  }
  state.counters["packet_bytes"] = static_cast<double>(bytes);
}

// range(1): QSGD levels; range(2): bucket (0: one norm per layer).
void BM_qsgd_cuda(benchmark::State& state) {
  gravac::qsgd_cuda_options o;
  o.levels = static_cast<std::uint32_t>(state.range(1));
  o.bucket = static_cast<std::uint32_t>(state.range(2));
  run<gravac::qsgd_cuda>(state, o);
}
void BM_terngrad_cuda(benchmark::State& state) { run<gravac::terngrad_cuda>(state, {}); }
void BM_sign_cuda(benchmark::State& state) { run<gravac::sign_cuda>(state, {}); }
void BM_cast16_cuda(benchmark::State& state) {
  gravac::cast16_cuda_options o;
  o.format = state.range(1) ? gravac::cast16_format::bf16 : gravac::cast16_format::fp16;
  run<gravac::cast16_cuda>(state, o);
}

}  // namespace

BENCHMARK(BM_copy)->UseManualTime()->Unit(benchmark::kMicrosecond)->Arg(1 << 20)->Arg(1 << 24)->Arg(1 << 26);
BENCHMARK(BM_qsgd_cuda)
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond)
    ->Args({1 << 24, 127, 512})
    ->Args({1 << 26, 127, 512})
    ->Args({1 << 26, 7, 512})
    ->Args({1 << 26, 127, 0});
BENCHMARK(BM_terngrad_cuda)->UseManualTime()->Unit(benchmark::kMicrosecond)->Arg(1 << 24)->Arg(1 << 26);
BENCHMARK(BM_sign_cuda)->UseManualTime()->Unit(benchmark::kMicrosecond)->Arg(1 << 20)->Arg(1 << 24)->Arg(1 << 26);
BENCHMARK(BM_cast16_cuda)->UseManualTime()->Unit(benchmark::kMicrosecond)->Args({1 << 26, 0})->Args({1 << 26, 1});

int main(int argc, char** argv) {
  if (gravac::visible_cuda_devices() == 0) {
    std::printf("SKIPPED: no CUDA device visible\n");
    return 77;
  }
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
