#pragma once
//! \file
//! \brief adacomp_cuda's steps 1 to 3 for every layer in a fixed number of launches: the bin
//! maxima, the scale and the count of each layer through one job table; the segments placed
//! by one thread in layer order; the raw layers; and one ordered compaction per window of
//! fewer than 2^32 elements writing each layer's indices into its segment. Each layer's share
//! of a grid runs the body a launch on the layer alone would (the same bits).

#include "gravac/cuda/detail/nvcc_flags.hpp"
// (first, and apart from the includes below: a missing compiler option is one readable error)

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "gravac/core/layout.hpp"
#include "gravac/core/step.hpp"
#include "gravac/cuda/detail/adacomp_kernels.hpp"
#include "gravac/cuda/detail/compaction_windows.hpp"
#include "gravac/cuda/detail/cub_primitives.hpp"
#include "gravac/cuda/detail/job_search.hpp"
#include "gravac/cuda/detail/launch.hpp"
#include "gravac/cuda/detail/launch_config.hpp"
#include "gravac/cuda/detail/ordered_sums.hpp"
#include "gravac/cuda/detail/segment_cursor.hpp"
#include "gravac/cuda/detail/select_output.hpp"
#include "gravac/cuda/detail/stream_copies.hpp"
#include "gravac/cuda/device_buffer.hpp"

namespace gravac::detail {

//! The grids adacomp_jobs shares among the layers.
enum adacomp_pass : int {
  adacomp_pass_bins = 0,   //!< step 1 (adacomp_tile elements a block)
  adacomp_pass_scale = 1,  //!< step 2 (over the bins)
  adacomp_pass_count = 2,  //!< step 3's count
  adacomp_pass_raw = 3,    //!< layers sent raw (select_threads a block)
  adacomp_pass_count_ = 4
};

//! One non-empty layer of a step, in layer order.
struct adacomp_job {
  unsigned long long offset = 0;                       //!< its first element in g and r
  unsigned long long numel = 0;                        //!< its elements
  unsigned long long first[adacomp_pass_count_] = {};  //!< its first block in each grid
  unsigned long long bins_at = 0;                      //!< its bin maxima in the shared gmax
  std::uint32_t bins = 0;                              //!< its bins (0 when raw)
  std::uint32_t bin = 0;                               //!< its bin length L this step
  std::uint32_t row = 0;                               //!< its layer index
  std::uint32_t window = 0;                            //!< the compaction it belongs to
  std::uint32_t raw = 0;                               //!< sent raw this step
  std::uint32_t pad_ = 0;
};

//! What the passes read and write besides g, r and the packet. Rows are layer indices.
struct adacomp_jobs_args {
  const adacomp_job* jobs;        //!< the step's table
  std::uint32_t count;            //!< jobs (at least one)
  std::uint32_t* gmax;            //!< the bin maxima, zero before the bins pass
  unsigned long long* acc;        //!< exponent_slots per row, zero before and after
  select_state* states;           //!< per row, zero at the step's start
  layer_sums* sums;               //!< per row
  segment_slot* seg;              //!< per row
  packet_cursor* cursor;          //!< zero at the step's start
  float* scales;                  //!< per row
  std::uint32_t* sums_done;       //!< per row, zero before and after
  block_slots slots;              //!< a slot per block of the raw pass
  unsigned long long* first_out;  //!< per row: its first entry in its window's compaction
  unsigned long long* expected;   //!< per window: what its layers counted
};

//! Step 1 for every compressed layer (adacomp_bins_body).
static __global__ void __launch_bounds__(adacomp_threads)
    adacomp_jobs_bins(const float* __restrict__ r, adacomp_jobs_args a) {
  pass_grid grid;
  const adacomp_job& jb = owning_share<adacomp_pass_bins>(a.jobs, a.count, grid);
  adacomp_bins_body(r + jb.offset, static_cast<std::uint32_t>(jb.numel), jb.bin, a.gmax + jb.bins_at, a.states + jb.row,
                    grid);
}

//! Step 2 for every compressed layer (adacomp_scale_body).
static __global__ void __launch_bounds__(adacomp_threads) adacomp_jobs_scale(adacomp_jobs_args a) {
  pass_grid grid;
  const adacomp_job& jb = owning_share<adacomp_pass_scale>(a.jobs, a.count, grid);
  grid.sums_done = a.sums_done + jb.row;
  const std::size_t w = jb.row;
  adacomp_scale_body(a.gmax + jb.bins_at, jb.bins, a.acc + w * exponent_slots, a.states + w, a.scales + w, grid);
}

//! Step 3's count for every compressed layer (adacomp_count_body).
static __global__ void __launch_bounds__(adacomp_threads)
    adacomp_jobs_count(const float* __restrict__ g, const float* __restrict__ r, adacomp_jobs_args a) {
  pass_grid grid;
  const adacomp_job& jb = owning_share<adacomp_pass_count>(a.jobs, a.count, grid);
  grid.sums_done = a.sums_done + jb.row;
  adacomp_count_body(adacomp_sent{r + jb.offset, g + jb.offset, a.gmax + jb.bins_at, jb.bin},
                     static_cast<std::uint32_t>(jb.numel), a.states + jb.row, grid);
}

//! Every layer's segment in layer order (one thread): raw, or AdaComp's of the count step
//! 3 found (also into the state's `selected`); each compressed layer's first entry in its
//! window's compaction and each window's total.
static __global__ void adacomp_jobs_place(std::byte* __restrict__ packet, adacomp_jobs_args a) {
  if (blockIdx.x != 0 || threadIdx.x != 0) return;
  place_in_layer_order(a.jobs, a.count, packet, a.cursor, a.seg, a.first_out, a.expected, [&](const adacomp_job& jb) {
    const unsigned long long count = a.states[jb.row].count;
    place_adacomp_segment_at(packet, a.cursor, a.seg + jb.row, count, a.scales[jb.row], jb.row, jb.numel, jb.bin);
    a.states[jb.row].selected = count;
    return count;
  });
}

//! Every raw layer (raw_body).
static __global__ void __launch_bounds__(select_threads)
    adacomp_jobs_raw(const float* __restrict__ g, float* __restrict__ r, std::byte* __restrict__ packet,
                     adacomp_jobs_args a) {
  pass_grid grid;
  const adacomp_job& jb = owning_share<adacomp_pass_raw>(a.jobs, a.count, grid);
  grid.sums_done = a.sums_done + jb.row;
  const std::size_t w = jb.row;
  raw_body(g + jb.offset, r + jb.offset, packet, a.seg + w, jb.numel, a.sums + w, a.states + w, true, a.slots, grid);
}

//! The compaction's predicate over a window: element base + i is sent by its layer
//! (adacomp_sent; never in a raw layer).
struct adacomp_sent_in_jobs {
  const float* r;
  const float* g;
  const std::uint32_t* gmax;
  const adacomp_job* jobs;
  std::uint32_t count;
  unsigned long long base;  //!< the window's first element
  __device__ __forceinline__ bool operator()(std::uint32_t i) const {
    const unsigned long long at = base + i;
    const adacomp_job& jb = job_containing(jobs, count, at);
    if (jb.raw || at - jb.offset >= jb.numel) return false;
    return adacomp_sent{r + jb.offset, g + jb.offset, gmax + jb.bins_at,
                        jb.bin}(static_cast<std::uint32_t>(at - jb.offset));
  }
};

//! The compaction's output: the j-th index of the window into its layer's index region at
//! j - first_out; one outside its layer's count is not written and sets \p mismatch.
struct adacomp_jobs_writer {
  compacted_places<adacomp_job> places;
  std::byte* packet;
  const segment_slot* seg;
  __device__ __forceinline__ void operator()(std::int64_t j, std::uint32_t i) const {
    places.put(
        j, i, [&](const adacomp_job& jb) { return seg[jb.row].count; },
        [&](const adacomp_job& jb, std::int64_t p, std::uint32_t index) {
          reinterpret_cast<std::uint32_t*>(packet + seg[jb.row].payload_at + 8)[p] = index;
        });
  }
};

//! The per-layer state adacomp_cuda keeps and adacomp_jobs writes (rows are layer indices).
struct adacomp_rows {
  select_state* states;
  layer_sums* sums;
  segment_slot* seg;
  packet_cursor* cursor;
  float* scales;
};

//! The job tables and workspace of adacomp_cuda's steps 1 to 3: 5 launches a step plus
//! one compaction per window (one below 2^32 elements), at any number of layers.
class adacomp_jobs {
 public:
  adacomp_jobs() = default;
  //! The workspace for \p lay on a device of \p lc, allocated on \p s: 2 KiB per layer for
  //! the exponent sums; the bin maxima grow with the bins a step needs.
  adacomp_jobs(const layout& lay, launch_config lc, stream_ref s) : launch_(lc) {
    const std::size_t L = std::max<std::size_t>(lay.size(), 1);
    unsigned long long blocks = 0;
    for (std::size_t i = 0; i < lay.size(); ++i) {
      const auto& l = lay[i];
      if (l.numel == 0) continue;
      adacomp_job j;
      j.offset = l.offset;
      j.numel = l.numel;
      j.row = static_cast<std::uint32_t>(i);
      j.window = add_to_windows(windows_, l.offset, l.numel);
      jobs_.push_back(j);
      blocks += static_cast<unsigned long long>(lc.grid_stride(l.numel, square_tile));  // the raw pass's slots
    }
    const std::size_t W = std::max<std::size_t>(windows_.size(), 1);
    table_ = device_buffer<adacomp_job>(std::max<std::size_t>(jobs_.size(), 1), s);
    staging_ = pinned_buffer<adacomp_job>(std::max<std::size_t>(jobs_.size(), 1));
    gmax_ = device_buffer<std::uint32_t>(1, s);
    acc_ = device_buffer<unsigned long long>(L * exponent_slots, s);
    sums_done_ = device_buffer<std::uint32_t>(L, s);
    first_out_ = device_buffer<unsigned long long>(L, s);
    expected_ = device_buffer<unsigned long long>(W, s);
    selected_ = device_buffer<unsigned long long>(W, s);
    counters_ = device_buffer<std::uint32_t>(2, s);  // mismatch, failure
    slots_ = block_slots_buffer(std::max<unsigned long long>(blocks, 1), s);
    temp_ = device_buffer<std::byte>(
        compaction_temp_bytes<adacomp_sent_in_jobs, adacomp_jobs_writer>(windows_, s.get()), s);
  }

  //! Queues the zeroing of the exponent sums and counters (a pass leaves them ready; a step
  //! that failed calls this in its repair, in case a kernel was cut short).
  void reset(cudaStream_t s) { clear_async(s, acc_, sums_done_, counters_); }

  //! The check adacomp_signs makes of this step's compaction (its failure word is copied
  //! back by the caller through failure()).
  [[nodiscard]] compaction_check check() noexcept {
    return {selected_.data(), expected_.data(), static_cast<std::uint32_t>(windows_.size()), counters_.data(),
            counters_.data() + 1};
  }
  //! Where adacomp_signs reports an inexact compaction (zeroed by queue()).
  [[nodiscard]] const device_buffer<std::uint32_t>& counters() const noexcept { return counters_; }

  //! Queues steps 1 to 3 of every layer on \p s, after the fused pass wrote u into r: raw
  //! where \p p's kept fraction is dense_fraction or more, AdaComp at bin length
  //! \p bin_length(i) otherwise. \p rows must be cleared. Returns without queuing anything
  //! for a layout with no elements.
  template <class BinLength>
  void queue(cudaStream_t s, const float* g, float* r, std::byte* packet, const step_params& p, BinLength bin_length,
             const adacomp_rows& rows) {
    if (jobs_.empty()) return;
    unsigned long long blocks[adacomp_pass_count_] = {};
    unsigned long long bins = 0;
    for (std::size_t q = 0; q < jobs_.size(); ++q) {
      adacomp_job& j = staging_.data()[q];
      j = jobs_[q];
      j.raw = p.kept_fraction[j.row] >= dense_fraction ? 1u : 0u;
      for (int pass = 0; pass < adacomp_pass_count_; ++pass) j.first[pass] = blocks[pass];
      if (j.raw) {
        blocks[adacomp_pass_raw] += static_cast<unsigned long long>(launch_.grid_stride(j.numel, square_tile));
        continue;
      }
      j.bin = bin_length(j.row);
      j.bins = static_cast<std::uint32_t>((j.numel + j.bin - 1) / j.bin);
      j.bins_at = bins;
      bins += j.bins;
      blocks[adacomp_pass_bins] +=
          static_cast<unsigned long long>(launch_.grid_stride(j.numel, static_cast<int>(adacomp_tile)));
      blocks[adacomp_pass_scale] +=
          static_cast<unsigned long long>(launch_.grid_stride(j.bins, static_cast<int>(adacomp_threads) * 4));
      blocks[adacomp_pass_count] +=
          static_cast<unsigned long long>(launch_.grid_stride(j.numel, static_cast<int>(adacomp_threads)));
    }
    gmax_.reserve(std::max<unsigned long long>(bins, 1));
    GRAVAC_TRY_CUDA(
        cudaMemcpyAsync(table_.data(), staging_.data(), jobs_.size() * sizeof(adacomp_job), cudaMemcpyHostToDevice, s));
    clear_async(s, counters_);
    if (bins > 0) GRAVAC_TRY_CUDA(cudaMemsetAsync(gmax_.data(), 0, bins * sizeof(std::uint32_t), s));
    const adacomp_jobs_args a{table_.data(),   static_cast<std::uint32_t>(jobs_.size()),
                              gmax_.data(),    acc_.data(),
                              rows.states,     rows.sums,
                              rows.seg,        rows.cursor,
                              rows.scales,     sums_done_.data(),
                              slots_.view(),   first_out_.data(),
                              expected_.data()};
    const auto grid = [&](int pass) { return static_cast<unsigned>(blocks[pass]); };
    if (bins > 0) {
      launch(&adacomp_jobs_bins, grid(adacomp_pass_bins), adacomp_threads, s, r, a);
      launch(&adacomp_jobs_scale, grid(adacomp_pass_scale), adacomp_threads, s, a);
      launch(&adacomp_jobs_count, grid(adacomp_pass_count), adacomp_threads, s, g, r, a);
    }
    launch(&adacomp_jobs_place, one_block, one_thread, s, packet, a);
    if (blocks[adacomp_pass_raw] > 0) {
      launch(&adacomp_jobs_raw, grid(adacomp_pass_raw), select_threads, s, g, r, packet, a);
    }
    compact_windows(
        windows_, temp_, selected_.data(), s,
        [&](const compaction_window& w) {
          return adacomp_sent_in_jobs{r, g, gmax_.data(), table_.data(), a.count, w.start};
        },
        [&](const compaction_window& w) {
          return adacomp_jobs_writer{
              {table_.data(), a.count, first_out_.data(), w.start, counters_.data()}, packet, rows.seg};
        });
  }

 private:
  launch_config launch_;
  std::vector<adacomp_job> jobs_;  // the layers, as constructed (raw, bins and blocks are per step)
  std::vector<compaction_window> windows_;
  device_buffer<adacomp_job> table_;
  pinned_buffer<adacomp_job> staging_;  // the step's table (rewritten once the last step's stream finished)
  device_buffer<std::uint32_t> gmax_;
  device_buffer<unsigned long long> acc_;
  device_buffer<std::uint32_t> sums_done_;
  device_buffer<unsigned long long> first_out_;
  device_buffer<unsigned long long> expected_;
  device_buffer<unsigned long long> selected_;
  device_buffer<std::uint32_t> counters_;
  device_buffer<std::byte> temp_;
  block_slots_buffer slots_;
};

}  // namespace gravac::detail
