// Two test cases under the GPU test main: the first leaves a sticky CUDA error (a kernel
// that traps), the second would pass. The main's listener must end the binary after the
// first, naming it (CTest checks the message; the second case must not run).
#include <catch2/catch.hpp>
#include <cstdio>

#include "gravac/cuda/detail/launch.hpp"

namespace {
__global__ void trap_kernel() { __trap(); }
}  // namespace

TEST_CASE("a kernel that traps") {
  gravac::detail::launch(&trap_kernel, 1, 1, cudaStreamPerThread);
  (void)cudaStreamSynchronize(cudaStreamPerThread);  // the fault surfaces here
}

TEST_CASE("a case after it") {
  std::printf("the case after the sticky error ran\n");
  REQUIRE(true);
}
