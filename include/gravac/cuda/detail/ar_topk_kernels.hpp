#pragma once
//! \file ar_topk_kernels.hpp
//! \brief The kernels of allreduce_compatible (AR-Topk) on the device, one layer per launch:
//! the validation of a received index list, the gather of u at the indices (e = 0 there,
//! the kept energy), the scatter of the averaged sums, the undo of a gather, and the
//! completion of a selection that found fewer than k finite values. Each does on the device
//! what detail::ar_topk_host_passes does on the host, element for element.

#include "gravac/cuda/detail/nvcc_flags.hpp"
// (first, and apart from the includes below: a missing compiler option is one readable error)

#include <cstddef>
#include <cstdint>

#include "gravac/cuda/detail/cub_primitives.hpp"
#include "gravac/cuda/detail/launch_config.hpp"
#include "gravac/cuda/detail/ordered_sums.hpp"
#include "gravac/cuda/detail/select_common.hpp"

namespace gravac::detail {

//! Marks layer \p layer in \p first_bad (atomicMin: the lowest bad layer wins, the one the
//! host's in-order check names) when any of its \p count indices is >= \p numel or not
//! strictly above its predecessor.
static __global__ void __launch_bounds__(packet_threads)
    ar_validate_indices(const std::uint32_t* __restrict__ idx, std::size_t count, std::size_t numel,
                        std::uint32_t layer, std::uint32_t* __restrict__ first_bad) {
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * packet_threads;
  bool bad = false;
  for (std::size_t s = blockIdx.x * static_cast<std::size_t>(packet_threads) + threadIdx.x; s < count; s += stride)
    bad |= idx[s] >= numel || (s > 0 && idx[s] <= idx[s - 1]);
  if (__syncthreads_or(bad) && threadIdx.x == 0) atomicMin(first_bad, layer);
}

//! values[j] = e[idx[j]] (or e[j] when \p idx is null: a layer sent dense), e = 0 there, and
//! the sent energy into sums->kept_sq. The caller validated the indices.
static __global__ void __launch_bounds__(select_threads)
    ar_gather(const std::uint32_t* __restrict__ idx, std::size_t count, float* __restrict__ e,
              float* __restrict__ values, layer_sums* __restrict__ sums, block_slots slots) {
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * select_threads;
  double ksq = 0;
  for (std::size_t j = blockIdx.x * static_cast<std::size_t>(select_threads) + threadIdx.x; j < count; j += stride) {
    const std::size_t at = idx ? idx[j] : j;
    const float v = e[at];
    values[j] = v;
    e[at] = 0.0f;
    ksq += static_cast<double>(v) * v;
  }
  using reduce_t = block_reduce<double, select_threads>;
  __shared__ typename reduce_t::TempStorage red;
  const double s = reduce_t(red).Sum(ksq);
  const double mine[1] = {s};
  double* const out[1] = {&sums->kept_sq};
  add_in_block_order<select_threads, 1>(mine, slots, out);
}

//! g[idx[j]] = sum[j] * inv (g[j] when \p idx is null), the host's float product; the rest
//! of g was zeroed before.
static __global__ void __launch_bounds__(select_threads)
    ar_scatter_average(const std::uint32_t* __restrict__ idx, std::size_t count, const float* __restrict__ sum,
                       float inv, float* __restrict__ g) {
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * select_threads;
  for (std::size_t j = blockIdx.x * static_cast<std::size_t>(select_threads) + threadIdx.x; j < count; j += stride)
    g[idx ? idx[j] : j] = __fmul_rn(sum[j], inv);
}

//! e[idx[j]] = own[j] (e[j] when \p idx is null): what ar_gather took out, put back.
static __global__ void __launch_bounds__(select_threads)
    ar_undo(const std::uint32_t* __restrict__ idx, std::size_t count, const float* __restrict__ own,
            float* __restrict__ e) {
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * select_threads;
  for (std::size_t j = blockIdx.x * static_cast<std::size_t>(select_threads) + threadIdx.x; j < count; j += stride)
    e[idx ? idx[j] : j] = own[j];
}

//! One block: when the selection of \p st found fewer finite values than \p k (it kept every
//! finite one), rewrites \p out as the k lowest indices of the set {every finite value} and
//! {the first k - finite non-finite values in index order}, ascending, so that AR-Topk's
//! list has exactly k entries (the step is then abandoned by the trainer as non-finite; the
//! residual keeps the rest of u). Does nothing otherwise.
static __global__ void __launch_bounds__(select_threads)
    ar_complete_non_finite(const float* __restrict__ u, std::size_t n, const select_state* __restrict__ st,
                           std::uint32_t k, std::uint32_t* __restrict__ out) {
  if (!st->too_few_finite) return;
  const std::uint32_t need = k - st->count;  // non-finite values to add
  using scan_t = block_scan<std::uint32_t, select_threads>;
  __shared__ typename scan_t::TempStorage tmp;
  std::uint32_t written = 0, non_finite_seen = 0;
  for (std::size_t base = 0; base < n && written < k; base += select_threads) {
    const std::size_t i = base + threadIdx.x;
    const bool in = i < n;
    const bool nf = in && device_magnitude_key(u[i]) >= non_finite_key;
    std::uint32_t nf_before = 0, nf_total = 0;
    scan_t(tmp).ExclusiveSum(nf ? 1u : 0u, nf_before, nf_total);
    __syncthreads();
    const bool take = in && (!nf || non_finite_seen + nf_before < need);
    std::uint32_t pos = 0, taken = 0;
    scan_t(tmp).ExclusiveSum(take ? 1u : 0u, pos, taken);
    __syncthreads();
    if (take && written + pos < k) out[written + pos] = static_cast<std::uint32_t>(i);
    written += taken;
    non_finite_seen += nf_total;
  }
}

}  // namespace gravac::detail
