#pragma once
//! \file
//! \brief The output of the device radix select: the ordered compaction's predicate, the
//! completion of AR-Topk's short lists, the gather into the packet with the residual
//! update, raw layers, and the undo of a failed step.

#include "gravac/cuda/detail/nvcc_flags.hpp"
// (first, and apart from the includes below: a missing compiler option is one readable error)

#include <cstdint>

#include "gravac/cuda/detail/cub_primitives.hpp"
#include "gravac/cuda/detail/ordered_sums.hpp"
#include "gravac/cuda/detail/select_common.hpp"
#include "gravac/cuda/detail/square_sums.hpp"

namespace gravac::detail {

//! The predicate of the ordered compaction: index i is selected.
struct selected_by_threshold {
  const float* u;          //!< u (held in e after the fused pass)
  const select_state* st;  //!< the resolved threshold
  __device__ __forceinline__ bool operator()(std::uint32_t i) const {
    const std::uint32_t key = device_magnitude_key(u[i]);
    const std::uint32_t t = st->threshold;
    return st->done == 1 && key < non_finite_key &&
           (key > t || (key == t && (st->take_all_ties || i <= st->tie_index)));
  }
};

//! One block: when the selection of \p st found fewer finite values than \p k (it kept every
//! finite one), rewrites \p out as the k lowest indices of the set {every finite value} and
//! {the first k - finite non-finite values in index order}, ascending, so that AR-Topk's
//! list has exactly k entries (the step is then abandoned by the trainer as non-finite; the
//! residual keeps the rest of u). Does nothing otherwise.
__device__ inline void ar_complete_non_finite(const float* __restrict__ u, std::size_t n,
                                              const select_state* __restrict__ st, std::uint32_t k,
                                              std::uint32_t* __restrict__ out) {
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

//! Pass 6: values of the selected indices into the packet, e = 0 there (the residual
//! update), the kept energy, and the threshold remembered for the next step, over the
//! blocks of \p grid. \p selected is what the compaction selected for the layer. When it
//! is not exactly the count (a defect), nothing is zeroed and \p failure is set:
//! compress() then restores every layer and throws.
__device__ inline void gather_body(std::byte* __restrict__ packet, const segment_slot* __restrict__ slot,
                                   float* __restrict__ e, select_state* __restrict__ st,
                                   std::uint32_t* __restrict__ prev_threshold, layer_sums* __restrict__ sums,
                                   std::uint32_t* __restrict__ failure, block_slots slots, const pass_grid& grid,
                                   unsigned long long selected) {
  const std::size_t k = st->count;
  const bool ok = slot->placed && slot->count == k && selected == k;
  const auto* idx = reinterpret_cast<const std::uint32_t*>(packet + slot->payload_at);
  auto* values = reinterpret_cast<float*>(packet + slot->payload_at + pad8(k * sizeof(std::uint32_t)));
  // The kept energy: the values sent, in packet order, in the host's tree (square_sums.hpp).
  double* const out[1] = {&sums->kept_sq};
  square_sums_pass<1>(
      ok ? k : 0, grid, slots, out,
      [&](std::size_t j, bool in, float(&v)[1]) {
        if (!in) return;
        const std::uint32_t i = idx[j];
        v[0] = e[i];
        values[j] = v[0];
        e[i] = 0.0f;
      },
      [&](std::size_t j, float(&v)[1]) { v[0] = values[j]; });
  if (threadIdx.x == 0) {
    if (grid.block == 0) {
      if (!ok)
        atomicExch(failure, 1u);
      else
        st->gathered = 1;
      // 0 means "none"; a layer that sent nothing keeps its previous threshold.
      if (st->done == 1) *prev_threshold = st->threshold == 0 ? 1u : st->threshold;
    }
  }
}

//! Pass 6 over one layer (the whole grid): gather_body, checked against the count the
//! compaction wrote into the layer's state.
static __global__ void __launch_bounds__(select_threads)
    gather_pass(std::byte* __restrict__ packet, const segment_slot* __restrict__ slot, float* __restrict__ e,
                select_state* __restrict__ st, std::uint32_t* __restrict__ prev_threshold,
                layer_sums* __restrict__ sums, std::uint32_t* __restrict__ failure, block_slots slots) {
  gather_body(packet, slot, e, st, prev_threshold, sums, failure, slots, whole_grid(slots.blocks_done), st->selected);
}

//! u = g + e written raw into the layer's placed segment, e = 0, statistics (a layer sent
//! dense), over the blocks of \p grid.
__device__ inline void raw_body(const float* __restrict__ g, float* __restrict__ e, std::byte* __restrict__ packet,
                                const segment_slot* __restrict__ slot, std::size_t n, layer_sums* __restrict__ sums,
                                select_state* __restrict__ st, bool u_in_e, block_slots slots, const pass_grid& grid) {
  float* raw = reinterpret_cast<float*>(packet + slot->payload_at);
  bool bad = false;
  double* const out[3] = {&sums->grad_sq, &sums->input_sq, &sums->kept_sq};
  square_sums_pass<3>(
      n, grid, slots, out,
      [&](std::size_t i, bool in, float(&v)[3]) {
        if (!in) return;
        const float gi = g[i];
        const float u = u_in_e ? e[i] : gi + e[i];  // u_in_e: the fused pass already wrote u
        raw[i] = u;
        e[i] = 0.0f;
        v[0] = gi;
        v[1] = u;
        v[2] = u;
        bad |= !isfinite(u);
      },
      [&](std::size_t i, float(&v)[3]) {
        v[0] = g[i];
        v[1] = v[2] = raw[i];
      });
  if (__syncthreads_or(bad) && threadIdx.x == 0) atomicOr(&st->non_finite, 1u);  // any number of blocks
  if (grid.block == 0 && threadIdx.x == 0) {
    st->count = static_cast<std::uint32_t>(n);
    st->gathered = 1;
  }
}

//! A raw layer over the whole grid: raw_body.
static __global__ void __launch_bounds__(select_threads)
    raw_pass(const float* __restrict__ g, float* __restrict__ e, std::byte* __restrict__ packet,
             const segment_slot* __restrict__ slot, std::size_t n, layer_sums* __restrict__ sums,
             select_state* __restrict__ st, bool u_in_e, block_slots slots) {
  raw_body(g, e, packet, slot, n, sums, st, u_in_e, slots, whole_grid(slots.blocks_done));
}

//! Undoes the residual update of every layer that was gathered: e = the value sent, at
//! each sent index (e there is 0, so this restores u exactly). Raw layers restore every
//! element. Slot y of the grid takes layers y, y + gridDim.y, ... Used only when compress()
//! fails after some layers were updated, so that e = u = g + e_old: nothing sent, nothing lost.
static __global__ void __launch_bounds__(select_threads)
    restore_pass(const std::byte* __restrict__ packet, const segment_slot* __restrict__ slots,
                 const select_state* __restrict__ states, const std::uint64_t* __restrict__ offsets,
                 std::uint32_t layers, float* __restrict__ e) {
  for (std::uint32_t l = blockIdx.y; l < layers; l += gridDim.y) {
    if (!states[l].gathered || !slots[l].placed) continue;
    const std::size_t k = slots[l].count;
    float* el = e + offsets[l];
    const std::byte* payload = packet + slots[l].payload_at;
    const std::size_t stride = static_cast<std::size_t>(gridDim.x) * select_threads;
    const std::size_t first = blockIdx.x * static_cast<std::size_t>(select_threads) + threadIdx.x;
    if (slots[l].raw) {
      const auto* v = reinterpret_cast<const float*>(payload);
      for (std::size_t j = first; j < k; j += stride) el[j] = v[j];
    } else {
      const auto* idx = reinterpret_cast<const std::uint32_t*>(payload);
      const auto* v = reinterpret_cast<const float*>(payload + pad8(k * sizeof(std::uint32_t)));
      for (std::size_t j = first; j < k; j += stride) el[idx[j]] = v[j];
    }
  }
}

//! e = g + e (u, as the fused pass computes it) over \p n elements: the repair of a layer
//! whose step failed before its first pass wrote u into e.
static __global__ void __launch_bounds__(select_threads)
    fold_gradient(const float* __restrict__ g, float* __restrict__ e, std::size_t n) {
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * select_threads;
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(select_threads) + threadIdx.x; i < n; i += stride)
    e[i] = __fadd_rn(g[i], e[i]);
}

}  // namespace gravac::detail
