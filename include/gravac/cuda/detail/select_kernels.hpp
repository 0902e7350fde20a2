#pragma once
//! \file select_kernels.hpp
//! \brief The fused error-feedback exact top-k: a radix select over the float bits of |u|.
//!
//! Float bits of |u| order as |u| does, so a radix select on them equals the CPU top-k bit
//! for bit (see topk_cuda.hpp for the sequence); the passes: docs/algorithms.md, "The device
//! kernels".

#include "gravac/cuda/detail/nvcc_flags.hpp"
// (first, and apart from the includes below: a missing compiler option is one readable error)

#include "gravac/cuda/detail/select_common.hpp"
#include "gravac/cuda/detail/select_fused_pass.hpp"
#include "gravac/cuda/detail/select_output.hpp"
#include "gravac/cuda/detail/select_refine_passes.hpp"
