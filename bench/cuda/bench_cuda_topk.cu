// The fused error-feedback top-k on the device against two baselines measured in the same
// binary: the device's copy bandwidth (cudaMemcpy device to device of the same bytes)
// and a sort-based selection (|u| computed, then cub::DeviceRadixSort of (|u|, index)
// pairs, the naive way to find the top k). Timed with CUDA events (UseManualTime).
//
// Counters of BM_topk_cuda: bytes_per_s (the bytes top-k must move: read g and e, write e,
// write the packet), copy_fraction (that rate over the copy's rate of the same run) and
// speedup_vs_sort. Targets on an H200 at N = 2^26, 1%: copy_fraction >= 0.5, speedup >= 3.
// BM_threshold_cuda (threshold_cuda, the estimate from a seeded sample, then one fused pass)
// reports the same counters plus k_error = |k_hat - k| / k.
// BM_adacomp_cuda (AdaComp, bin length L_T = second argument) reports bytes_per_s and
// copy_fraction of the same bytes (read g and e, write e, write the packet) and the count sent.
#include <benchmark/benchmark.h>

#include <cub/device/device_radix_sort.cuh>

#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "gravac/cuda/adacomp_cuda.hpp"
#include "gravac/cuda/threshold_cuda.hpp"
#include "gravac/cuda/topk_cuda.hpp"

namespace {

// Times of the baselines of this run, by N (so the ratios compare like with like).
double copy_seconds[64] = {};
double sort_seconds[64] = {};

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

__global__ void abs_and_iota(const float* u, float* key, std::uint32_t* idx, std::size_t n) {
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    key[i] = fabsf(u[i]);
    idx[i] = static_cast<std::uint32_t>(i);
  }
}

// Baseline 1: copy of the n floats (device to device); bytes moved = read + write.
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

// Baseline 2: sort-based selection: |u| and indices, then a descending radix sort of the
// pairs (the top k are then the first k).
void BM_sort_select(benchmark::State& state) {
  const auto n = static_cast<std::size_t>(state.range(0));
  auto u = gaussian(n, 2, 1.0f);
  gravac::device_buffer<float> keys(n), keys_out(n);
  gravac::device_buffer<std::uint32_t> idx(n), idx_out(n);
  std::size_t temp = 0;
  GRAVAC_TRY_CUDA(cub::DeviceRadixSort::SortPairsDescending(nullptr, temp, keys.data(), keys_out.data(), idx.data(),
                                                            idx_out.data(), static_cast<int>(n)));
  gravac::device_buffer<std::byte> tmp(temp);
  events ev;
  double total = 0;
  for (auto _ : state) {
    GRAVAC_TRY_CUDA(cudaEventRecord(ev.a, cudaStreamPerThread));
    abs_and_iota<<<1024, 256, 0, cudaStreamPerThread>>>(u.data(), keys.data(), idx.data(), n);
    GRAVAC_TRY_CUDA(cub::DeviceRadixSort::SortPairsDescending(tmp.data(), temp, keys.data(), keys_out.data(),
                                                              idx.data(), idx_out.data(), static_cast<int>(n), 0,
                                                              32, cudaStreamPerThread));
    GRAVAC_TRY_CUDA(cudaEventRecord(ev.b, cudaStreamPerThread));
    const double s = ev.seconds();
    state.SetIterationTime(s);
    total += s;
  }
  sort_seconds[log2_of(n)] = total / static_cast<double>(state.iterations());
}

// The fused error-feedback top-k, or threshold selection (one compress per iteration;
// g is refreshed from a pristine copy outside the timed region so every step sees
// comparable data).
template <class C>
void BM_select(benchmark::State& state) {
  const auto n = static_cast<std::size_t>(state.range(0));
  const double f = static_cast<double>(state.range(1)) / 10000.0;
  auto lay = gravac::layout::flat(n);
  typename C::options opt;
  opt.stream = cudaStreamPerThread;
  C c(lay, opt);
  auto g = gaussian(n, 3, 1.0f);
  auto e = gaussian(n, 4, 0.1f);
  gravac::device_buffer<std::byte> packet(c.max_packet_bytes());
  gravac::step_params p;
  p.kept_fraction.assign(1, f);
  p.global_fraction = f;
  gravac::compress_stats st;
  std::size_t bytes = c.compress(gravac::device_view(g), gravac::device_view(e), p, packet.span(), st);  // warm-up
  events ev;
  double total = 0;
  for (auto _ : state) {
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
  if (sort_seconds[b] > 0) state.counters["speedup_vs_sort"] = sort_seconds[b] / per;
  state.counters["k"] = static_cast<double>(st.layers[0].kept);
  // threshold: |k_hat - k| / k (0 for exact top-k).
  const double k = static_cast<double>(gravac::kept_count(n, f));
  state.counters["k_error"] = k > 0 ? std::fabs(static_cast<double>(st.layers[0].kept) - k) / k : 0.0;
}
void BM_topk_cuda(benchmark::State& state) { BM_select<gravac::topk_cuda>(state); }
void BM_threshold_cuda(benchmark::State& state) { BM_select<gravac::threshold_cuda>(state); }

// AdaComp on one convolution layer of n elements with bins of L_T elements.
void BM_adacomp_cuda(benchmark::State& state) {
  const auto n = static_cast<std::size_t>(state.range(0));
  gravac::layout lay;
  lay.add("conv", {n}, gravac::layer_kind::conv);
  gravac::adacomp_cuda_options opt;
  opt.stream = cudaStreamPerThread;
  opt.bins.conv_bin = static_cast<std::uint32_t>(state.range(1));
  gravac::adacomp_cuda c(lay, opt);
  auto g = gaussian(n, 3, 1.0f);
  auto e = gaussian(n, 4, 0.1f);
  gravac::device_buffer<std::byte> packet(c.max_packet_bytes());
  gravac::step_params p;
  p.kept_fraction.assign(1, 0.5);  // below 1: compressed (AdaComp decides how many)
  gravac::compress_stats st;
  std::size_t bytes = c.compress(gravac::device_view(g), gravac::device_view(e), p, packet.span(), st);  // warm-up
  events ev;
  double total = 0;
  for (auto _ : state) {
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
  state.counters["sent"] = static_cast<double>(st.layers[0].kept);
}

}  // namespace

// Baselines first, so the top-k runs can report ratios to them.
BENCHMARK(BM_copy)->UseManualTime()->Unit(benchmark::kMicrosecond)->Arg(1 << 20)->Arg(1 << 24)->Arg(1 << 26);
BENCHMARK(BM_sort_select)->UseManualTime()->Unit(benchmark::kMicrosecond)->Arg(1 << 20)->Arg(1 << 24)->Arg(1 << 26);
BENCHMARK(BM_topk_cuda)
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond)
    ->Args({1 << 20, 100})
    ->Args({1 << 24, 100})
    ->Args({1 << 26, 1000})
    ->Args({1 << 26, 100})
    ->Args({1 << 26, 10});
BENCHMARK(BM_threshold_cuda)
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond)
    ->Args({1 << 24, 100})
    ->Args({1 << 26, 1000})
    ->Args({1 << 26, 100})
    ->Args({1 << 26, 10});
BENCHMARK(BM_adacomp_cuda)
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond)
    ->Args({1 << 24, 50})
    ->Args({1 << 26, 50})
    ->Args({1 << 26, 500});

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
