// The Catch2 main of the GPU tests: exits with 77 (CTest: "Skipped") when no CUDA device
// is visible, so machines without a GPU report the tests as skipped, not passed.
#include <cuda_runtime.h>

#include <cstdio>

#include "catch_session.hpp"
#include "sticky_error_listener.hpp"

int main(int argc, char** argv) {
  int n = 0;
  const cudaError_t s = cudaGetDeviceCount(&n);
  if (s != cudaSuccess || n == 0) {
    std::printf("SKIPPED: no CUDA device visible (%s)\n", s != cudaSuccess ? cudaGetErrorString(s) : "0 devices");
    return 77;
  }
  return gravac_test::run_catch_session(argc, argv);
}
