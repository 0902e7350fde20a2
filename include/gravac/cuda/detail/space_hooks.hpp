#pragma once
//! \file
//! \brief The one way backend code for cuda_space reaches the host layers: the
//! specializations of their memory-space customization points that every step on device
//! memory needs (the trainer's non-finite screening, detail::non_finite_ops, and its
//! ordering after the gradient's producer, detail::layer_events). Every CUDA compressor
//! includes this header, so a trainer over one finds them without naming the backend. A
//! collective's device half (cuda/detail/ar_topk_device_passes.hpp, shard_staging.hpp) is
//! included the same way by the compressors whose packets that collective aggregates.

#include "gravac/cuda/detail/nvcc_flags.hpp"
// (first, and apart from the includes below: a missing compiler option is one readable error)

#include "gravac/cuda/detail/layer_events_cuda.hpp"
#include "gravac/cuda/detail/non_finite_kernels.hpp"
