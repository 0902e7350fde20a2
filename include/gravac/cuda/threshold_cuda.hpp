#pragma once
//! \file threshold_cuda.hpp
//! \brief threshold_cuda: threshold (approximate top-k) sparsification with error feedback
//! on the device, the packets of gravac::threshold bit for bit. It shares the radix-select
//! machinery of topk_cuda and is defined beside it. Part of target gravac::cuda.

#include "gravac/cuda/detail/nvcc_flags.hpp"
// (first, and apart from the includes below: a missing compiler option is one readable error)

#include "gravac/cuda/topk_cuda.hpp"
