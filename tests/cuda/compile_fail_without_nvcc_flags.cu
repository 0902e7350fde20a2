// A .cu file that includes a gravac CUDA header without the options gravac::cuda carries
// (compiled with -std=c++20 only, as a plain nvcc command line would): the build must fail
// with the one line of gravac/cuda/detail/nvcc_flags.hpp that names the missing option,
// before any kernel is parsed.
#include "gravac/cuda/topk_cuda.hpp"

int main() { return 0; }
