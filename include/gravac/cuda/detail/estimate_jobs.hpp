#pragma once
//! \file
//! \brief threshold_cuda's estimate of every layer's low threshold in three launches,
//! whatever the number of layers: the histogram of each layer (or of its sample) with the
//! boundary found by the layer's last block, then the sample's two refining digits. Each
//! layer's share of a grid runs the body a launch on the layer alone would (the same bits).

#include "gravac/cuda/detail/nvcc_flags.hpp"
// (first, and apart from the includes below: a missing compiler option is one readable error)

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "gravac/core/layout.hpp"
#include "gravac/core/step.hpp"
#include "gravac/cuda/detail/job_search.hpp"
#include "gravac/cuda/detail/launch.hpp"
#include "gravac/cuda/detail/launch_config.hpp"
#include "gravac/cuda/detail/select_common.hpp"
#include "gravac/cuda/detail/stream_copies.hpp"
#include "gravac/cuda/detail/threshold_kernels.hpp"
#include "gravac/cuda/device_buffer.hpp"

namespace gravac::detail {

//! One layer's estimate in a step, in layer order.
struct estimate_job {
  estimate_request rq;               //!< what the host derived (threshold::estimate's parameters)
  unsigned long long offset = 0;     //!< its first element in g and e
  unsigned long long first[2] = {};  //!< its first block in the histogram and in the refine grids
  std::uint32_t row = 0;             //!< its layer index
  std::uint32_t pad_ = 0;
};

//! What the estimate's passes read and write besides g and e. Rows are layer indices.
struct estimate_jobs_args {
  const estimate_job* jobs;  //!< the step's table
  std::uint32_t count;       //!< jobs (at least one)
  std::uint32_t* hist;       //!< estimate_bins per row, zero before and after
  estimate_state* states;    //!< per row
  std::uint32_t* guess;      //!< per row: the low threshold's key (estimate_none: none)
};

//! Every layer's histogram (estimate_histogram_body); each layer's last block then finds its
//! boundary (estimate_threshold_body).
static __global__ void __launch_bounds__(select_threads)
    estimate_jobs_histogram(const float* __restrict__ g, const float* __restrict__ e, estimate_jobs_args a) {
  pass_grid grid;
  const estimate_job& jb = owning_share<0>(a.jobs, a.count, grid);
  const std::size_t r = jb.row;
  std::uint32_t* hist = a.hist + r * estimate_bins;
  estimate_histogram_body(g + jb.offset, e + jb.offset, jb.rq, hist, grid);
  if (!last_block_of(&a.states[r].blocks_done, grid.blocks)) return;
  estimate_threshold_body(hist, jb.rq, a.states + r, a.guess + r);
}

//! One refining digit of every sampled layer (estimate_refine_body).
static __global__ void __launch_bounds__(select_threads)
    estimate_jobs_refine(const float* __restrict__ g, const float* __restrict__ e, estimate_jobs_args a, int shift) {
  pass_grid grid;
  const estimate_job& jb = owning_share<1>(a.jobs, a.count, grid);
  const std::size_t r = jb.row;
  estimate_refine_body(g + jb.offset, e + jb.offset, jb.rq, a.hist + r * estimate_bins, a.states + r, shift,
                       a.guess + r, grid);
}

//! The job table and workspace of the estimate over a layout's layers: a histogram of 16 KiB
//! and a state per layer.
class estimate_jobs {
 public:
  estimate_jobs() = default;
  //! The workspace for \p lay on a device of \p lc, allocated on \p s.
  estimate_jobs(const layout& lay, launch_config lc, stream_ref s) : launch_(lc), layout_(lay) {
    const std::size_t L = std::max<std::size_t>(lay.size(), 1);
    table_ = device_buffer<estimate_job>(L, s);
    staging_ = pinned_buffer<estimate_job>(L);
    hist_ = device_buffer<std::uint32_t>(L * estimate_bins, s);
    states_ = device_buffer<estimate_state>(L, s);
  }

  //! Queues the zeroing of the histograms and states (a pass leaves them ready; a step that
  //! failed calls this in its repair, in case a kernel was cut short).
  void reset(cudaStream_t s) { clear_async(s, hist_, states_); }

  //! Queues, on \p s, the low threshold of every non-empty layer that \p p does not send raw
  //! into guess[layer]; \p request(i) gives layer i's estimate_request. The table is
  //! rewritten through pinned staging: the caller waits for the stream between two calls.
  template <class Request>
  void queue(cudaStream_t s, const float* g, const float* e, const step_params& p, std::uint32_t* guess,
             Request request) {
    std::uint32_t count = 0;
    unsigned long long blocks[2] = {0, 0};
    for (std::size_t i = 0; i < layout_.size(); ++i) {
      const auto& l = layout_[i];
      if (l.numel == 0 || p.kept_fraction[i] >= dense_fraction) continue;
      estimate_job& j = staging_.data()[count++];
      j = estimate_job{};
      j.rq = request(i);
      j.offset = l.offset;
      j.row = static_cast<std::uint32_t>(i);
      j.first[0] = blocks[0];
      j.first[1] = blocks[1];
      const unsigned long long m = j.rq.sampled ? j.rq.runs * j.rq.run : j.rq.n;
      const auto grid = static_cast<unsigned long long>(launch_.grid_stride(m, select_threads));
      blocks[0] += grid;
      if (j.rq.sampled) blocks[1] += grid;
    }
    if (count == 0) return;
    GRAVAC_TRY_CUDA(
        cudaMemcpyAsync(table_.data(), staging_.data(), count * sizeof(estimate_job), cudaMemcpyHostToDevice, s));
    const estimate_jobs_args a{table_.data(), count, hist_.data(), states_.data(), guess};
    launch(&estimate_jobs_histogram, static_cast<unsigned>(blocks[0]), select_threads, s, g, e, a);
    if (blocks[1] == 0) return;
    for (int shift : {estimate_digit_shift, 0})  // a sample: its exact order statistic, as the host's
      launch(&estimate_jobs_refine, static_cast<unsigned>(blocks[1]), select_threads, s, g, e, a, shift);
  }

 private:
  launch_config launch_;
  layout layout_;
  device_buffer<estimate_job> table_;
  pinned_buffer<estimate_job> staging_;
  device_buffer<std::uint32_t> hist_;
  device_buffer<estimate_state> states_;
};

}  // namespace gravac::detail
