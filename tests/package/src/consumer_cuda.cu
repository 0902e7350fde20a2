// A consumer's .cu file: it links gravac::cuda and nothing else, so every CUDA option the
// headers need must come with the target (nvcc -std=c++20 --extended-lambda
// --expt-relaxed-constexpr). Compiling and linking it is the test; with a CUDA device it
// also builds a topk_cuda and checks its packet bound against the host compressor's.
#include <cuda_runtime.h>

#include <cstdio>

#include "gravac/compress/topk.hpp"
#include "gravac/cuda/topk_cuda.hpp"

int main() {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("consumer_cuda: compiled and linked; no CUDA device, not run\n");
    return 77;
  }
  gravac::layout lay;
  lay.add("fc.weight", {64, 32}, gravac::layer_kind::dense);
  lay.add("fc.bias", {64}, gravac::layer_kind::bias_or_norm);
  const gravac::topk_cuda device(lay, {});
  const gravac::topk host(lay, {});
  const bool ok = device.max_packet_bytes() == host.max_packet_bytes();
  std::printf("consumer_cuda: %s\n", ok ? "ok" : "FAILED (packet bounds differ)");
  return ok ? 0 : 1;
}
