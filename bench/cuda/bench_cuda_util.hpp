#pragma once
// Shared by the GPU benchmarks (bench_cuda_topk, bench_cuda_quantizers, bench_cuda_steps):
// CUDA-event timing, Gaussian device data (a counter-based generator on the device: a fresh
// gradient per step costs one untimed kernel), the copy-bandwidth baseline BM_copy, one
// timed compress loop under training-like dynamics (a fresh gradient every step, the
// residual carried, timed once the residual has settled) that reports bytes moved and
// copy_fraction against that baseline, and a main that skips (exit 77) without a CUDA device.
#include <benchmark/benchmark.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>

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

//! SplitMix64's finaliser: a counter-based generator, so that element i of step s is the
//! same on every GPU and in every benchmark (bench/cuda/bench_torch_topk.py uses the same).
__host__ __device__ inline std::uint64_t mix64(std::uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

//! The key of seed \p seed's stream: element i's bits are mix64(key ^ (i * odd constant)).
__host__ __device__ inline std::uint64_t gaussian_key(std::uint64_t seed) {
  return mix64(seed * 0x9e3779b97f4a7c15ull + 1);
}

//! Element \p i's 64 random bits of the stream \p key.
__host__ __device__ inline std::uint64_t gaussian_bits(std::uint64_t key, std::size_t i) {
  return mix64(key ^ (i * 0xd1b54a32d192ed03ull));
}

//! A Gaussian value of standard deviation \p scale from 64 random bits: Box-Muller on two
//! 24-bit uniforms.
__device__ inline float gaussian_from(std::uint64_t r, float scale) {
  const float u1 = (static_cast<float>(r >> 40) + 1.0f) * (1.0f / 16777216.0f);  // (0, 1]
  const float u2 = static_cast<float>((r >> 8) & 0xffffffu) * (1.0f / 16777216.0f);
  return scale * sqrtf(-2.0f * logf(u1)) * cospif(2.0f * u2);
}

//! Writes n Gaussian values of standard deviation \p scale: element i from the counter
//! (seed, i).
__global__ inline void gaussian_kernel(float* x, std::size_t n, std::uint64_t seed, float scale) {
  const std::uint64_t key = gaussian_key(seed);
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x)
    x[i] = gaussian_from(gaussian_bits(key, i), scale);
}

//! Fills \p x with n Gaussian values (seed, scale) on \p s: one kernel, no host data.
inline void fill_gaussian(float* x, std::size_t n, std::uint64_t seed, float scale, cudaStream_t s) {
  gaussian_kernel<<<1024, 256, 0, s>>>(x, n, seed, scale);
  GRAVAC_TRY_CUDA(cudaGetLastError());
}

//! n Gaussian values of standard deviation \p scale (seeded), on the device.
inline gravac::device_buffer<float> gaussian(std::size_t n, std::uint64_t seed, float scale) {
  gravac::device_buffer<float> b(n);
  fill_gaussian(b.data(), n, seed, scale, cudaStreamPerThread);
  GRAVAC_TRY_CUDA(cudaStreamSynchronize(cudaStreamPerThread));
  return b;
}

//! Adds the squares of x[0, n) into *out (double, by atomics; a warm-up measure only).
__global__ inline void sum_squares_kernel(const float* x, std::size_t n, double* out) {
  double a = 0;
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x)
    a += static_cast<double>(x[i]) * x[i];
  atomicAdd(out, a);
}

//! The Euclidean norm of x[0, n) (synchronises \p s).
inline double norm(const float* x, std::size_t n, cudaStream_t s) {
  gravac::device_buffer<double> acc(1);
  GRAVAC_TRY_CUDA(cudaMemsetAsync(acc.data(), 0, sizeof(double), s));
  sum_squares_kernel<<<256, 256, 0, s>>>(x, n, acc.data());
  GRAVAC_TRY_CUDA(cudaGetLastError());
  double h = 0;
  GRAVAC_TRY_CUDA(cudaMemcpyAsync(&h, acc.data(), sizeof(double), cudaMemcpyDeviceToHost, s));
  GRAVAC_TRY_CUDA(cudaStreamSynchronize(s));
  return std::sqrt(h);
}

//! The seed of step \p step's gradient (the residual's initial value uses seed 4).
inline std::uint64_t gradient_seed(std::uint64_t step) { return 1000 + step; }

//! Untimed warm-up of an error-feedback compressor: steps (a fresh gradient each, by
//! \p step_fn(step)) until the residual's norm changes by less than 1% per step on
//! average over 8 steps, or GRAVAC_BENCH_MAX_WARMUP steps (default 64: an 8-minute
//! GPU turn runs 40 cases; the steady counter says whether the residual settled) have run. Returns
//! the number of steps run; \p steady says whether the residual settled.
template <class StepFn>
std::size_t warm_up(StepFn&& step_fn, const float* e, std::size_t n, cudaStream_t s, bool& steady) {
  const char* cap_env = std::getenv("GRAVAC_BENCH_MAX_WARMUP");
  const std::size_t cap = cap_env ? std::strtoull(cap_env, nullptr, 10) : 64;
  constexpr std::size_t window = 8;
  double norms[window + 1] = {};
  std::size_t step = 0;
  steady = false;
  while (step < cap) {
    step_fn(step);
    norms[step % (window + 1)] = norm(e, n, s);
    ++step;
    if (step > window) {
      double change = 0;
      for (std::size_t j = step - window; j < step; ++j) {
        const double a = norms[(j - 1) % (window + 1)], b = norms[j % (window + 1)];
        change += a > 0 ? std::fabs(b - a) / a : 1.0;
      }
      if (change / window < 0.01) {
        steady = true;
        break;
      }
    }
  }
  return step;
}

//! The benchmark loop: each iteration runs \p untimed, then \p timed between two CUDA
//! events on \p s, and sets the iteration's time from them. Returns the mean seconds.
template <class Untimed, class Timed>
double timed_loop(benchmark::State& state, cudaStream_t s, Untimed&& untimed, Timed&& timed) {
  events ev;
  double total = 0;
  for (auto _ : state) {
    untimed();
    GRAVAC_TRY_CUDA(cudaEventRecord(ev.a, s));
    timed();
    GRAVAC_TRY_CUDA(cudaEventRecord(ev.b, s));
    const double sec = ev.seconds();
    state.SetIterationTime(sec);
    total += sec;
  }
  return total / static_cast<double>(state.iterations());
}

//! Baseline: copy of the n floats (device to device); bytes moved = read + write.
inline void BM_copy(benchmark::State& state) {
  const auto n = static_cast<std::size_t>(state.range(0));
  auto src = gaussian(n, 1, 1.0f);
  gravac::device_buffer<float> dst(n);
  copy_seconds[log2_of(n)] = timed_loop(
      state, cudaStreamPerThread, [] {},
      [&] {
        GRAVAC_TRY_CUDA(
            cudaMemcpyAsync(dst.data(), src.data(), n * sizeof(float), cudaMemcpyDeviceToDevice, cudaStreamPerThread));
      });
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * 2 * n * sizeof(float)));
}

//! What time_compress measured: the last packet's size and the mean seconds per compress.
struct compress_timing {
  std::size_t bytes = 0;  //!< packet bytes of the last compress
  double seconds = 0;     //!< mean seconds of one compress
};

//! The rate of the bytes an error-feedback compressor must move (read g and e, write e,
//! write a packet of \p packet_bytes) in \p seconds, over the copy's rate of the same run
//! for the same N (0 until BM_copy of that N has run).
inline double copy_fraction(std::size_t n, std::size_t packet_bytes, double seconds) {
  const int b = log2_of(n);
  if (copy_seconds[b] <= 0 || seconds <= 0) return 0;
  const double moved = 3.0 * static_cast<double>(n) * sizeof(float) + static_cast<double>(packet_bytes);
  const double copy_rate = 2.0 * static_cast<double>(n) * sizeof(float) / copy_seconds[b];
  return (moved / seconds) / copy_rate;
}

//! Times \p c.compress as training runs it: a fresh gradient g every step (written before
//! the step, untimed), the residual e (initially Gaussian of a tenth the scale) carried
//! from step to step; warm_up's untimed steps first, then one timed compress per
//! iteration between CUDA events. p.step grows by one each step when \p advance_step.
//! Sets bytes processed (read g and e, write e, write the packet), copy_fraction (once
//! BM_copy of the same N has run) and warmup_steps / steady. \p st holds the last
//! compress's statistics.
template <class C>
compress_timing time_compress(benchmark::State& state, C& c, std::size_t n, gravac::step_params& p,
                              gravac::compress_stats& st, bool advance_step = false) {
  const cudaStream_t s = cudaStreamPerThread;
  gravac::device_buffer<float> g(n);
  auto e = gaussian(n, 4, 0.1f);
  gravac::device_buffer<std::byte> packet(c.max_packet_bytes());
  std::size_t bytes = 0;
  std::uint64_t step = 0;
  auto one_step = [&](std::uint64_t) {
    fill_gaussian(g.data(), n, gradient_seed(step++), 1.0f, s);
    if (advance_step) ++p.step;
    bytes = c.compress(gravac::device_view(g), gravac::device_view(e), p, packet.span(), st);
  };
  bool steady = false;
  const std::size_t warm = warm_up(one_step, e.data(), n, s, steady);
  const double per = timed_loop(
      state, s,
      [&] {
        fill_gaussian(g.data(), n, gradient_seed(step++), 1.0f, s);
        if (advance_step) ++p.step;
      },
      [&] { bytes = c.compress(gravac::device_view(g), gravac::device_view(e), p, packet.span(), st); });
  const double moved = 3.0 * static_cast<double>(n) * sizeof(float) + static_cast<double>(bytes);
  state.SetBytesProcessed(static_cast<std::int64_t>(static_cast<double>(state.iterations()) * moved));
  if (const double f = copy_fraction(n, bytes, per); f > 0) state.counters["copy_fraction"] = f;
  state.counters["warmup_steps"] = static_cast<double>(warm);
  state.counters["steady"] = steady ? 1.0 : 0.0;
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
