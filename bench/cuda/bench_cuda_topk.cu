// The fused error-feedback top-k on the device against its peers, measured in the same
// binary on the same buffers under the same dynamics (a fresh gradient every step, the
// residual carried, timed once it has settled: bench_cuda_util.hpp's time_compress):
//   BM_copy         the device's copy bandwidth (cudaMemcpy device to device), the floor;
//   BM_sort_select  |u| and indices, then cub::DeviceRadixSort of the pairs (the naive way);
//   BM_unfused_topk the path a user would write otherwise: an add kernel (e += g),
//                   cub::DeviceTopK over |e|, a gather of the values and a zeroing kernel.
//                   Built only when CMake finds a CCCL with cub/device/device_topk.cuh
//                   (GRAVAC_CCCL_TOPK_INCLUDE; CUDA 13.0's CCCL 3.0 lacks it), which then
//                   compiles this whole file.
// Timed with CUDA events (UseManualTime).
//
// BM_topk_cuda/N/F/W (F: kept fraction in 1/10000; W: 1 one selection over the whole
// buffer, 0 one per layer, on 16 equal layers) reports copy_fraction (the rate of the bytes
// top-k must move: read g and e, write e, write the packet, over the copy's rate of the same
// run), speedup_vs_unfused (BM_unfused_topk of the same N and F over this) and
// speedup_vs_sort. Targets on an H200 at N = 2^26, 1%: copy_fraction >= 0.5,
// speedup_vs_unfused >= 2.
// BM_threshold_cuda (threshold_cuda, the estimate from a seeded sample, then one fused pass)
// reports the same counters plus k_error = |k_hat - k| / k.
// BM_adacomp_cuda (AdaComp, bin length L_T = second argument) reports copy_fraction of the
// same bytes and the count sent.
// BM_model_topk_cuda/M/F/E and BM_model_threshold_cuda/M/F/E: a real model's tensors (M: 0
// ResNet-50, 161 tensors of 25.6M parameters; 1 GPT-2 small, 148 tensors of 124M;
// model_layouts.hpp), one selection per tensor, or (E = 1, run first) the same total as 16
// equal layers. The model rows report model_over_equal, their time over the equal layers'
// of the same run: what the per-tensor work (launches above all) costs on a real layer mix.
#include <benchmark/benchmark.h>

#include <cmath>
#include <cub/device/device_radix_sort.cuh>
#include <map>
#include <string>
#include <tuple>
#include <utility>
#ifdef GRAVAC_BENCH_CUB_TOPK
#include <cub/device/device_topk.cuh>
#include <cuda/iterator>
#include <cuda/stream_ref>
#endif

#include "bench_cuda_util.hpp"
#include "gravac/cuda/adacomp_cuda.hpp"
#include "gravac/cuda/threshold_cuda.hpp"
#include "gravac/cuda/topk_cuda.hpp"
#include "model_layouts.hpp"

namespace {

using gravac::bench::BM_copy;
using gravac::bench::gaussian;
using gravac::bench::log2_of;

// Times of the sort baseline of this run, by log2 N (the copy's are in bench_cuda_util.hpp).
double sort_seconds[64] = {};
// Times of the unfused path of this run, by (log2 N, fraction in 1/10000).
std::map<std::pair<int, long>, double> unfused_seconds;

// Layers of the per-layer and whole-buffer runs: a model's buffer as 16 equal layers.
constexpr std::size_t bench_layers = 16;
gravac::layout layers_of(std::size_t n) {
  gravac::layout lay;
  for (std::size_t i = 0; i < bench_layers; ++i)
    lay.add("l" + std::to_string(i), {n / bench_layers + (i < n % bench_layers ? 1 : 0)}, gravac::layer_kind::dense);
  return lay;
}

__global__ void abs_and_iota(const float* u, float* key, std::uint32_t* idx, std::size_t n) {
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    key[i] = fabsf(u[i]);
    idx[i] = static_cast<std::uint32_t>(i);
  }
}

// Baseline 1: BM_copy (bench_cuda_util.hpp), the device's copy bandwidth.

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
  sort_seconds[log2_of(n)] = gravac::bench::timed_loop(
      state, cudaStreamPerThread, [] {},
      [&] {
        abs_and_iota<<<1024, 256, 0, cudaStreamPerThread>>>(u.data(), keys.data(), idx.data(), n);
        GRAVAC_TRY_CUDA(cub::DeviceRadixSort::SortPairsDescending(tmp.data(), temp, keys.data(), keys_out.data(),
                                                                  idx.data(), idx_out.data(), static_cast<int>(n), 0,
                                                                  32, cudaStreamPerThread));
      });
}

#ifdef GRAVAC_BENCH_CUB_TOPK
__global__ void add_into(const float* g, float* e, std::size_t n) {
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x)
    e[i] += g[i];
}
__global__ void gather_values(const float* e, const std::uint32_t* idx, float* values, std::size_t k) {
  for (std::size_t j = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; j < k;
       j += static_cast<std::size_t>(gridDim.x) * blockDim.x)
    values[j] = e[idx[j]];
}
__global__ void zero_at(float* e, const std::uint32_t* idx, std::size_t k) {
  for (std::size_t j = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; j < k;
       j += static_cast<std::size_t>(gridDim.x) * blockDim.x)
    e[idx[j]] = 0.0f;
}
struct abs_value {
  __host__ __device__ float operator()(float x) const { return fabsf(x); }
};

// The unfused error-feedback top-k over the whole buffer: e += g; the k largest |e| and
// their indices (cub::DeviceTopK, unordered, its fastest mode); values = e[idx]; e[idx] = 0.
// The packet (indices and values) is the fused kernel's in content, not in layout.
void BM_unfused_topk(benchmark::State& state) {
  const auto n = static_cast<std::size_t>(state.range(0));
  const std::size_t k = gravac::kept_count(n, static_cast<double>(state.range(1)) / 10000.0);
  const cudaStream_t s = cudaStreamPerThread;
  gravac::device_buffer<float> g(n), keys_out(k), values(k);
  gravac::device_buffer<std::uint32_t> idx(k);
  auto e = gaussian(n, 4, 0.1f);
  const auto env = cuda::std::execution::env{cuda::stream_ref{s},
                                             cuda::execution::require(cuda::execution::determinism::not_guaranteed,
                                                                      cuda::execution::output_ordering::unsorted)};
  const auto keys = cuda::transform_iterator(static_cast<const float*>(e.data()), abs_value{});
  const auto iota = cuda::counting_iterator<std::uint32_t>(0);
  std::size_t temp = 0;
  GRAVAC_TRY_CUDA(cub::DeviceTopK::MaxPairs(nullptr, temp, keys, keys_out.data(), iota, idx.data(), n, k, env));
  gravac::device_buffer<std::byte> tmp(temp);
  auto step_once = [&] {
    add_into<<<1024, 256, 0, s>>>(g.data(), e.data(), n);
    GRAVAC_TRY_CUDA(cub::DeviceTopK::MaxPairs(tmp.data(), temp, keys, keys_out.data(), iota, idx.data(), n, k, env));
    gather_values<<<256, 256, 0, s>>>(e.data(), idx.data(), values.data(), k);
    zero_at<<<256, 256, 0, s>>>(e.data(), idx.data(), k);
    GRAVAC_TRY_CUDA(cudaGetLastError());
  };
  std::uint64_t step = 0;
  bool steady = false;
  const std::size_t warm = gravac::bench::warm_up(
      [&](std::uint64_t) {
        gravac::bench::fill_gaussian(g.data(), n, gravac::bench::gradient_seed(step++), 1.0f, s);
        step_once();
      },
      e.data(), n, s, steady);
  const double per = gravac::bench::timed_loop(
      state, s, [&] { gravac::bench::fill_gaussian(g.data(), n, gravac::bench::gradient_seed(step++), 1.0f, s); },
      step_once);
  unfused_seconds[{log2_of(n), static_cast<long>(state.range(1))}] = per;
  const std::size_t packet = k * (sizeof(float) + sizeof(std::uint32_t));
  if (const double f = gravac::bench::copy_fraction(n, packet, per); f > 0) state.counters["copy_fraction"] = f;
  state.counters["warmup_steps"] = static_cast<double>(warm);
  state.counters["steady"] = steady ? 1.0 : 0.0;
  state.counters["temp_MiB"] = static_cast<double>(temp) / (1 << 20);
}
#endif

// The fused error-feedback top-k, or threshold selection, on 16 layers: one compress per
// step, training-like (time_compress).
template <class C>
void BM_select(benchmark::State& state, bool whole_buffer) {
  const auto n = static_cast<std::size_t>(state.range(0));
  const double f = static_cast<double>(state.range(1)) / 10000.0;
  const auto lay = layers_of(n);
  typename C::options opt;
  opt.stream = cudaStreamPerThread;
  if constexpr (requires { opt.whole_buffer; }) opt.whole_buffer = whole_buffer;
  C c(lay, opt);
  gravac::step_params p;
  p.kept_fraction.assign(lay.size(), f);
  p.global_fraction = f;
  gravac::compress_stats st;
  const auto t = gravac::bench::time_compress(state, c, n, p, st);
  const int b = log2_of(n);
  if (sort_seconds[b] > 0) state.counters["speedup_vs_sort"] = sort_seconds[b] / t.seconds;
  if (auto it = unfused_seconds.find({b, static_cast<long>(state.range(1))}); it != unfused_seconds.end())
    state.counters["speedup_vs_unfused"] = it->second / t.seconds;
  std::size_t kept = 0;
  for (const auto& l : st.layers) kept += l.kept;
  state.counters["k"] = static_cast<double>(kept);
  // threshold: |k_hat - k| / k (0 for exact top-k).
  std::size_t k = 0;
  if (whole_buffer) {
    k = gravac::kept_count(n, f);
  } else {
    for (std::size_t i = 0; i < lay.size(); ++i) k += gravac::kept_count(lay[i].numel, f);
  }
  state.counters["k_error"] =
      k > 0 ? std::fabs(static_cast<double>(kept) - static_cast<double>(k)) / static_cast<double>(k) : 0.0;
}
void BM_topk_cuda(benchmark::State& state) { BM_select<gravac::topk_cuda>(state, state.range(2) != 0); }
void BM_threshold_cuda(benchmark::State& state) { BM_select<gravac::threshold_cuda>(state, false); }

// AdaComp on one convolution layer of n elements with bins of L_T elements.
void BM_adacomp_cuda(benchmark::State& state) {
  const auto n = static_cast<std::size_t>(state.range(0));
  gravac::layout lay;
  lay.add("conv", {n}, gravac::layer_kind::conv);
  gravac::adacomp_cuda_options opt;
  opt.stream = cudaStreamPerThread;
  opt.bins.conv_bin = static_cast<std::uint32_t>(state.range(1));
  gravac::adacomp_cuda c(lay, opt);
  gravac::step_params p;
  p.kept_fraction.assign(1, 0.5);  // below 1: compressed (AdaComp decides how many)
  gravac::compress_stats st;
  gravac::bench::time_compress(state, c, n, p, st);
  state.counters["sent"] = static_cast<double>(st.layers[0].kept);
}

// Times of the equal-layer runs of this run, by (model, fraction in 1/10000, compressor).
std::map<std::tuple<long, long, int>, double> equal_layer_seconds;

// top-k (K = 0) or threshold (K = 1) on model M's tensors, or on 16 equal layers of the
// same total when the third argument is 1 (see the file comment).
template <class C>
void BM_model(benchmark::State& state, int kind) {
  const long m = static_cast<long>(state.range(0)), f10k = static_cast<long>(state.range(1));
  const bool equal = state.range(2) != 0;
  const auto model = m == 0 ? gravac_bench::resnet50_layout() : gravac_bench::gpt2_small_layout();
  const auto lay = equal ? layers_of(model.numel()) : model;
  typename C::options opt;
  opt.stream = cudaStreamPerThread;
  C c(lay, opt);
  gravac::step_params p;
  p.kept_fraction.assign(lay.size(), static_cast<double>(f10k) / 10000.0);
  gravac::compress_stats st;
  const auto t = gravac::bench::time_compress(state, c, lay.numel(), p, st);
  state.counters["tensors"] = static_cast<double>(lay.size());
  if (equal) {
    equal_layer_seconds[{m, f10k, kind}] = t.seconds;
  } else if (auto it = equal_layer_seconds.find({m, f10k, kind}); it != equal_layer_seconds.end()) {
    state.counters["model_over_equal"] = t.seconds / it->second;
  }
}
void BM_model_topk_cuda(benchmark::State& state) { BM_model<gravac::topk_cuda>(state, 0); }
void BM_model_threshold_cuda(benchmark::State& state) { BM_model<gravac::threshold_cuda>(state, 1); }

}  // namespace

// Baselines first, so the top-k runs can report ratios to them.
BENCHMARK(BM_copy)->UseManualTime()->Unit(benchmark::kMicrosecond)->Arg(1 << 24)->Arg(1 << 26)->Arg(1 << 28);
BENCHMARK(BM_sort_select)->UseManualTime()->Unit(benchmark::kMicrosecond)->Arg(1 << 24)->Arg(1 << 26);
#ifdef GRAVAC_BENCH_CUB_TOPK
BENCHMARK(BM_unfused_topk)
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond)
    ->ArgsProduct({{1 << 24, 1 << 26, 1 << 28}, {100, 10}});
#endif
BENCHMARK(BM_topk_cuda)
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond)
    ->ArgsProduct({{1 << 24, 1 << 26, 1 << 28}, {100, 10}, {1, 0}});
BENCHMARK(BM_threshold_cuda)
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond)
    ->Args({1 << 24, 100})
    ->Args({1 << 26, 100})
    ->Args({1 << 26, 10});
BENCHMARK(BM_adacomp_cuda)
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond)
    ->Args({1 << 24, 50})
    ->Args({1 << 26, 50})
    ->Args({1 << 26, 500});

// The equal layers (third argument 1) before each model row, whose ratio needs them.
BENCHMARK(BM_model_topk_cuda)->UseManualTime()->Unit(benchmark::kMicrosecond)->ArgsProduct({{0, 1}, {100}, {1, 0}});
BENCHMARK(BM_model_threshold_cuda)
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond)
    ->ArgsProduct({{0, 1}, {100}, {1, 0}});

int main(int argc, char** argv) { return gravac::bench::run_benchmarks(argc, argv); }
