#pragma once
//! \file ar_topk_kernels.hpp
//! \brief The kernels of allreduce_compatible (AR-Topk) on the device: the validation of a
//! received index list, the gather of u at the indices (e = 0 there, the kept energy), the
//! scatter of the averaged sums and the undo of a gather, each one launch over every layer
//! that sends; and the completion of a layer's selection that found fewer than k finite
//! values. Each does on the device
//! what detail::ar_topk_host_passes does on the host, element for element.

#include "gravac/cuda/detail/nvcc_flags.hpp"
// (first, and apart from the includes below: a missing compiler option is one readable error)

#include <cstddef>
#include <cstdint>

#include "gravac/cuda/detail/cub_primitives.hpp"
#include "gravac/cuda/detail/job_search.hpp"
#include "gravac/cuda/detail/launch_config.hpp"
#include "gravac/cuda/detail/ordered_sums.hpp"
#include "gravac/cuda/detail/select_common.hpp"
#include "gravac/cuda/detail/square_sums.hpp"

namespace gravac::detail {

//! One part of a step's Allreduce buffer: a layer that sends something (its index list, or
//! every element when sent dense), in layer order. Every pass below is one launch over the
//! parts, each part's share of the grid striding over it as a launch on it alone would.
struct ar_part {
  unsigned long long first[1] = {};    //!< its first block in the pass's grid
  const std::uint32_t* idx = nullptr;  //!< its indices (device memory; null: dense, every element)
  unsigned long long offset = 0;       //!< the layer's first element in e and g
  unsigned long long v_at = 0;         //!< its first value in the value buffers
  unsigned long long count = 0;        //!< values it sends
  unsigned long long numel = 0;        //!< the layer's elements
  std::uint32_t layer = 0;             //!< the layer's index
  std::uint32_t pad_ = 0;
};

//! The part table of one pass.
struct ar_parts {
  const ar_part* parts;      //!< in layer order
  std::uint32_t count;       //!< parts (at least one)
  std::uint32_t* sums_done;  //!< per layer, zero before and after (ar_gather_parts)
  block_slots slots;         //!< a slot per block (ar_gather_parts)
};

//! Marks a part's layer in \p first_bad (atomicMin: the lowest bad layer wins, the one the
//! host's in-order check names) when any of its indices is >= numel or not strictly above
//! its predecessor.
static __global__ void __launch_bounds__(packet_threads)
    ar_validate_parts(ar_parts a, std::uint32_t* __restrict__ first_bad) {
  pass_grid grid;
  const ar_part& pt = owning_share<0>(a.parts, a.count, grid);
  const std::uint32_t* idx = pt.idx;
  const std::size_t stride = static_cast<std::size_t>(grid.blocks) * packet_threads;
  bool bad = false;
  for (std::size_t s = grid.block * static_cast<std::size_t>(packet_threads) + threadIdx.x; s < pt.count; s += stride)
    bad |= idx[s] >= pt.numel || (s > 0 && idx[s] <= idx[s - 1]);
  if (__syncthreads_or(bad) && threadIdx.x == 0) atomicMin(first_bad, pt.layer);
}

//! values[j] = e[idx[j]] (or e[j] for a dense part), e = 0 there, and each layer's sent
//! energy into sums[layer].kept_sq (the host's order, square_sums.hpp). The caller validated the indices.
static __global__ void __launch_bounds__(select_threads)
    ar_gather_parts(ar_parts a, float* __restrict__ e, float* __restrict__ values, layer_sums* __restrict__ sums) {
  pass_grid grid;
  const ar_part& pt = owning_share<0>(a.parts, a.count, grid);
  grid.sums_done = a.sums_done + pt.layer;
  float* el = e + pt.offset;
  float* vl = values + pt.v_at;
  // The kept energy: the values sent, in the order sent, in the host's tree (square_sums.hpp).
  double* const out[1] = {&sums[pt.layer].kept_sq};
  square_sums_pass<1>(
      pt.count, grid, a.slots, out,
      [&](std::size_t j, bool in, float(&v)[1]) {
        if (!in) return;
        const std::size_t at = pt.idx ? pt.idx[j] : j;
        v[0] = el[at];
        vl[j] = v[0];
        el[at] = 0.0f;
      },
      [&](std::size_t j, float(&v)[1]) { v[0] = vl[j]; });
}

//! g[idx[j]] = sum[j] * inv (g[j] for a dense part), the host's float product; the rest of
//! g was zeroed before.
static __global__ void __launch_bounds__(select_threads)
    ar_scatter_parts(ar_parts a, const float* __restrict__ sum, float inv, float* __restrict__ g) {
  pass_grid grid;
  const ar_part& pt = owning_share<0>(a.parts, a.count, grid);
  float* gl = g + pt.offset;
  const float* sl = sum + pt.v_at;
  const std::size_t stride = static_cast<std::size_t>(grid.blocks) * select_threads;
  for (std::size_t j = grid.block * static_cast<std::size_t>(select_threads) + threadIdx.x; j < pt.count; j += stride)
    gl[pt.idx ? pt.idx[j] : j] = __fmul_rn(sl[j], inv);
}

//! e[idx[j]] = own[j] (e[j] for a dense part): what ar_gather_parts took out, put back.
static __global__ void __launch_bounds__(select_threads)
    ar_undo_parts(ar_parts a, const float* __restrict__ own, float* __restrict__ e) {
  pass_grid grid;
  const ar_part& pt = owning_share<0>(a.parts, a.count, grid);
  float* el = e + pt.offset;
  const float* ol = own + pt.v_at;
  const std::size_t stride = static_cast<std::size_t>(grid.blocks) * select_threads;
  for (std::size_t j = grid.block * static_cast<std::size_t>(select_threads) + threadIdx.x; j < pt.count; j += stride)
    el[pt.idx ? pt.idx[j] : j] = ol[j];
}

}  // namespace gravac::detail
