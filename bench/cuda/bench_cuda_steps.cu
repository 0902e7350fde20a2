// Whole trainer steps on one GPU, each against its peer measured in the same binary, on a
// one-rank NCCL communicator (the real device collective path: nccl_communicator's calls,
// waits and host synchronisations, with no second GPU to talk to):
//
//   BM_copy/N            cudaMemcpy device to device of N floats: the bandwidth floor.
//   BM_dense_step/N      trainer<topk_cuda, dense_allreduce, fixed_policy> at kept fraction 1:
//                        the uncompressed step of the same buffer (raw segments, one Allreduce).
//   BM_artopk_step/N/F   trainer<topk_cuda, allreduce_compatible, fixed_policy> (AR-Topk, STAR)
//                        at F/10000 kept: the device passes (u = g + e with its statistics, the
//                        selection, the index broadcast and validation, the gather, the value
//                        Allreduce, the scatter of the average). Counters: step_s,
//                        ratio_to_dense (this over BM_dense_step of the same N) and
//                        copy_fraction (below).
//   BM_backward/R        the "backward" of 8 layers of 2^22 floats alone: one kernel per layer
//                        writes its gradient after R rounds of integer work per element.
//   BM_sync_step/R       those kernels, then trainer<topk_cuda, allgather, fixed_policy>::step.
//   BM_async_step/R      begin_step, each kernel followed by ready(layer) (last layer first, as
//                        backward runs), finish(). Counters: step_s, ratio_to_sync (this over
//                        BM_sync_step of the same R), backward_s and hidden_fraction, the part of
//                        the synchronous step's time beyond backward that the overlap hid:
//                        (sync - async) / (sync - backward).
//
// Every step is training-like: a fresh gradient each step from the device generator, the
// residual (initially Gaussian of a tenth the scale, as bench_cuda_util.hpp's
// time_compress) carried in the trainer, timed after warm_up once the residual has
// settled. A step is timed by CUDA events on the calling thread's per-thread default
// stream around the whole call (UseManualTime): host work, waits and NCCL included.
// Without a CUDA device the binary exits with 77.
#include <benchmark/benchmark.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "bench_cuda_util.hpp"
#include "gravac/cuda/nccl_communicator.hpp"
#include "gravac/cuda/topk_cuda.hpp"
#include "gravac/gravac.hpp"

namespace {

using gravac::bench::BM_copy;
using gravac::bench::log2_of;

// One rank needs no MPI: the unique id is made here and nobody else joins, so the binary
// runs without mpiexec or MPI_Init. Made on first use (after the device check), shared by
// every benchmark, destroyed in main while CUDA is still up.
std::unique_ptr<gravac::nccl_communicator> the_comm;
gravac::nccl_communicator& comm() {
  if (!the_comm) {
    ncclUniqueId id;
    GRAVAC_TRY_NCCL(ncclGetUniqueId(&id));
    the_comm = std::make_unique<gravac::nccl_communicator>(id, 0, 1);
  }
  return *the_comm;
}

// Times of the peers of this run: the dense step by log2 N, the backward and the
// synchronous step by R.
double dense_seconds[64] = {};
std::map<long, double> backward_seconds, sync_seconds;

// Makes the per-thread default stream wait for \p s, so that an event recorded there after
// it covers the work queued on \p s (a formality after step() and finish(), which return
// once their kernels have completed; it keeps the timing honest if that ever changes).
void join(cudaStream_t s) {
  if (s == cudaStreamPerThread) return;
  cudaEvent_t done{};
  GRAVAC_TRY_CUDA(cudaEventCreateWithFlags(&done, cudaEventDisableTiming));
  GRAVAC_TRY_CUDA(cudaEventRecord(done, s));
  GRAVAC_TRY_CUDA(cudaStreamWaitEvent(cudaStreamPerThread, done, 0));
  GRAVAC_TRY_CUDA(cudaEventDestroy(done));
}

// The trainer's residual starts as time_compress's does (Gaussian, a tenth the scale), so
// the warm-up starts near where the compressors' benchmarks start.
template <class T>
void seed_residual(T& t) {
  auto e = t.residual_view();
  gravac::bench::fill_gaussian(e.data(), e.size(), 4, 0.1f, cudaStreamPerThread);
  GRAVAC_TRY_CUDA(cudaStreamSynchronize(cudaStreamPerThread));
}

// ---- AR-Topk's device passes against the dense step ----------------------------------

// One step of trainer<topk_cuda, K, fixed_policy> per iteration on one layer of n floats
// at \p fraction kept: a fresh gradient written before each step (untimed, on the
// per-thread default stream, which step() waits for), the residual carried. Sets step_s,
// warmup_steps and steady; returns the mean seconds of a step.
template <class K>
double time_flat_step(benchmark::State& state, std::size_t n, double fraction) {
  using T = gravac::trainer<gravac::topk_cuda, K, gravac::fixed_policy>;
  typename T::options opt;
  opt.policy.kept_fraction = fraction;
  const cudaStream_t s = cudaStreamPerThread;
  T t(comm(), gravac::layout::flat(n), opt);
  seed_residual(t);
  gravac::device_buffer<float> g(n);
  std::uint64_t step = 0;
  auto one_step = [&](std::uint64_t) {
    gravac::bench::fill_gaussian(g.data(), n, gravac::bench::gradient_seed(step++), 1.0f, s);
    t.step(gravac::device_view(g));
  };
  // The dense step's residual is zero after its first step: a norm that stays zero never
  // reads as settled, so it takes a few steps (allocations, NCCL's first calls) instead.
  bool steady = true;
  std::size_t warm = 0;
  if (fraction < 1.0) {
    warm = gravac::bench::warm_up(one_step, t.residual_view().data(), n, s, steady);
  } else {
    for (; warm < 4; ++warm) one_step(warm);
  }
  const double per = gravac::bench::timed_loop(
      state, s, [&] { gravac::bench::fill_gaussian(g.data(), n, gravac::bench::gradient_seed(step++), 1.0f, s); },
      [&] { t.step(gravac::device_view(g)); });
  state.counters["step_s"] = per;
  state.counters["warmup_steps"] = static_cast<double>(warm);
  state.counters["steady"] = steady ? 1.0 : 0.0;
  return per;
}

// The peer: the same buffer sent whole through dense_allreduce (kept fraction 1).
void BM_dense_step(benchmark::State& state) {
  const auto n = static_cast<std::size_t>(state.range(0));
  dense_seconds[log2_of(n)] = time_flat_step<gravac::dense_allreduce>(state, n, 1.0);
}

// AR-Topk at range(1) / 10000 kept. copy_fraction: the rate of the bytes its passes must
// move at the least, over the copy's rate (BM_copy of the same N in this run). Those bytes:
// read g and e and write u = g + e into e (the fused accumulate), read u once (the
// selection), write g (the scattered average), 20 N bytes, plus k 4-byte indices and k
// 4-byte values. The step does more than that floor (the selection's further passes over
// its candidates, the non-finite screening of the default throw_error, the residual's
// zeroing at the indices), so the fraction says how close the whole step comes to it.
void BM_artopk_step(benchmark::State& state) {
  const auto n = static_cast<std::size_t>(state.range(0));
  const double f = static_cast<double>(state.range(1)) / 10000.0;
  const double per = time_flat_step<gravac::allreduce_compatible>(state, n, f);
  const int b = log2_of(n);
  if (dense_seconds[b] > 0) state.counters["ratio_to_dense"] = per / dense_seconds[b];
  const double copy_s = gravac::bench::copy_seconds[b];
  if (copy_s > 0 && per > 0) {
    const double k = static_cast<double>(gravac::kept_count(n, f));
    const double moved = 20.0 * static_cast<double>(n) + 8.0 * k;
    const double copy_rate = 2.0 * static_cast<double>(n) * sizeof(float) / copy_s;
    state.counters["copy_fraction"] = (moved / per) / copy_rate;
  }
  state.counters["k"] = static_cast<double>(gravac::kept_count(n, f));
}

// ---- The asynchronous step against the synchronous one --------------------------------

// A model's buffer for the overlap: 8 layers of 2^22 floats (16 MiB each), so the default
// 25 MiB buckets hold two layers each and the first buckets can go while backward still
// writes the others.
constexpr std::size_t model_layers = 8;
constexpr std::size_t layer_numel = std::size_t{1} << 22;
gravac::layout model_layout() {
  gravac::layout lay;
  for (std::size_t i = 0; i < model_layers; ++i)
    lay.add("l" + std::to_string(i), {layer_numel}, gravac::layer_kind::dense);
  return lay;
}

// Backward's stand-in for one layer: every element takes \p rounds extra rounds of the
// generator's mixing (integer work on every SM, as a backward's arithmetic occupies the
// whole GPU), then is written as the generator's Gaussian value. rounds = 0: only the write.
__global__ void backward_kernel(float* x, std::size_t n, std::uint64_t key, std::size_t first, int rounds) {
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    std::uint64_t r = gravac::bench::gaussian_bits(key, first + i);
    for (int j = 0; j < rounds; ++j) r = gravac::bench::mix64(r);
    x[i] = gravac::bench::gaussian_from(r, 1.0f);
  }
}

// Writes layer \p i of step \p step's gradient into \p g on the per-thread default stream.
void backward_layer(float* g, const gravac::layout& lay, std::size_t i, std::uint64_t step, int rounds) {
  const auto& l = lay[i];
  backward_kernel<<<1024, 256, 0, cudaStreamPerThread>>>(
      g + l.offset, l.numel, gravac::bench::gaussian_key(gravac::bench::gradient_seed(step)), l.offset, rounds);
  GRAVAC_TRY_CUDA(cudaGetLastError());
}

void BM_backward(benchmark::State& state) {
  const int rounds = static_cast<int>(state.range(0));
  const auto lay = model_layout();
  gravac::device_buffer<float> g(lay.numel());
  std::uint64_t step = 0;
  backward_seconds[state.range(0)] = gravac::bench::timed_loop(
      state, cudaStreamPerThread, [&] {},
      [&] {
        for (std::size_t i = lay.size(); i-- > 0;) backward_layer(g.data(), lay, i, step, rounds);
        ++step;
      });
}

// One step per iteration of trainer<topk_cuda, allgather, fixed_policy> at 1% on
// model_layout(), backward included: asynchronous (ready after each layer's kernel) or
// synchronous (step() after all of them). The compressors run on a non-blocking stream of
// their own, as docs/overlap.md recommends for overlap, in both (the same options).
double time_model_step(benchmark::State& state, bool async) {
  const int rounds = static_cast<int>(state.range(0));
  using T = gravac::trainer<gravac::topk_cuda, gravac::allgather, gravac::fixed_policy>;
  const auto lay = model_layout();
  const std::size_t n = lay.numel();
  gravac::cuda_stream compressor_stream;  // before the trainer: it must outlive it
  T::options opt;
  opt.policy.kept_fraction = 0.01;
  opt.compressor.stream = compressor_stream.ref();
  T t(comm(), lay, opt);
  seed_residual(t);
  gravac::device_buffer<float> g(n);
  std::uint64_t step = 0;
  std::size_t buckets = 0;
  auto one_step = [&](std::uint64_t) {
    if (async) {
      t.begin_step(gravac::device_view(g));
      for (std::size_t i = lay.size(); i-- > 0;) {
        backward_layer(g.data(), lay, i, step, rounds);
        t.ready(i);  // on the per-thread default stream, where the kernel ran
      }
      buckets = t.finish().buckets;
    } else {
      for (std::size_t i = lay.size(); i-- > 0;) backward_layer(g.data(), lay, i, step, rounds);
      buckets = t.step(gravac::device_view(g)).buckets;
    }
    ++step;
    join(compressor_stream.ref().get());
  };
  bool steady = false;
  const std::size_t warm = gravac::bench::warm_up(one_step, t.residual_view().data(), n, cudaStreamPerThread, steady);
  const double per = gravac::bench::timed_loop(
      state, cudaStreamPerThread, [&] {}, [&] { one_step(step); });
  state.counters["step_s"] = per;
  state.counters["buckets"] = static_cast<double>(buckets);
  state.counters["warmup_steps"] = static_cast<double>(warm);
  state.counters["steady"] = steady ? 1.0 : 0.0;
  return per;
}

void BM_sync_step(benchmark::State& state) { sync_seconds[state.range(0)] = time_model_step(state, false); }

void BM_async_step(benchmark::State& state) {
  const double per = time_model_step(state, true);
  const auto sync = sync_seconds.find(state.range(0));
  const auto back = backward_seconds.find(state.range(0));
  if (sync != sync_seconds.end()) state.counters["ratio_to_sync"] = per / sync->second;
  if (back != backward_seconds.end()) state.counters["backward_s"] = back->second;
  if (sync != sync_seconds.end() && back != backward_seconds.end() && sync->second > back->second)
    state.counters["hidden_fraction"] = (sync->second - per) / (sync->second - back->second);
}

}  // namespace

// Peers first, so that the measured runs can report ratios to them.
BENCHMARK(BM_copy)->UseManualTime()->Unit(benchmark::kMicrosecond)->Arg(1 << 24)->Arg(1 << 26);
BENCHMARK(BM_dense_step)->UseManualTime()->Unit(benchmark::kMicrosecond)->Arg(1 << 24)->Arg(1 << 26);
BENCHMARK(BM_artopk_step)->UseManualTime()->Unit(benchmark::kMicrosecond)->Args({1 << 24, 100})->Args({1 << 26, 100});
// R = 0: backward is only the gradient's write (little to hide behind); R = 64: backward
// has arithmetic of its own, as a real one does (BM_backward says how long it takes).
BENCHMARK(BM_backward)->UseManualTime()->Unit(benchmark::kMicrosecond)->Arg(0)->Arg(64);
BENCHMARK(BM_sync_step)->UseManualTime()->Unit(benchmark::kMicrosecond)->Arg(0)->Arg(64);
BENCHMARK(BM_async_step)->UseManualTime()->Unit(benchmark::kMicrosecond)->Arg(0)->Arg(64);

int main(int argc, char** argv) {
  const int rc = gravac::bench::run_benchmarks(argc, argv);
  the_comm.reset();  // before exit tears CUDA down
  return rc;
}
