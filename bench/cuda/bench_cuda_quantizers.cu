// The device quantizers (qsgd_cuda, terngrad_cuda, sign_cuda, cast16_cuda, and the
// block-scaled mxfp8_cuda, mxfp4_cuda and nvfp4_cuda) against the
// device's copy bandwidth measured in the same binary (cudaMemcpy device to device of the
// same n floats). Timed with CUDA events (UseManualTime); one compress per iteration, the
// residual carried over as in training.
//
// Counters: copy_fraction = (bytes a quantizer must move: read g and e, write e, write the
// packet) per second over the copy's bytes per second of the same run.
#include <benchmark/benchmark.h>

#include "bench_cuda_util.hpp"
#include "gravac/cuda/block_scaled_cuda.hpp"
#include "gravac/cuda/cast16_cuda.hpp"
#include "gravac/cuda/qsgd_cuda.hpp"
#include "gravac/cuda/sign_cuda.hpp"
#include "gravac/cuda/terngrad_cuda.hpp"

namespace {

using gravac::bench::BM_copy;

// One quantizer on one layer of n elements.
template <class C>
void run(benchmark::State& state, typename C::options opt) {
  const auto n = static_cast<std::size_t>(state.range(0));
  auto lay = gravac::layout::flat(n);
  opt.stream = cudaStreamPerThread;
  C c(lay, opt);
  gravac::step_params p;
  p.kept_fraction.assign(1, 0.5);  // below 1: quantized
  gravac::compress_stats st;
  const auto t = gravac::bench::time_compress(state, c, n, p, st, /*advance_step=*/true);
  state.counters["packet_bytes"] = static_cast<double>(t.bytes);
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
// range(1): 1 for stochastic rounding (else nearest even); mxfp8: range(2) 1 for E5M2.
gravac::block_rounding rounding_of(const benchmark::State& state) {
  return state.range(1) ? gravac::block_rounding::stochastic : gravac::block_rounding::nearest_even;
}
void BM_mxfp8_cuda(benchmark::State& state) {
  gravac::mxfp8_cuda_options o;
  o.rounding = rounding_of(state);
  o.element = state.range(2) ? gravac::mxfp8_element::e5m2 : gravac::mxfp8_element::e4m3;
  run<gravac::mxfp8_cuda>(state, o);
}
void BM_mxfp4_cuda(benchmark::State& state) {
  gravac::mxfp4_cuda_options o;
  o.rounding = rounding_of(state);
  run<gravac::mxfp4_cuda>(state, o);
}
// NVFP4 reads u once more than the MX formats (the per-layer largest |u| before the codes).
void BM_nvfp4_cuda(benchmark::State& state) {
  gravac::nvfp4_cuda_options o;
  o.rounding = rounding_of(state);
  run<gravac::nvfp4_cuda>(state, o);
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
BENCHMARK(BM_mxfp8_cuda)
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond)
    ->Args({1 << 24, 0, 0})
    ->Args({1 << 26, 0, 0})
    ->Args({1 << 26, 1, 0})
    ->Args({1 << 26, 0, 1});
BENCHMARK(BM_mxfp4_cuda)->UseManualTime()->Unit(benchmark::kMicrosecond)->Args({1 << 26, 0})->Args({1 << 26, 1});
BENCHMARK(BM_nvfp4_cuda)->UseManualTime()->Unit(benchmark::kMicrosecond)->Args({1 << 26, 0})->Args({1 << 26, 1});

int main(int argc, char** argv) { return gravac::bench::run_benchmarks(argc, argv); }
