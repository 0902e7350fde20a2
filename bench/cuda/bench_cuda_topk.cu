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

#include <cmath>
#include <cub/device/device_radix_sort.cuh>

#include "bench_cuda_util.hpp"
#include "gravac/cuda/adacomp_cuda.hpp"
#include "gravac/cuda/threshold_cuda.hpp"
#include "gravac/cuda/topk_cuda.hpp"

namespace {

using gravac::bench::BM_copy;
using gravac::bench::events;
using gravac::bench::gaussian;
using gravac::bench::log2_of;

// Times of the sort baseline of this run, by log2 N (the copy's are in bench_cuda_util.hpp).
double sort_seconds[64] = {};

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
  events ev;
  double total = 0;
  for (auto _ : state) {
    GRAVAC_TRY_CUDA(cudaEventRecord(ev.a, cudaStreamPerThread));
    abs_and_iota<<<1024, 256, 0, cudaStreamPerThread>>>(u.data(), keys.data(), idx.data(), n);
    GRAVAC_TRY_CUDA(cub::DeviceRadixSort::SortPairsDescending(tmp.data(), temp, keys.data(), keys_out.data(),
                                                              idx.data(), idx_out.data(), static_cast<int>(n), 0, 32,
                                                              cudaStreamPerThread));
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
  gravac::step_params p;
  p.kept_fraction.assign(1, f);
  p.global_fraction = f;
  gravac::compress_stats st;
  const auto t = gravac::bench::time_compress(state, c, n, p, st);
  const int b = log2_of(n);
  if (sort_seconds[b] > 0) state.counters["speedup_vs_sort"] = sort_seconds[b] / t.seconds;
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
  gravac::step_params p;
  p.kept_fraction.assign(1, 0.5);  // below 1: compressed (AdaComp decides how many)
  gravac::compress_stats st;
  gravac::bench::time_compress(state, c, n, p, st);
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

int main(int argc, char** argv) { return gravac::bench::run_benchmarks(argc, argv); }
