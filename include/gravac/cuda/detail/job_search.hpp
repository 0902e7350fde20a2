#pragma once
//! \file
//! \brief Which job of a grid shared by many layers owns a block: the quantizers' job table
//! and fused_jobs_pass both split one grid among their layers this way.

#include "gravac/cuda/detail/nvcc_flags.hpp"
// (first, and apart from the includes below: a missing compiler option is one readable error)

#include <cstdint>

namespace gravac::detail {

//! The index of the job that owns block \p block among the \p count jobs of \p jobs, in
//! grid order: the last whose first block, \p first_block(job), is at most \p block (a job
//! with no blocks shares its first block with the next one).
template <class Job, class FirstBlock>
__device__ __forceinline__ std::uint32_t owning_job(const Job* __restrict__ jobs, std::uint32_t count,
                                                    unsigned long long block, FirstBlock first_block) {
  std::uint32_t lo = 0, hi = count;
  while (hi - lo > 1) {
    const std::uint32_t mid = (lo + hi) / 2;
    if (first_block(jobs[mid]) <= block)
      lo = mid;
    else
      hi = mid;
  }
  return lo;
}

}  // namespace gravac::detail
