#pragma once
// A Catch2 listener of the GPU test mains: after every test case it asks whether the CUDA
// context holds a sticky error (a kernel fault: every later CUDA call of the process
// returns it). If so it names the case that left it and ends the binary at once, instead of
// letting every later case fail with the same unrelated error.
#include <cuda_runtime.h>

// Catch2 2.x declares its listener base only with this (in the translation unit of a main).
#define CATCH_CONFIG_EXTERNAL_INTERFACES
#include <catch2/catch.hpp>
#include <cstdio>
#include <cstdlib>

namespace gravac_test {

struct sticky_cuda_error_listener : Catch::TestEventListenerBase {
  using TestEventListenerBase::TestEventListenerBase;
  void testCaseEnded(const Catch::TestCaseStats& stats) override {
    (void)cudaGetLastError();  // a launch's error is cleared by reading it; a sticky one is not
    const cudaError_t e = cudaGetLastError();
    if (e == cudaSuccess) return;
    std::fflush(stdout);
    std::fprintf(stderr,
                 "sticky CUDA error after test case '%s': %s (%s); every later CUDA call of this process fails, "
                 "so the remaining cases are not run\n",
                 stats.testInfo.name.c_str(), cudaGetErrorName(e), cudaGetErrorString(e));
    std::fflush(stderr);
    std::_Exit(1);
  }
};

CATCH_REGISTER_LISTENER(sticky_cuda_error_listener)

}  // namespace gravac_test
