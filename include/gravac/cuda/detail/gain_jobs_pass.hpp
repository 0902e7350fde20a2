#pragma once
//! \file
//! \brief The quantizers' gain pass in one launch over every layer: each layer's share of the
//! grid runs topk_cuda's fused pass (k = 0) on its own histogram, and the gain curve is summed
//! over the layers in layer order.

#include "gravac/cuda/detail/nvcc_flags.hpp"
// (first, and apart from the includes below: a missing compiler option is one readable error)

#include <cstdint>

#include "gravac/cuda/detail/quantize_cuda_kernels.hpp"
#include "gravac/cuda/detail/select_common.hpp"
#include "gravac/cuda/detail/select_fused_pass.hpp"

namespace gravac::detail {

//! u = g + e into e and the gain curve of u, for every job of the quantizers' table at once.
//!
//! Job j owns the blocks from jobs[j].block_first[pass_gain] on, as many as
//! select_fused_pass would be launched with on its layer alone, and strides over its layer as
//! that launch would: its histogram (\p hist and \p hist_sq, max_bins per job, zero before and
//! after), its state (\p states[j]) and its candidates' k (\p gain_k, max_gain_candidates per
//! job). Each job's last block writes the job's kept energies to its row of \p gain_part
//! (zeroed before the launch); the last job adds the rows in job order into \p gain_out. So
//! gain_out holds the bits that one select_fused_pass per layer, launched in layer order,
//! adds up to, whatever order the blocks run in. \p zero_threshold points to 0 (no previous
//! threshold); \p jobs_done is 0 before and after.
static __global__ void __launch_bounds__(select_threads)
    gain_jobs_pass(const float* __restrict__ g, float* __restrict__ e, const quant_job* __restrict__ jobs,
                   std::uint32_t job_count, select_state* __restrict__ states,
                   const std::uint32_t* __restrict__ zero_threshold, std::uint32_t* __restrict__ hist,
                   unsigned long long* __restrict__ hist_sq, const unsigned long long* __restrict__ gain_k,
                   int gain_count, double* __restrict__ gain_part, double* __restrict__ gain_out,
                   std::uint32_t* __restrict__ jobs_done) {
  const quant_job jb = find_job(jobs, job_count, pass_gain, blockIdx.x);
  const std::size_t j = jb.index;
  gain_request rq;
  rq.count = gain_count;
  for (int c = 0; c < gain_count; ++c) rq.k[c] = gain_k[j * max_gain_candidates + static_cast<std::size_t>(c)];
  const fused_grid grid{blockIdx.x - jb.block_first[pass_gain], job_blocks(jobs, job_count, pass_gain, jb)};
  const bool job_last = fused_pass_body(g + jb.offset, e + jb.offset, jb.numel, 0, states + j, zero_threshold,
                                        hist + j * max_bins, hist_sq + j * max_bins, nullptr, 0, nullptr, rq,
                                        gain_part + j * max_gain_candidates, false, nullptr, block_slots{}, grid);
  if (!job_last || !last_block_of(jobs_done, job_count)) return;
  for (int c = static_cast<int>(threadIdx.x); c < gain_count; c += select_threads) {
    double s = 0;
    for (std::uint32_t i = 0; i < job_count; ++i)
      s = __dadd_rn(s, gain_part[std::size_t{i} * max_gain_candidates + static_cast<std::size_t>(c)]);
    gain_out[c] = s;
  }
}

}  // namespace gravac::detail
