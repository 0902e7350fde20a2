#pragma once
//! \file sign_cuda.hpp
//! \brief sign_cuda: EF-sign (sign bits and the mean |u|) on the device, the packets of gravac::sign bit for bit.
//! It shares the quantizer machinery of quantize_cuda.hpp and is defined there. Part of
//! target gravac::cuda.

#include "gravac/cuda/detail/nvcc_flags.hpp"
// (first, and apart from the includes below: a missing compiler option is one readable error)

#include "gravac/cuda/quantize_cuda.hpp"
