#pragma once
//! \file
//! \brief The per-layer radix select of topk_cuda and threshold_cuda in a fixed number of
//! launches, whatever the number of layers: each pass is one launch whose grid the layers
//! share through a job table, each layer's share running that pass's body as a launch on
//! the layer alone would (the same blocks, the same strides: the same bits); the packet's
//! segments are placed by one thread in layer order, and one ordered compaction lists the
//! selected indices of every layer.

#include "gravac/cuda/detail/nvcc_flags.hpp"
// (first, and apart from the includes below: a missing compiler option is one readable error)

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "gravac/compress/detail/gain_sampling.hpp"
#include "gravac/core/error.hpp"
#include "gravac/core/layout.hpp"
#include "gravac/core/step.hpp"
#include "gravac/cuda/detail/compaction_windows.hpp"
#include "gravac/cuda/detail/job_search.hpp"
#include "gravac/cuda/detail/launch.hpp"
#include "gravac/cuda/detail/launch_config.hpp"
#include "gravac/cuda/detail/ordered_sums.hpp"
#include "gravac/cuda/detail/segment_cursor.hpp"
#include "gravac/cuda/detail/select_common.hpp"
#include "gravac/cuda/detail/select_fused_pass.hpp"
#include "gravac/cuda/detail/select_output.hpp"
#include "gravac/cuda/detail/select_refine_passes.hpp"
#include "gravac/cuda/detail/stream_copies.hpp"
#include "gravac/cuda/device_buffer.hpp"

namespace gravac::detail {

//! The passes that share a grid among the layers (each has its own column of first blocks).
enum select_pass : int {
  select_pass_fused = 0,   //!< u = g + e, statistics, first digit (select_fused_pass's grid)
  select_pass_scan = 1,    //!< collect and refine (one block per select_threads values)
  select_pass_tie = 2,     //!< the tie search
  select_pass_raw = 3,     //!< layers sent raw
  select_pass_gather = 4,  //!< the sent values into the packet (one block per select_threads of k)
  select_pass_count = 5
};

//! One non-empty layer of a step, in layer order. A layer with no blocks in a pass shares
//! its first block with the next layer that has some (owning_job skips it).
struct select_job {
  unsigned long long offset = 0;                     //!< its first element in g and e
  unsigned long long numel = 0;                      //!< its elements (at least one)
  unsigned long long first[select_pass_count] = {};  //!< its first block in each pass's grid
  unsigned long long cand_at = 0;                    //!< its candidate buffer in the shared one
  unsigned long long chunks_at = 0;                  //!< its tie-search chunk counts in the shared ones
  std::uint32_t k = 0;                               //!< values to keep (0 when raw)
  std::uint32_t cap = 0;                             //!< its candidate buffer's capacity
  std::uint32_t row = 0;                             //!< its layer index (states, sums, slots, thresholds)
  std::uint32_t window = 0;                          //!< the compaction it belongs to
  std::uint32_t raw = 0;                             //!< sent raw (dense) this step
  std::uint32_t gain_stride = 1;                     //!< its gain curve's sampling (gain_request::stride)
  std::uint32_t gain_phase = 0;                      //!< and phase this step
  std::uint32_t pad_ = 0;
};

//! What the passes read and write besides g, e and the packet. Rows are layer indices.
struct select_jobs_args {
  const select_job* jobs;            //!< the step's table, in layer order
  std::uint32_t count;               //!< jobs (at least one)
  std::uint32_t fused_jobs;          //!< jobs with blocks in the fused pass
  bool threshold_mode;               //!< threshold_cuda: prev_threshold holds the estimate
  select_state* states;              //!< per row: zero at the step's start
  std::uint32_t* prev_threshold;     //!< per row
  layer_sums* sums;                  //!< per row: zero at the step's start
  segment_slot* seg;                 //!< per row: the placed segments
  packet_cursor* cursor;             //!< zero at the step's start
  std::uint32_t* hist;               //!< max_bins per row, zero before and after
  unsigned long long* hist_sq;       //!< max_bins per row, zero before and after
  std::uint32_t* cand;               //!< the candidate buffers (select_job::cand_at)
  std::uint32_t* chunk_counts;       //!< the tie search's counts (select_job::chunks_at)
  std::uint32_t* sums_done;          //!< per row, zero before and after
  block_slots slots;                 //!< a slot per block of the largest pass
  const unsigned long long* gain_k;  //!< max_gain_candidates per row
  int gain_count;                    //!< candidates of the gain curve (0: none)
  double* gain_part;                 //!< max_gain_candidates per row, zero before the fused pass
  double* gain_out;                  //!< the gain curve: the rows added in layer order
  std::uint32_t* sample_hist;        //!< max_bins per row of a sampled layer (gain_request), zero before and after
  unsigned long long* sample_sq;     //!< the same rows' energies
  std::uint32_t* jobs_done;          //!< zero before and after
  unsigned long long* first_out;     //!< per row: its first entry in its window's compaction
  unsigned long long* expected;      //!< per window: values its layers send
  unsigned long long* selected;      //!< per window: values its compaction selected
  std::uint32_t* mismatch;           //!< set when an index landed outside its layer's share
  std::uint32_t* failure;            //!< set when a layer's selection was not its count
};

//! Pass 1 for every layer (fused_pass_body on each layer's share); a raw layer with a gain
//! curve runs it with k = 0 for its part of the curve. The last layer to finish adds the
//! layers' parts of the curve in layer order: the bits of one launch per layer. With \p g
//! null, u is e as it stands, read only (the index lists; a.sums null then: no statistics).
static __global__ void __launch_bounds__(select_threads)
    select_jobs_fused(const float* __restrict__ g, float* __restrict__ e, select_jobs_args a) {
  pass_grid grid;
  const select_job& jb = owning_share<select_pass_fused>(a.jobs, a.count, grid);
  grid.sums_done = a.sums_done + jb.row;
  const std::size_t r = jb.row;
  gain_request rq;
  rq.count = a.gain_count;
  for (int c = 0; c < a.gain_count; ++c) rq.k[c] = a.gain_k[r * max_gain_candidates + static_cast<std::size_t>(c)];
  rq.stride = jb.gain_stride;
  rq.phase = jb.gain_phase;
  if (rq.stride > 1) {
    rq.sample_hist = a.sample_hist + r * max_bins;
    rq.sample_sq = a.sample_sq + r * max_bins;
  }
  const bool raw = jb.raw != 0;
  const bool job_last =
      fused_pass_body(g ? g + jb.offset : nullptr, e + jb.offset, jb.numel, raw ? 0u : jb.k, a.states + r,
                      a.prev_threshold + r, a.hist + r * max_bins, a.hist_sq + r * max_bins, a.cand + jb.cand_at,
                      raw ? 0u : jb.cap, raw || a.sums == nullptr ? nullptr : a.sums + r, rq,
                      a.gain_part + r * max_gain_candidates, raw ? false : a.threshold_mode, nullptr, a.slots, grid);
  if (!job_last || a.gain_count == 0 || !last_block_of(a.jobs_done, a.fused_jobs)) return;
  for (int c = static_cast<int>(threadIdx.x); c < a.gain_count; c += select_threads) {
    double s = 0;
    for (std::uint32_t i = 0; i < a.count; ++i)
      s = __dadd_rn(s, a.gain_part[std::size_t{a.jobs[i].row} * max_gain_candidates + static_cast<std::size_t>(c)]);
    a.gain_out[c] = s;
  }
}

//! Pass 2 for every layer with k > 0 (collect_body).
static __global__ void __launch_bounds__(select_threads)
    select_jobs_collect(const float* __restrict__ e, select_jobs_args a) {
  pass_grid grid;
  const select_job& jb = owning_share<select_pass_scan>(a.jobs, a.count, grid);
  grid.sums_done = a.sums_done + jb.row;
  collect_body(e + jb.offset, jb.numel, a.states + jb.row, a.cand + jb.cand_at, jb.cap, grid);
}

//! Passes 3 and 4 for every layer with k > 0 (refine_body on the layer's histogram).
static __global__ void __launch_bounds__(select_threads)
    select_jobs_refine(const float* __restrict__ e, select_jobs_args a, int shift) {
  pass_grid grid;
  const select_job& jb = owning_share<select_pass_scan>(a.jobs, a.count, grid);
  grid.sums_done = a.sums_done + jb.row;
  refine_body(e + jb.offset, jb.numel, a.states + jb.row, a.cand + jb.cand_at, jb.cap,
              a.hist + std::size_t{jb.row} * max_bins, shift, grid);
}

//! Pass 5 for every layer with k > 0 (tie_body).
static __global__ void __launch_bounds__(select_threads)
    select_jobs_tie(const float* __restrict__ e, select_jobs_args a) {
  pass_grid grid;
  const select_job& jb = owning_share<select_pass_tie>(a.jobs, a.count, grid);
  grid.sums_done = a.sums_done + jb.row;
  tie_body(e + jb.offset, jb.numel, a.states + jb.row, a.chunk_counts + jb.chunks_at, grid);
}

//! Every layer's segment, in layer order (one thread): raw, or sparse of the count its
//! selection resolved; each sparse layer's first entry in its window's compaction and each
//! window's total.
static __global__ void select_jobs_place(std::byte* __restrict__ packet, select_jobs_args a) {
  if (blockIdx.x != 0 || threadIdx.x != 0) return;
  place_in_layer_order(a.jobs, a.count, packet, a.cursor, a.seg, a.first_out, a.expected, [&](const select_job& jb) {
    const unsigned long long count = a.states[jb.row].count;
    place_layer_segment(packet, a.cursor, a.seg + jb.row, jb.row, jb.numel, count, false);
    return count;
  });
}

//! Every raw layer (raw_body): u written raw into its segment, e = 0, its statistics.
static __global__ void __launch_bounds__(select_threads)
    select_jobs_raw(const float* __restrict__ g, float* __restrict__ e, std::byte* __restrict__ packet,
                    select_jobs_args a, bool u_in_e) {
  pass_grid grid;
  const select_job& jb = owning_share<select_pass_raw>(a.jobs, a.count, grid);
  grid.sums_done = a.sums_done + jb.row;
  const std::size_t r = jb.row;
  raw_body(g + jb.offset, e + jb.offset, packet, a.seg + r, jb.numel, a.sums + r, a.states + r, u_in_e, a.slots, grid);
}

//! The compaction's predicate over a window of the buffer: element base + i is kept by its
//! layer's selection (selected_by_threshold; never in a raw layer or one with k = 0).
struct selected_in_jobs {
  const float* u;          //!< the whole buffer (u, held in e after the fused pass)
  const select_job* jobs;  //!< the step's table
  std::uint32_t count;     //!< jobs
  const select_state* states;
  unsigned long long base;  //!< the window's first element
  __device__ __forceinline__ bool operator()(std::uint32_t i) const {
    const unsigned long long at = base + i;
    const select_job& jb = job_containing(jobs, count, at);
    if (jb.raw || jb.k == 0 || at - jb.offset >= jb.numel) return false;
    return selected_by_threshold{u + jb.offset, states + jb.row}(static_cast<std::uint32_t>(at - jb.offset));
  }
};

//! The compaction's output: the j-th index of the window goes to its layer's segment at
//! j - first_out. An entry that falls outside its layer's count (a selection that did not
//! yield exactly its count) is not written and sets \p mismatch: the gather then fails.
struct jobs_index_writer {
  compacted_places<select_job> places;
  std::byte* packet;
  const segment_slot* seg;
  __device__ __forceinline__ void operator()(std::int64_t j, std::uint32_t i) const {
    places.put(
        j, i, [&](const select_job& jb) { return seg[jb.row].count; },
        [&](const select_job& jb, std::int64_t p, std::uint32_t index) {
          reinterpret_cast<std::uint32_t*>(packet + seg[jb.row].payload_at)[p] = index;
        });
  }
};

//! Pass 6 for every layer with k > 0 (gather_body): checked against its window's total and
//! the writer's report.
static __global__ void __launch_bounds__(select_threads)
    select_jobs_gather(std::byte* __restrict__ packet, float* __restrict__ e, select_jobs_args a) {
  pass_grid grid;
  const select_job& jb = owning_share<select_pass_gather>(a.jobs, a.count, grid);
  grid.sums_done = a.sums_done + jb.row;
  const std::size_t r = jb.row;
  select_state* st = a.states + r;
  const bool exact = a.selected[jb.window] == a.expected[jb.window] && *a.mismatch == 0;
  gather_body(packet, a.seg + r, e + jb.offset, st, a.prev_threshold + r, a.sums + r, a.failure, a.slots, grid,
              exact ? st->count : ~0ull);
}

//! The index lists (select_jobs::queue_lists): the select state of every listed layer
//! zeroed (one block).
static __global__ void __launch_bounds__(select_threads) select_jobs_clear_states(select_jobs_args a) {
  for (std::uint32_t q = threadIdx.x; q < a.count; q += select_threads) a.states[a.jobs[q].row] = select_state{};
}

//! The index lists: each layer's first entry in its window's compaction, in layer order (one thread).
static __global__ void select_jobs_place_lists(select_jobs_args a) {
  if (blockIdx.x != 0 || threadIdx.x != 0) return;
  place_in_layer_order(a.jobs, a.count, nullptr, nullptr, nullptr, a.first_out, a.expected,
                       [&](const select_job& jb) { return static_cast<unsigned long long>(a.states[jb.row].count); });
}

//! The index lists' compaction output: the j-th index of the window goes to its layer's list
//! at j - first_out, as an index within the layer. An entry past its layer's count is not
//! written and sets \p mismatch.
struct jobs_list_writer {
  compacted_places<select_job> places;
  std::uint32_t* const* lists;  //!< per row: the layer's list
  const select_state* states;
  __device__ __forceinline__ void operator()(std::int64_t j, std::uint32_t i) const {
    places.put(
        j, i, [&](const select_job& jb) { return static_cast<unsigned long long>(states[jb.row].count); },
        [&](const select_job& jb, std::int64_t p, std::uint32_t index) { lists[jb.row][p] = index; });
  }
};

//! The index lists, one block per layer: select_state::selected becomes the layer's count
//! when its window's compaction selected exactly what its layers resolved (~0 otherwise),
//! and a list short of finite values is completed with non-finite indices
//! (ar_complete_non_finite).
static __global__ void __launch_bounds__(select_threads)
    select_jobs_complete_lists(const float* __restrict__ u, select_jobs_args a, std::uint32_t* const* lists) {
  const select_job& jb = a.jobs[blockIdx.x];
  select_state* st = a.states + jb.row;
  const bool exact = a.selected[jb.window] == a.expected[jb.window] && *a.mismatch == 0;
  if (threadIdx.x == 0) st->selected = exact ? st->count : ~0ull;
  ar_complete_non_finite(u + jb.offset, jb.numel, st, jb.k, lists[jb.row]);
}

//! The per-layer state a compressor keeps and select_jobs writes (rows are layer indices).
struct select_rows {
  select_state* states;
  std::uint32_t* prev_threshold;
  layer_sums* sums;
  segment_slot* seg;
  packet_cursor* cursor;
  double* gain_out;
  std::uint32_t* failure;
};

//! The job tables and workspace of the per-layer selection of a layout: the fused pass,
//! collect, two refines, the tie search, the placement, the raw layers, one ordered
//! compaction per window of fewer than 2^32 elements (one for any layout below that) and
//! the gather: 9 launches a step plus the compaction's, at any number of layers.
class select_jobs {
 public:
  select_jobs() = default;
  //! The workspace for \p lay on a device of \p lc: a histogram per layer (24 KiB each, and
  //! as much again for the gain curve's sample when some layer has over 2^19 elements),
  //! candidate buffers of min(numel, max(65536, \p candidate_capacity * numel)) keys per
  //! layer, the tie search's counts. Allocates on \p s.
  select_jobs(const layout& lay, launch_config lc, double candidate_capacity, stream_ref s) : launch_(lc) {
    const std::size_t L = std::max<std::size_t>(lay.size(), 1);
    unsigned long long cand = 0, chunks = 0, scan_blocks = 0;
    bool sampled_gain = false;
    constexpr std::size_t chunk = static_cast<std::size_t>(select_threads) * tie_items;
    for (std::size_t i = 0; i < lay.size(); ++i) {
      const auto& l = lay[i];
      if (l.numel == 0) continue;
      sampled_gain = sampled_gain || gain_sample_stride(l.numel) > 1;
      select_job j;
      j.offset = l.offset;
      j.numel = l.numel;
      j.row = static_cast<std::uint32_t>(i);
      j.cap = static_cast<std::uint32_t>(std::min<std::size_t>(
          l.numel,
          std::max<std::size_t>(65536, static_cast<std::size_t>(candidate_capacity * static_cast<double>(l.numel)))));
      j.cand_at = cand;
      j.chunks_at = chunks;
      cand += j.cap;
      chunks += (l.numel + chunk - 1) / chunk;
      scan_blocks += static_cast<unsigned long long>(lc.grid_stride(l.numel, select_threads));
      j.window = add_to_windows(windows_, l.offset, l.numel);
      jobs_.push_back(j);
    }
    const std::size_t W = std::max<std::size_t>(windows_.size(), 1);
    table_ = device_buffer<select_job>(std::max<std::size_t>(jobs_.size(), 1), s);
    staging_ = pinned_buffer<select_job>(std::max<std::size_t>(jobs_.size(), 1));
    hist_ = device_buffer<std::uint32_t>(L * max_bins, s);
    hist_sq_ = device_buffer<unsigned long long>(L * max_bins, s);
    // A sample's bins for every row only when some layer's curve is sampled.
    const std::size_t sample_rows = sampled_gain ? L : 1;
    sample_hist_ = device_buffer<std::uint32_t>(sample_rows * max_bins, s);
    sample_sq_ = device_buffer<unsigned long long>(sample_rows * max_bins, s);
    cand_ = device_buffer<std::uint32_t>(std::max<unsigned long long>(cand, 1), s);
    chunk_counts_ = device_buffer<std::uint32_t>(std::max<unsigned long long>(chunks, 1), s);
    sums_done_ = device_buffer<std::uint32_t>(L, s);
    counters_ = device_buffer<std::uint32_t>(2, s);  // jobs_done, mismatch
    gain_k_ = device_buffer<unsigned long long>(L * max_gain_candidates, s);
    gain_part_ = device_buffer<double>(L * max_gain_candidates, s);
    first_out_ = device_buffer<unsigned long long>(L, s);
    expected_ = device_buffer<unsigned long long>(W, s);
    selected_ = device_buffer<unsigned long long>(W, s);
    // The raw and gather passes have at most a scan pass's blocks, the fused pass fewer.
    slots_ = block_slots_buffer(std::max<unsigned long long>(scan_blocks, 1), s);
    k_host_ = pinned_buffer<unsigned long long>(L * max_gain_candidates);
    // The index lists' windows span only the layers listed, so may be longer than any of
    // the layout's own: sized for the longest a window can be.
    const std::vector<compaction_window> longest{{0, std::min<unsigned long long>(lay.numel(), 0xffffffffull)}};
    temp_ =
        device_buffer<std::byte>(std::max(compaction_temp_bytes<selected_in_jobs, jobs_index_writer>(windows_, s.get()),
                                          compaction_temp_bytes<selected_in_jobs, jobs_list_writer>(longest, s.get())),
                                 s);
    list_table_ = device_buffer<select_job>(std::max<std::size_t>(jobs_.size(), 1), s);
    list_staging_ = pinned_buffer<select_job>(std::max<std::size_t>(jobs_.size(), 1));
    lists_ = device_buffer<std::uint32_t*>(L, s);
    lists_host_ = pinned_buffer<std::uint32_t*>(L);
    no_threshold_ = device_buffer<std::uint32_t>(L, s);
    clear_async(s.get(), no_threshold_);
  }

  //! Layers with elements.
  [[nodiscard]] std::size_t count() const noexcept { return jobs_.size(); }

  //! One layer's index list (queue_lists): the k largest |u| of layer \p row, ascending.
  struct list_request {
    std::uint32_t row = 0;          //!< the layer
    std::uint32_t k = 0;            //!< indices to list: 1 to the layer's elements
    std::uint32_t* list = nullptr;  //!< device memory for k indices
  };

  //! Queues on \p s AR-Topk's index lists of \p requests (ascending rows, each once) over
  //! \p u (the whole buffer, read only): each layer's radix select as compress's, with no
  //! previous threshold, into its row of \p states, then one ordered compaction per window
  //! into the lists; a layer with fewer finite values than k has its list completed with
  //! the lowest non-finite indices. Afterwards states[row].selected is the count when the
  //! compaction listed exactly what the selection resolved. A fixed number of launches (8
  //! and the compaction's) at any number of layers.
  void queue_lists(cudaStream_t s, const float* u, std::span<const list_request> requests, select_state* states) {
    if (requests.empty()) return;
    std::vector<compaction_window>& windows = list_windows_;
    windows.clear();
    unsigned long long blocks[select_pass_count] = {};
    std::size_t q = 0;
    for (const list_request& rq : requests) {
      const auto found = std::lower_bound(jobs_.begin(), jobs_.end(), rq.row,
                                          [](const select_job& j, std::uint32_t row) { return j.row < row; });
      require(found != jobs_.end() && found->row == rq.row && rq.k > 0 && rq.k <= found->numel &&
                  (q == 0 || list_staging_.data()[q - 1].row < rq.row),
              "select_jobs::queue_lists: the requests must list non-empty layers once each, in order, with k in "
              "[1, elements]");
      select_job& j = list_staging_.data()[q++];
      j = *found;
      j.k = rq.k;
      j.raw = 0;
      j.window = add_to_windows(windows, j.offset, j.numel);
      for (int pass = 0; pass < select_pass_count; ++pass) j.first[pass] = blocks[pass];
      const int scan = launch_.grid_stride(j.numel, select_threads);
      blocks[select_pass_fused] += static_cast<unsigned long long>(launch_.grid_stride(j.numel, square_tile));
      blocks[select_pass_scan] += static_cast<unsigned long long>(scan);
      blocks[select_pass_tie] += static_cast<unsigned long long>(launch_.tie_search(scan));
      lists_host_.data()[rq.row] = rq.list;
    }
    const auto count = static_cast<std::uint32_t>(q);
    GRAVAC_TRY_CUDA(
        cudaMemcpyAsync(list_table_.data(), list_staging_.data(), q * sizeof(select_job), cudaMemcpyHostToDevice, s));
    GRAVAC_TRY_CUDA(cudaMemcpyAsync(lists_.data(), lists_host_.data(), lists_host_.size() * sizeof(std::uint32_t*),
                                    cudaMemcpyHostToDevice, s));
    clear_async(s, counters_);
    select_jobs_args a = workspace_args(list_table_.data(), count, states);
    a.fused_jobs = count;
    a.prev_threshold = no_threshold_.data();  // no previous threshold; no statistics, no gain curve
    const auto grid = [&](int pass) { return static_cast<unsigned>(blocks[pass]); };
    launch(&select_jobs_clear_states, one_block, select_threads, s, a);
    launch(&select_jobs_fused, grid(select_pass_fused), select_threads, s, static_cast<const float*>(nullptr),
           const_cast<float*>(u), a);  // g null: u is only read
    launch(&select_jobs_collect, grid(select_pass_scan), select_threads, s, u, a);
    for (int shift : {refine_digit_bits, 0})
      launch(&select_jobs_refine, grid(select_pass_scan), select_threads, s, u, a, shift);
    launch(&select_jobs_tie, grid(select_pass_tie), select_threads, s, u, a);
    launch(&select_jobs_place_lists, one_block, one_thread, s, a);
    compact_windows(
        windows, temp_, selected_.data(), s,
        [&](const compaction_window& w) {
          return selected_in_jobs{u, list_table_.data(), count, states, w.start};
        },
        [&](const compaction_window& w) {
          return jobs_list_writer{
              {list_table_.data(), count, first_out_.data(), w.start, a.mismatch}, lists_.data(), states};
        });
    launch(&select_jobs_complete_lists, count, select_threads, s, u, a,
           static_cast<std::uint32_t* const*>(lists_.data()));
  }

  //! Queues the zeroing of the histograms and counters (a pass leaves them zero; a step
  //! that failed calls this in its repair, in case a kernel was cut short).
  void reset(cudaStream_t s) { clear_async(s, hist_, hist_sq_, sample_hist_, sample_sq_, sums_done_, counters_); }

  //! What queue() marks done as it goes, for a repair after a failure part way.
  struct progress {
    bool fused = false;  //!< the fused pass is queued: every layer it covers holds u in e
    bool raw = false;    //!< the raw pass is queued
  };

  //! Queues one step's selection of every layer on \p s: raw layers per \p p's kept
  //! fractions (dense_fraction and above), k = kept_count otherwise; \p threshold_mode with
  //! the low thresholds already in rows.prev_threshold. \p rows must be cleared. Records in
  //! \p done what is queued. Returns without queuing anything for a layout with no elements.
  void queue(cudaStream_t s, const float* g, float* e, std::byte* packet, const step_params& p, bool threshold_mode,
             const select_rows& rows, progress& done) {
    if (jobs_.empty()) return;
    const int gain_count = static_cast<int>(p.gain_candidates.size());
    unsigned long long blocks[select_pass_count] = {};
    std::uint32_t fused_jobs = 0;
    for (std::size_t q = 0; q < jobs_.size(); ++q) {
      select_job& j = staging_.data()[q];
      j = jobs_[q];
      const double f = p.kept_fraction[j.row];
      j.raw = f >= dense_fraction ? 1u : 0u;
      j.k = j.raw ? 0u : static_cast<std::uint32_t>(kept_count(j.numel, f));
      // A compressed layer's curve samples as the host's fused pass does; a raw one's is exact.
      j.gain_stride = j.raw || gain_count == 0 ? 1u : gain_sample_stride(j.numel);
      j.gain_phase = static_cast<std::uint32_t>(p.step % j.gain_stride);
      for (int pass = 0; pass < select_pass_count; ++pass) j.first[pass] = blocks[pass];
      const bool selects = !j.raw && j.k > 0;
      if (!j.raw || gain_count > 0) {
        blocks[select_pass_fused] += static_cast<unsigned long long>(launch_.grid_stride(j.numel, square_tile));
        ++fused_jobs;
      }
      if (selects) {
        const int scan = launch_.grid_stride(j.numel, select_threads);
        blocks[select_pass_scan] += static_cast<unsigned long long>(scan);
        blocks[select_pass_tie] += static_cast<unsigned long long>(launch_.tie_search(scan));
        blocks[select_pass_gather] += static_cast<unsigned long long>(launch_.grid_stride(j.k, square_tile));
      }
      if (j.raw) blocks[select_pass_raw] += static_cast<unsigned long long>(launch_.grid_stride(j.numel, square_tile));
    }
    GRAVAC_TRY_CUDA(
        cudaMemcpyAsync(table_.data(), staging_.data(), jobs_.size() * sizeof(select_job), cudaMemcpyHostToDevice, s));
    if (gain_count > 0) {
      if (!std::equal(p.gain_candidates.begin(), p.gain_candidates.end(), k_of_.begin(), k_of_.end())) {
        for (const select_job& j : jobs_)
          for (int c = 0; c < gain_count; ++c)
            k_host_[std::size_t{j.row} * max_gain_candidates + static_cast<std::size_t>(c)] =
                kept_count(j.numel, p.gain_candidates[static_cast<std::size_t>(c)]);
        GRAVAC_TRY_CUDA(cudaMemcpyAsync(gain_k_.data(), k_host_.data(), k_host_.size() * sizeof(unsigned long long),
                                        cudaMemcpyHostToDevice, s));
        k_of_.assign(p.gain_candidates.begin(), p.gain_candidates.end());
      }
      clear_async(s, gain_part_);
    }
    clear_async(s, counters_);
    select_jobs_args a = workspace_args(table_.data(), static_cast<std::uint32_t>(jobs_.size()), rows.states);
    a.fused_jobs = fused_jobs;
    a.threshold_mode = threshold_mode;
    a.prev_threshold = rows.prev_threshold;
    a.sums = rows.sums;
    a.seg = rows.seg;
    a.cursor = rows.cursor;
    a.gain_count = gain_count;
    a.gain_out = rows.gain_out;
    a.failure = rows.failure;
    const auto grid = [&](int pass) { return static_cast<unsigned>(blocks[pass]); };
    if (blocks[select_pass_fused] > 0) {
      launch(&select_jobs_fused, grid(select_pass_fused), select_threads, s, g, e, a);
      done.fused = true;
    }
    if (blocks[select_pass_scan] > 0) {
      launch(&select_jobs_collect, grid(select_pass_scan), select_threads, s, e, a);
      for (int shift : {refine_digit_bits, 0})
        launch(&select_jobs_refine, grid(select_pass_scan), select_threads, s, e, a, shift);
      launch(&select_jobs_tie, grid(select_pass_tie), select_threads, s, e, a);
    }
    launch(&select_jobs_place, one_block, one_thread, s, packet, a);
    if (blocks[select_pass_raw] > 0) {
      launch(&select_jobs_raw, grid(select_pass_raw), select_threads, s, g, e, packet, a, gain_count > 0);
      done.raw = true;
    }
    if (blocks[select_pass_scan] == 0) return;
    compact_windows(
        windows_, temp_, selected_.data(), s,
        [&](const compaction_window& w) {
          return selected_in_jobs{e, table_.data(), a.count, rows.states, w.start};
        },
        [&](const compaction_window& w) {
          return jobs_index_writer{{table_.data(), a.count, first_out_.data(), w.start, a.mismatch}, packet, rows.seg};
        });
    launch(&select_jobs_gather, grid(select_pass_gather), select_threads, s, packet, e, a);
  }

 private:
  // The arguments of a pass over \p count jobs of \p jobs with states \p states and this
  // workspace; the rest (statistics, packet, gain curve, thresholds) null or zero.
  select_jobs_args workspace_args(const select_job* jobs, std::uint32_t count, select_state* states) {
    return {jobs,
            count,
            0,
            false,
            states,
            nullptr,
            nullptr,
            nullptr,
            nullptr,
            hist_.data(),
            hist_sq_.data(),
            cand_.data(),
            chunk_counts_.data(),
            sums_done_.data(),
            slots_.view(),
            gain_k_.data(),
            0,
            gain_part_.data(),
            nullptr,
            sample_hist_.data(),
            sample_sq_.data(),
            counters_.data(),
            first_out_.data(),
            expected_.data(),
            selected_.data(),
            counters_.data() + 1,
            nullptr};
  }

  launch_config launch_;
  std::vector<select_job> jobs_;  // the layers, as constructed (k, raw and blocks are per step)
  std::vector<compaction_window> windows_;
  std::vector<double> k_of_;  // the candidates gain_k_ holds the k of
  device_buffer<select_job> table_;
  pinned_buffer<select_job> staging_;  // the step's table (rewritten once the last step's stream finished)
  device_buffer<std::uint32_t> hist_;
  device_buffer<unsigned long long> hist_sq_;
  device_buffer<std::uint32_t> sample_hist_;  // the gain curve's samples (a row per layer when any is sampled)
  device_buffer<unsigned long long> sample_sq_;
  device_buffer<std::uint32_t> cand_;
  device_buffer<std::uint32_t> chunk_counts_;
  device_buffer<std::uint32_t> sums_done_;
  device_buffer<std::uint32_t> counters_;
  device_buffer<unsigned long long> gain_k_;
  device_buffer<double> gain_part_;
  device_buffer<unsigned long long> first_out_;
  device_buffer<unsigned long long> expected_;
  device_buffer<unsigned long long> selected_;
  device_buffer<std::byte> temp_;
  block_slots_buffer slots_;
  pinned_buffer<unsigned long long> k_host_;
  device_buffer<select_job> list_table_;         // the index lists' table
  pinned_buffer<select_job> list_staging_;       // its upload (rewritten once the last lists' stream finished)
  device_buffer<std::uint32_t*> lists_;          // per row: where its index list goes
  pinned_buffer<std::uint32_t*> lists_host_;     // their upload
  device_buffer<std::uint32_t> no_threshold_;    // per row: 0, no previous threshold (the index lists)
  std::vector<compaction_window> list_windows_;  // the index lists' windows (rebuilt per call, kept for its room)
};

}  // namespace gravac::detail
