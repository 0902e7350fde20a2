#pragma once
// The kernel engine's selftest prelude (-include): the shared interface and the device
// language only, without the runtime's cuda_runtime.h (kernel_selftest.cpp stands in for
// the few runtime functions the engine calls).
#include "cuda_double/core.hpp"
#include "cuda_double/kernel.hpp"
