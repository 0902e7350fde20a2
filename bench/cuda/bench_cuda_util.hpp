#pragma once
// Shared by the GPU benchmarks (bench_cuda_topk, bench_cuda_quantizers): CUDA-event timing,
// Gaussian device data, the copy-bandwidth baseline BM_copy, one timed compress loop that
// reports bytes moved and copy_fraction against that baseline, and a main that skips
// (exit 77) without a CUDA device.
#include <benchmark/benchmark.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <random>
#include <vector>

#include "gravac/cuda/cuda_error.hpp"
#include "gravac/cuda/device_buffer.hpp"
#include "gravac/cuda/stream.hpp"
#include "gravac/step.hpp"

namespace gravac::bench {

//! Copy times of this run (BM_copy), by log2 N, so the ratios compare like with like.
inline double copy_seconds[64] = {};

//! The smallest b with 2^b >= n.
inline int log2_of(std::size_t n) {
  int b = 0;
  while ((std::size_t{1} << b) < n) ++b;
  return b;
}

//! A pair of CUDA events around a timed region: record a, the work, record b, seconds().
struct events {
  cudaEvent_t a{};  //!< recorded before the timed work
  cudaEvent_t b{};  //!< recorded after it
  //! Creates both events.
  events() {
    GRAVAC_TRY_CUDA(cudaEventCreate(&a));
    GRAVAC_TRY_CUDA(cudaEventCreate(&b));
  }
  ~events() {
    cudaEventDestroy(a);
    cudaEventDestroy(b);
  }
  events(const events&) = delete;
  events& operator=(const events&) = delete;
  //! Seconds from a to b (waits for b).
  double seconds() {
    GRAVAC_TRY_CUDA(cudaEventSynchronize(b));
    float ms = 0;
    GRAVAC_TRY_CUDA(cudaEventElapsedTime(&ms, a, b));
    return ms * 1e-3;
  }
};

//! n Gaussian values of standard deviation \p scale (seeded), on the device.
inline gravac::device_buffer<float> gaussian(std::size_t n, std::uint64_t seed, float scale) {
  std::vector<float> h(n);
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> d(0.0f, scale);
  for (auto& x : h) x = d(rng);
  gravac::device_buffer<float> b(n);
  GRAVAC_TRY_CUDA(cudaMemcpy(b.data(), h.data(), n * sizeof(float), cudaMemcpyHostToDevice));
  return b;
}

//! Baseline: copy of the n floats (device to device); bytes moved = read + write.
inline void BM_copy(benchmark::State& state) {
  const auto n = static_cast<std::size_t>(state.range(0));
  auto src = gaussian(n, 1, 1.0f);
  gravac::device_buffer<float> dst(n);
  events ev;
  double total = 0;
  for (auto _ : state) {
    GRAVAC_TRY_CUDA(cudaEventRecord(ev.a, cudaStreamPerThread));
    GRAVAC_TRY_CUDA(
        cudaMemcpyAsync(dst.data(), src.data(), n * sizeof(float), cudaMemcpyDeviceToDevice, cudaStreamPerThread));
    GRAVAC_TRY_CUDA(cudaEventRecord(ev.b, cudaStreamPerThread));
    const double s = ev.seconds();
    state.SetIterationTime(s);
    total += s;
  }
  copy_seconds[log2_of(n)] = total / static_cast<double>(state.iterations());
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * 2 * n * sizeof(float)));
}

//! What time_compress measured: the last packet's size and the mean seconds per compress.
struct compress_timing {
  std::size_t bytes = 0;  //!< packet bytes of the last compress
  double seconds = 0;     //!< mean seconds of one compress
};

//! Times \p c.compress on n Gaussian values (g, and a residual e of a tenth the scale,
//! carried over as in training): one warm-up, then one compress per iteration between CUDA
//! events. With \p advance_step, p.step grows by one before each timed compress (outside
//! the timed region). Sets bytes processed (read g and e, write e, write the packet) and,
//! once BM_copy of the same N has run, copy_fraction (that rate over the copy's rate).
//! \p st holds the last compress's statistics.
template <class C>
compress_timing time_compress(benchmark::State& state, C& c, std::size_t n, gravac::step_params& p,
                              gravac::compress_stats& st, bool advance_step = false) {
  auto g = gaussian(n, 3, 1.0f);
  auto e = gaussian(n, 4, 0.1f);
  gravac::device_buffer<std::byte> packet(c.max_packet_bytes());
  std::size_t bytes = c.compress(gravac::device_view(g), gravac::device_view(e), p, packet.span(), st);  // warm-up
  events ev;
  double total = 0;
  for (auto _ : state) {
    if (advance_step) ++p.step;
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
  return {bytes, per};
}

//! The benchmarks' main: exit 77 with a message when no CUDA device is visible, otherwise
//! run the registered benchmarks.
inline int run_benchmarks(int argc, char** argv) {
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

}  // namespace gravac::bench
