#pragma once
//! \file qsgd_cuda.hpp
//! \brief qsgd_cuda: QSGD with error feedback on the device, the packets of gravac::qsgd bit for bit.
//! It shares the quantizer machinery of quantize_cuda.hpp and is defined there. Part of
//! target gravac::cuda.

#include "gravac/cuda/detail/nvcc_flags.hpp"
// (first, and apart from the includes below: a missing compiler option is one readable error)

#include "gravac/cuda/quantize_cuda.hpp"
