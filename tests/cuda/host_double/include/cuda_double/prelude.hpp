#pragma once
// The prelude of the CUDA host double, included before anything else (-include) in every
// translation unit compiled against the double: what nvcc would provide implicitly (the
// CUDA keywords, threadIdx and the other built-ins, the intrinsics, the runtime API).
// gravac's headers see GRAVAC_CUDA_HOST_DOUBLE only in their launch helper, CUB wrappers and nvcc_flags.hpp.
#define GRAVAC_CUDA_HOST_DOUBLE 1

#include <cuda_runtime.h>

#include "cuda_double/kernel.hpp"
