#pragma once
//! \file
//! \brief The fused pass (u = g + e, the norms, the gain curve) over many layers in one
//! launch: each layer's share of the grid runs select_fused_pass's body with k = 0 on its own
//! histogram, as one launch per layer would, and what the layers add up is added in layer
//! order. The quantizers' gain pass and AR-Topk's accumulate use it.

#include "gravac/cuda/detail/nvcc_flags.hpp"
// (first, and apart from the includes below: a missing compiler option is one readable error)

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "gravac/core/layout.hpp"
#include "gravac/core/step.hpp"
#include "gravac/cuda/detail/job_search.hpp"
#include "gravac/cuda/detail/launch.hpp"
#include "gravac/cuda/detail/launch_config.hpp"
#include "gravac/cuda/detail/ordered_sums.hpp"
#include "gravac/cuda/detail/select_common.hpp"
#include "gravac/cuda/detail/select_fused_pass.hpp"
#include "gravac/cuda/detail/stream_copies.hpp"
#include "gravac/cuda/device_buffer.hpp"

namespace gravac::detail {

//! One layer of a fused_jobs_pass.
struct fused_job {
  unsigned long long offset = 0;       //!< first element of the layer in g and e
  unsigned long long numel = 0;        //!< elements (at least one)
  unsigned long long block_first = 0;  //!< its first block in the grid
  std::uint32_t row = 0;               //!< its row in the per-layer arrays (states, sums, histograms, k, parts)
  std::uint32_t pad_ = 0;
};

//! What one fused_jobs_pass reads and writes besides g and e; rows are fused_job::row.
struct fused_jobs_args {
  const fused_job* jobs;                //!< the jobs, in layer order (block_first ascending)
  std::uint32_t job_count;              //!< at least one
  select_state* states;                 //!< per row: zero before the launch
  const std::uint32_t* zero_threshold;  //!< points to 0 (no previous threshold)
  std::uint32_t* hist;                  //!< max_bins per row, zero before and after
  unsigned long long* hist_sq;          //!< max_bins per row, zero before and after
  layer_sums* sums;                     //!< per row, added into (null: none)
  std::uint32_t* sums_done;             //!< per row, zero before and after (with sums)
  block_slots slots;                    //!< a slot per block of the grid (with sums)
  const unsigned long long* gain_k;     //!< max_gain_candidates per row
  int gain_count;                       //!< candidates of the gain curve (0: none)
  double* gain_part;                    //!< max_gain_candidates per row, zero before the launch
  double* gain_out;                     //!< the gain curve, summed over the rows in job order
  std::uint32_t* jobs_done;             //!< zero before and after
};

//! u = g + e into e, each layer's ||g||^2 and ||u||^2 (added to sums[row] in the host's order)
//! and the gain curve, for every job at once. Job q owns as many blocks as select_fused_pass
//! would be launched with on its layer alone (fused_jobs::build) and strides over its layer
//! as that launch would, so every row gets the bits that launch gives; each job's last block
//! writes its kept energies to its row of gain_part, and the last job adds the rows in job
//! order into gain_out: the bits of one launch per layer in layer order, whatever order the
//! blocks run in.
static __global__ void __launch_bounds__(select_threads)
    fused_jobs_pass(const float* __restrict__ g, float* __restrict__ e, fused_jobs_args a) {
  const std::uint32_t q = owning_job(a.jobs, a.job_count, blockIdx.x, [](const fused_job& j) { return j.block_first; });
  const fused_job& jb = a.jobs[q];
  const std::size_t r = jb.row;
  gain_request rq;
  rq.count = a.gain_count;
  for (int c = 0; c < a.gain_count; ++c) rq.k[c] = a.gain_k[r * max_gain_candidates + static_cast<std::size_t>(c)];
  const unsigned long long end = q + 1 < a.job_count ? a.jobs[q + 1].block_first : gridDim.x;
  pass_grid grid{blockIdx.x - jb.block_first, end - jb.block_first, jb.block_first, a.sums ? a.sums_done + r : nullptr};
  const bool job_last =
      fused_pass_body(g + jb.offset, e + jb.offset, jb.numel, 0, a.states + r, a.zero_threshold, a.hist + r * max_bins,
                      a.hist_sq + r * max_bins, nullptr, 0, a.sums ? a.sums + r : nullptr, rq,
                      a.gain_part + r * max_gain_candidates, false, nullptr, a.slots, grid);
  if (!job_last || !last_block_of(a.jobs_done, a.job_count)) return;
  for (int c = static_cast<int>(threadIdx.x); c < a.gain_count; c += select_threads) {
    double s = 0;
    for (std::uint32_t i = 0; i < a.job_count; ++i)
      s = __dadd_rn(s, a.gain_part[std::size_t{a.jobs[i].row} * max_gain_candidates + static_cast<std::size_t>(c)]);
    a.gain_out[c] = s;
  }
}

//! The job table of a layout's non-empty layers, in layer order, and the workspace of
//! fused_jobs_pass: a histogram per layer (48 KiB of device memory each), the candidates' k,
//! the gain parts, the counters and a statistics slot per block.
class fused_jobs {
 public:
  fused_jobs() = default;
  //! The jobs of \p lay's non-empty layers on a device of \p lc; a job's row is its layer's
  //! index (\p rows_by_layer) or its place among the jobs. Allocates on \p s.
  fused_jobs(const layout& lay, launch_config lc, bool rows_by_layer, stream_ref s) {
    std::vector<fused_job>& host = host_jobs_;
    unsigned long long blocks = 0;
    for (std::size_t i = 0; i < lay.size(); ++i) {
      if (lay[i].numel == 0) continue;
      fused_job j;
      j.offset = lay[i].offset;
      j.numel = lay[i].numel;
      j.block_first = blocks;
      j.row = static_cast<std::uint32_t>(rows_by_layer ? i : host.size());
      host.push_back(j);
      blocks += static_cast<unsigned long long>(lc.grid_stride(lay[i].numel, square_tile));
    }
    blocks_ = blocks;
    const std::size_t rows = std::max<std::size_t>(rows_by_layer ? lay.size() : host.size(), 1);
    table_ = device_buffer<fused_job>(std::max<std::size_t>(host.size(), 1), s);
    hist_ = device_buffer<std::uint32_t>(rows * max_bins, s);
    hist_sq_ = device_buffer<unsigned long long>(rows * max_bins, s);
    gain_k_ = device_buffer<unsigned long long>(rows * max_gain_candidates, s);
    gain_part_ = device_buffer<double>(rows * max_gain_candidates, s);
    sums_done_ = device_buffer<std::uint32_t>(rows, s);
    counters_ = device_buffer<std::uint32_t>(2, s);  // jobs_done, and 0 as the no-threshold
    slots_ = block_slots_buffer(std::max<unsigned long long>(blocks, 1), s);
    k_host_.resize(rows * max_gain_candidates);
    if (!host.empty()) {
      pinned_buffer<fused_job> staging(host.size());
      std::copy(host.begin(), host.end(), staging.data());
      GRAVAC_TRY_CUDA(cudaMemcpyAsync(table_.data(), staging.data(), host.size() * sizeof(fused_job),
                                      cudaMemcpyHostToDevice, s.get()));
      s.synchronize();  // the staging is freed when this returns
    }
  }

  //! Jobs (non-empty layers).
  [[nodiscard]] std::uint32_t count() const noexcept { return static_cast<std::uint32_t>(host_jobs_.size()); }

  //! Queues the zeroing of the histograms and counters on \p s. A pass leaves them zero; a
  //! step that failed calls this in its repair, in case it was cut short inside the kernel.
  void reset(cudaStream_t s) { clear_async(s, hist_, hist_sq_, sums_done_, counters_); }

  //! Queues fused_jobs_pass on \p s: u = g + e into e; each row's ||g||^2 and ||u||^2 added
  //! into \p sums (null: none); the gain curve of \p candidates into \p gain_out (assigned;
  //! none when empty). \p states (a row each) must be zero. Nothing is queued without jobs.
  //! The candidates' k are uploaded when they change (through pinned staging that such a
  //! call rewrites: the caller waits for the stream between two calls, as each step does).
  void queue(cudaStream_t s, const float* g, float* e, select_state* states, layer_sums* sums,
             std::span<const double> candidates, double* gain_out) {
    if (host_jobs_.empty()) return;
    const int c_count = static_cast<int>(candidates.size());
    if (c_count > 0) {
      if (!std::equal(candidates.begin(), candidates.end(), k_of_.begin(), k_of_.end())) {
        for (const fused_job& j : host_jobs_)
          for (std::size_t c = 0; c < candidates.size(); ++c)
            k_host_[std::size_t{j.row} * max_gain_candidates + c] = kept_count(j.numel, candidates[c]);
        GRAVAC_TRY_CUDA(cudaMemcpyAsync(gain_k_.data(), k_host_.data(), k_host_.size() * sizeof(unsigned long long),
                                        cudaMemcpyHostToDevice, s));
        k_of_.assign(candidates.begin(), candidates.end());
      }
      clear_async(s, gain_part_);
    }
    fused_jobs_args a{table_.data(), count(),         states,  counters_.data() + 1,
                      hist_.data(),  hist_sq_.data(), sums,    sums_done_.data(),
                      slots_.view(), gain_k_.data(),  c_count, gain_part_.data(),
                      gain_out,      counters_.data()};
    launch(&fused_jobs_pass, static_cast<unsigned>(blocks_), select_threads, s, g, e, a);
  }

 private:
  unsigned long long blocks_ = 0;
  std::vector<fused_job> host_jobs_;  // the table, as uploaded
  std::vector<double> k_of_;          // the candidates gain_k_ holds the k of
  device_buffer<fused_job> table_;
  device_buffer<std::uint32_t> hist_;
  device_buffer<unsigned long long> hist_sq_;
  device_buffer<unsigned long long> gain_k_;
  device_buffer<double> gain_part_;
  device_buffer<std::uint32_t> sums_done_;
  device_buffer<std::uint32_t> counters_;
  block_slots_buffer slots_;
  pinned_buffer<unsigned long long> k_host_;
};

}  // namespace gravac::detail
