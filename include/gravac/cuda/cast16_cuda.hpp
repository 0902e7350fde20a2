#pragma once
//! \file cast16_cuda.hpp
//! \brief cast16_cuda: cast16 (fp16 or bf16 of u / N) on the device, the packets of gravac::cast16 bit for bit.
//! It shares the quantizer machinery of quantize_cuda.hpp and is defined there. Part of
//! target gravac::cuda.

#include "gravac/cuda/detail/nvcc_flags.hpp"
// (first, and apart from the includes below: a missing compiler option is one readable error)

#include "gravac/cuda/quantize_cuda.hpp"
