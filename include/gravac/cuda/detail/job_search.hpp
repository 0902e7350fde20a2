#pragma once
//! \file
//! \brief Which job of a grid shared by many layers owns a block: the quantizers' job table
//! and fused_jobs_pass both split one grid among their layers this way.

#include "gravac/cuda/detail/nvcc_flags.hpp"
// (first, and apart from the includes below: a missing compiler option is one readable error)

#include <cstdint>

#include "gravac/cuda/detail/select_common.hpp"

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

//! The job of \p jobs that owns this block of a grid split among them by their column \p P of
//! first blocks (Job::first[P]), and its share of the grid into \p grid (no statistics
//! counter: the caller sets grid.sums_done where the pass sums).
template <int P, class Job>
__device__ __forceinline__ const Job& owning_share(const Job* __restrict__ jobs, std::uint32_t count, pass_grid& grid) {
  const std::uint32_t q = owning_job(jobs, count, blockIdx.x, [](const Job& j) { return j.first[P]; });
  const Job& jb = jobs[q];
  const unsigned long long end = q + 1 < count ? jobs[q + 1].first[P] : gridDim.x;
  grid = {blockIdx.x - jb.first[P], end - jb.first[P], jb.first[P], nullptr};
  return jb;
}

//! The job whose elements start at the largest offset at most \p at (jobs in layer order).
template <class Job>
__device__ __forceinline__ const Job& job_containing(const Job* __restrict__ jobs, std::uint32_t count,
                                                     unsigned long long at) {
  return jobs[owning_job(jobs, count, at, [](const Job& j) { return j.offset; })];
}

//! Where the ordered compaction of a job table puts its entries: entry \p j of a window
//! is element \p base + \p i, of the job that contains it, and goes to place
//! j - first_out[row] of that job's output (the writers of select_jobs and adacomp_jobs).
template <class Job>
struct compacted_places {
  const Job* jobs;                      //!< the step's table, in layer order
  std::uint32_t count;                  //!< jobs
  const unsigned long long* first_out;  //!< per row: its first entry in its window
  unsigned long long base;              //!< the window's first element
  std::uint32_t* mismatch;              //!< set when a place is at or past its job's limit
  //! Stores entry \p j (element base + \p i) through \p store(job, place, index within
  //! the job), or, at or past \p limit(job) (a selection that did not yield its count),
  //! only sets mismatch.
  template <class Limit, class Store>
  __device__ __forceinline__ void put(std::int64_t j, std::uint32_t i, Limit limit, Store store) const {
    const unsigned long long at = base + i;
    const Job& jb = job_containing(jobs, count, at);
    const std::int64_t p = j - static_cast<std::int64_t>(first_out[jb.row]);
    if (p >= 0 && static_cast<unsigned long long>(p) < limit(jb))
      store(jb, p, static_cast<std::uint32_t>(at - jb.offset));
    else
      atomicExch(mismatch, 1u);
  }
};

//! One thread: the segments of every job in layer order, raw ones whole and the others
//! through \p place_selected(job), which places its segment and returns its count; each
//! of those jobs' first entry in its window's compaction into first_out[row], and each
//! window's total into expected[window] (what the compaction must select).
template <class Job, class PlaceSelected>
__device__ void place_in_layer_order(const Job* __restrict__ jobs, std::uint32_t count, std::byte* packet,
                                     packet_cursor* cursor, segment_slot* seg, unsigned long long* first_out,
                                     unsigned long long* expected, PlaceSelected place_selected) {
  unsigned long long run = 0;
  std::uint32_t window = jobs[0].window;
  for (std::uint32_t q = 0; q < count; ++q) {
    const Job& jb = jobs[q];
    if (jb.window != window) {
      window = jb.window;
      run = 0;
    }
    if (jb.raw) {
      place_layer_segment(packet, cursor, seg + jb.row, jb.row, jb.numel, jb.numel, true);
    } else {
      const unsigned long long placed = place_selected(jb);
      first_out[jb.row] = run;
      run += placed;
    }
    expected[window] = run;
  }
}

}  // namespace gravac::detail
