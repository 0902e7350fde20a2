#pragma once
//! \file select_kernels.hpp
//! \brief The fused error-feedback exact top-k: a radix select over the float bits of |u|.
//!
//! For one layer of n values and k to keep (see topk_cuda.hpp for the sequence):
//! 1. select_fused_pass: u = g + e, e = u, statistics, an 11-bit histogram of key(u) =
//!    bits(|u|) (bits 30..20) in shared memory, and a candidate buffer of the keys at or
//!    above the previous step's threshold widened by a margin. Its last block finds the
//!    boundary bin; when that bin holds exactly the remainder, the threshold is known
//!    (early exit).
//! 2. collect_pass: only when the previous threshold missed (first step, or a jump):
//!    one read of e collects the boundary bin's keys.
//! 3. refine_pass (twice, 10-bit digits): histograms of the next digit over the candidate
//!    buffer (the whole input only when the boundary bin overflows the buffer).
//! 4. tie_pass: only when the exact threshold key T has more copies than the remainder:
//!    finds the index of the last tie to keep, so ties go to the lower index.
//! 5. an ordered stream compaction (cub::DeviceSelect) writes the selected indices in
//!    ascending order straight into the packet, and gather_pass writes the values and
//!    zeroes e there (the residual update).
//! The selection equals the CPU top-k's bit for bit: |u| ordered by its float bits is the
//! order of |u|. Infinities and NaNs are never selected (as gravac::topk): they stay in the
//! residual, and a layer with fewer finite values than k sends all of its finite values
//! (k is then the finite count, as gravac::topk does). The segment is placed on the device
//! (segment_cursor.hpp) once the count is known, so such a layer never shifts the others.

#include "gravac/cuda/detail/nvcc_flags.hpp"
// (first, and apart from the includes below: a missing compiler option is one readable error)

#include "gravac/cuda/detail/select_common.hpp"
#include "gravac/cuda/detail/select_fused_pass.hpp"
#include "gravac/cuda/detail/select_output.hpp"
#include "gravac/cuda/detail/select_refine_passes.hpp"
