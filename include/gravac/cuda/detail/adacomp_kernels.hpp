#pragma once
//! \file adacomp_kernels.hpp
//! \brief The kernels of adacomp_cuda: AdaComp's six steps (docs/algorithms.md, "Compressors") on the device,
//! the same packets as gravac::adacomp bit for bit.
//!
//! The scale's sum is exact per exponent, so atomics in any order give the host's bits; the
//! kernels: docs/algorithms.md, "The device kernels". Also the device validation of AdaComp
//! packets and their scatter-add decompression.

#include "gravac/cuda/detail/nvcc_flags.hpp"
// (first, and apart from the includes below: a missing compiler option is one readable error)

#include <cstddef>
#include <cstdint>

#include "gravac/cuda/detail/cub_primitives.hpp"
#include "gravac/cuda/detail/launch_config.hpp"
#include "gravac/cuda/detail/packet_kernels.hpp"
#include "gravac/cuda/detail/segment_cursor.hpp"
#include "gravac/cuda/detail/select_kernels.hpp"
#include "gravac/packet/format.hpp"
#include "gravac/packet/raw_segment.hpp"

namespace gravac::detail {

//! Integers of the exponent sum (detail::exponent_sum::at).
inline constexpr int exponent_slots = 256;

//! Step 1 over one layer, whose R = u the fused pass over every layer wrote into r (with
//! the norms, in the host's order): gmax[b] = max over bin b of the magnitude bits of the
//! finite R_i (gmax zeroed before). A non-finite R_i sets st->non_finite. n < 2^32 (checked
//! at construction). Over the blocks of \p grid (one layer's share of adacomp_jobs's grid).
__device__ inline void adacomp_bins_body(const float* __restrict__ r, std::uint32_t n, std::uint32_t bin,
                                         std::uint32_t* __restrict__ gmax, select_state* __restrict__ st,
                                         const pass_grid& grid) {
  // A tile of adacomp_tile consecutive elements touches at most adacomp_tile + 1 bins.
  __shared__ std::uint32_t sh[adacomp_tile + 1];
  for (std::uint32_t b = threadIdx.x; b <= adacomp_tile; b += adacomp_threads) sh[b] = 0;
  __syncthreads();
  constexpr unsigned full = 0xffffffffu;
  const unsigned lane = threadIdx.x & 31u;
  bool bad = false;
  for (std::uint64_t t0 = grid.block * adacomp_tile; t0 < n; t0 += grid.blocks * adacomp_tile) {
    const auto first_bin = static_cast<std::uint32_t>(t0 / bin);
    float rv[adacomp_items];
#pragma unroll
    for (int j = 0; j < adacomp_items; ++j) {
      const std::uint64_t i = t0 + static_cast<std::uint64_t>(j) * adacomp_threads + threadIdx.x;
      rv[j] = i < n ? r[i] : 0.0f;
    }
#pragma unroll
    for (int j = 0; j < adacomp_items; ++j) {
      const std::uint64_t i = t0 + static_cast<std::uint64_t>(j) * adacomp_threads + threadIdx.x;
      const bool in = i < n;
      std::uint32_t key = in ? device_magnitude_key(rv[j]) : 0u;
      bad |= key >= non_finite_key;
      if (key >= non_finite_key) key = 0;  // infinity and NaN do not count in the maximum
      // The tile-relative bin; out-of-range lanes get a bin no lane has.
      const std::uint32_t b = in ? static_cast<std::uint32_t>(i) / bin - first_bin : 0xffffffffu;
      // A warp inside one bin (the common case for L >= 32) makes one shared atomic.
      const std::uint32_t b0 = __shfl_sync(full, b, 0);
      if (__all_sync(full, b == b0)) {
        const std::uint32_t m = __reduce_max_sync(full, key);
        if (lane == 0 && m != 0 && b0 != 0xffffffffu) atomicMax(&sh[b0], m);
      } else if (in && key != 0) {
        atomicMax(&sh[b], key);
      }
    }
    __syncthreads();
    const std::uint64_t end = t0 + adacomp_tile < n ? t0 + adacomp_tile : n;
    const auto last = static_cast<std::uint32_t>((end - 1) / bin) - first_bin;
    for (std::uint32_t b = threadIdx.x; b <= last; b += adacomp_threads) {
      const std::uint32_t v = sh[b];
      if (v != 0) {
        atomicMax(&gmax[first_bin + b], v);
        sh[b] = 0;
      }
    }
    __syncthreads();
  }
  if (__syncthreads_or(bad) && threadIdx.x == 0) atomicOr(&st->non_finite, 1u);  // any number of blocks
}

//! Step 2: scale = float(exponent_sum(gmax[0 .. bins)) / bins), the host's
//! detail::exponent_sum and division bit for bit, into \p scale. \p acc (exponent_slots
//! integers) is zero on entry and left zero for the next step. Over the blocks of \p grid.
__device__ inline void adacomp_scale_body(const std::uint32_t* __restrict__ gmax, std::uint32_t bins,
                                          unsigned long long* __restrict__ acc, select_state* __restrict__ st,
                                          float* __restrict__ scale, const pass_grid& grid) {
  __shared__ unsigned long long sh[exponent_slots];
  for (int i = static_cast<int>(threadIdx.x); i < exponent_slots; i += adacomp_threads) sh[i] = 0;
  __syncthreads();
  // 64-bit index arithmetic: b + stride (and the grid's extent) can pass 2^32 near 2^32 bins.
  const unsigned long long stride = grid.blocks * adacomp_threads;
  for (unsigned long long b = grid.block * static_cast<unsigned long long>(adacomp_threads) + threadIdx.x; b < bins;
       b += stride) {
    const std::uint32_t v = gmax[b];
    if (v == 0) continue;  // adds nothing
    const std::uint32_t e = v >> 23, m = v & 0x7fffffu;
    atomicAdd(&sh[e ? e : 1u], static_cast<unsigned long long>(e ? (m | 0x800000u) : m));
  }
  __syncthreads();
  for (int i = static_cast<int>(threadIdx.x); i < exponent_slots; i += adacomp_threads)
    if (sh[i]) atomicAdd(&acc[i], sh[i]);
  if (!last_block_of(&st->blocks_done, grid.blocks)) return;
  if (threadIdx.x == 0) {
    double s = 0;  // detail::exponent_sum::value(): the same products (exact) and sums, in the same order
    for (int e = 1; e < 255; ++e) s = __dadd_rn(s, __dmul_rn(__ull2double_rn(__ldcg(acc + e)), exact_pow2(e - 150)));
    *scale = __double2float_rn(__ddiv_rn(s, static_cast<double>(bins)));
  }
  __syncthreads();
  for (int i = static_cast<int>(threadIdx.x); i < exponent_slots; i += adacomp_threads) acc[i] = 0;
}

//! Step 3's predicate: element i is sent.
struct adacomp_sent {
  const float* r;             //!< R (after step 1)
  const float* g;             //!< the gradient
  const std::uint32_t* gmax;  //!< the bin maxima (magnitude bits)
  std::uint32_t bin;          //!< L
  __device__ __forceinline__ bool operator()(std::uint32_t i) const {
    const float x = r[i];
    const std::uint32_t key = device_magnitude_key(x);
    if (key == 0 || key >= non_finite_key) return false;  // zero has no sign; never infinity or NaN
    const float h = fabsf(__fadd_rn(x, g[i]));
    return h >= __uint_as_float(gmax[i / bin]);
  }
};

//! What an ordered compaction over windows of a job table reports: each window's count
//! against the total its layers planned, and an index its writer could not place.
struct compaction_check {
  const unsigned long long* selected;  //!< per window: what the compaction selected
  const unsigned long long* expected;  //!< per window: what its layers counted
  std::uint32_t windows;               //!< windows
  const std::uint32_t* mismatch;       //!< set by the writer for an index outside its layer's share
  std::uint32_t* failure;              //!< where a kernel reports an inexact compaction
  //! Every window selected exactly its count, and every index had its place.
  [[nodiscard]] __device__ bool exact() const {
    if (*mismatch) return false;
    for (std::uint32_t w = 0; w < windows; ++w)
      if (selected[w] != expected[w]) return false;
    return true;
  }
};

//! Step 3's count: the elements of a layer that adacomp_sent selects, added into
//! st->count (integers: any order gives the same total). Over the blocks of \p grid.
__device__ inline void adacomp_count_body(const adacomp_sent& sent, std::uint32_t n, select_state* __restrict__ st,
                                          const pass_grid& grid) {
  std::uint32_t mine = 0;
  const unsigned long long stride = grid.blocks * adacomp_threads;
  for (unsigned long long i = grid.block * static_cast<unsigned long long>(adacomp_threads) + threadIdx.x; i < n;
       i += stride)
    mine += sent(static_cast<std::uint32_t>(i)) ? 1u : 0u;
  using reduce_t = block_reduce<std::uint32_t, adacomp_threads>;
  __shared__ typename reduce_t::TempStorage red;
  const std::uint32_t total = reduce_t(red).Sum(mine);
  if (threadIdx.x == 0 && total) atomicAdd(&st->count, total);
}

//! Writes a segment header of \p count sent elements at the cursor, the scale and L, and
//! zeroes the index region's padding, then advances the cursor (the compaction writes the
//! indices, adacomp_signs the whole sign region). One thread.
__device__ inline void place_adacomp_segment_at(std::byte* packet, packet_cursor* cur, segment_slot* slot,
                                                unsigned long long count, float scale, std::uint32_t layer,
                                                unsigned long long numel, std::uint32_t bin) {
  const unsigned long long at = sizeof(packet_header) + cur->used;
  segment_header h{};
  h.layer = layer;
  h.index_width = 4;
  h.encoding = 0;
  h.numel = numel;
  h.count = count;
  h.payload_bytes = 8 + pad8(count * 4) + pad8((count + 7) / 8);
  memcpy(packet + at, &h, sizeof h);
  std::byte* payload = packet + at + sizeof(segment_header);
  memcpy(payload, &scale, 4);
  memcpy(payload + 4, &bin, 4);
  if (count % 2) memset(payload + 8 + count * 4, 0, 4);
  slot->payload_at = at + sizeof(segment_header);
  slot->count = count;
  slot->placed = 1;
  cur->used += sizeof(segment_header) + h.payload_bytes;
  cur->segments += 1;
}

//! Step 4 (and 5), every compressed layer in one launch (slot y of the grid takes layers y,
//! y + gridDim.y, ...; the raw and empty ones are skipped): word w of a segment's sign
//! region holds the signs of its sent elements 32w .. 32w + 31 (bit j % 32: 1 = negative;
//! zero past the count, so the padding is zero), and R_i -= sign(R_i) * scale at each of
//! them (R_i - (-scale) is R_i + scale exactly, as on the host). The kept energy count *
//! scale^2 is computed by the host. It is the step's last pass over the residue: a step
//! that fails before it leaves R = u in every layer, which a failure after a layer's sign
//! pass could not give back bit for bit.
//!
//! When the compaction did not list exactly the elements counted (\p check: a defect),
//! nothing is changed and the failure is reported: compress() restores and throws.
static __global__ void __launch_bounds__(adacomp_threads)
    adacomp_signs(std::byte* __restrict__ packet, const segment_slot* __restrict__ slots, float* __restrict__ r,
                  const std::uint64_t* __restrict__ offsets, const float* __restrict__ scales, std::uint32_t layers,
                  compaction_check check) {
  if (!check.exact()) {
    if (blockIdx.x == 0 && blockIdx.y == 0 && threadIdx.x == 0) *check.failure = 1;
    return;
  }
  for (std::uint32_t l = blockIdx.y; l < layers; l += gridDim.y) {
    const segment_slot& slot = slots[l];
    if (!slot.placed || slot.raw) continue;
    const unsigned long long count = slot.count;
    const unsigned long long words = pad8((count + 7) / 8) / 4;
    const auto* idx = reinterpret_cast<const std::uint32_t*>(packet + slot.payload_at + 8);
    auto* out = reinterpret_cast<std::uint32_t*>(packet + slot.payload_at + 8 + pad8(count * 4));
    float* rl = r + offsets[l];
    const std::uint32_t sbits = __float_as_uint(scales[l]);
    const unsigned long long stride = static_cast<unsigned long long>(gridDim.x) * adacomp_threads;
    for (unsigned long long w = blockIdx.x * static_cast<unsigned long long>(adacomp_threads) + threadIdx.x; w < words;
         w += stride) {
      std::uint32_t word = 0;
#pragma unroll 8
      for (std::uint32_t b = 0; b < 32; ++b) {
        const unsigned long long j = w * 32 + b;
        if (j >= count) break;
        const std::uint32_t i = idx[j];
        const float x = rl[i];
        const std::uint32_t neg = __float_as_uint(x) >> 31;
        word |= neg << b;
        rl[i] = __fsub_rn(x, __uint_as_float(sbits ^ (neg << 31)));
      }
      out[w] = word;
    }
  }
}

//! Verdicts of AdaComp segments beyond packet_kernels.hpp's (texts in adacomp_reason()).
enum adacomp_verdict : std::uint32_t {
  v_adacomp_size = 100,
  v_adacomp_scale,
  v_adacomp_bin,
  v_adacomp_padding,
};

//! Human-readable reason of a verdict of an AdaComp packet.
inline const char* adacomp_reason(std::uint32_t v) {
  switch (v) {
    case v_width:
      return "adacomp segment: wrong index width";
    case v_count:
      return "adacomp segment: count exceeds numel";
    case v_adacomp_size:
      return "adacomp segment: payload size does not match count";
    case v_adacomp_scale:
      return "adacomp segment: scale not finite";
    case v_adacomp_bin:
      return "adacomp segment: zero bin length";
    case v_index_range:
      return "adacomp segment: index out of range";
    case v_index_order:
      return "adacomp segment: indices not strictly increasing";
    case v_adacomp_padding:
      return "adacomp segment: padding bits set";
    case v_unknown_encoding:
      return "adacomp segment: unknown encoding";
    default:
      return validation_reason(v);
  }
}

//! The payload checks of an AdaComp segment that need no loop (adacomp::validate_segment).
struct adacomp_segment_check {
  __device__ std::uint32_t operator()(const segment_header& sh, const std::byte* payload) const {
    if (sh.encoding != 0) return v_unknown_encoding;
    if (sh.index_width != index_width_for(sh.numel)) return v_width;
    if (sh.count > sh.numel) return v_count;
    if (sh.payload_bytes != 8 + pad8(sh.count * sh.index_width) + pad8((sh.count + 7) / 8)) return v_adacomp_size;
    float scale;
    std::uint32_t bin;
    memcpy(&scale, payload, 4);
    memcpy(&bin, payload + 4, 4);
    if (!(isfinite(scale) && scale >= 0.0f)) return v_adacomp_scale;
    if (bin == 0) return v_adacomp_bin;
    return v_ok;
  }
};

//! Walks an untrusted AdaComp packet (see walk_packet).
static __global__ void walk_adacomp_packet(const std::byte* __restrict__ packet, std::uint64_t size, layout_desc lay,
                                           std::uint8_t kind, segment_entry* __restrict__ table,
                                           walk_result* __restrict__ out) {
  if (blockIdx.x != 0 || threadIdx.x != 0) return;
  walk_packet(packet, size, lay, kind, table, out, adacomp_segment_check{});
}

//! Checks every index of every AdaComp segment (in range, strictly increasing) and the
//! sign region's padding bits and bytes; slot y of the grid takes segments y, y + gridDim.y, ...
static __global__ void check_adacomp_segments(const std::byte* __restrict__ packet, layout_desc lay,
                                              const segment_entry* __restrict__ table, walk_result* __restrict__ out) {
  if (!block_sees_verdict_ok(&out->verdict)) return;
  const std::uint32_t segs = out->segments;
  const std::uint64_t step = static_cast<std::uint64_t>(gridDim.x) * blockDim.x;
  const std::uint64_t first = blockIdx.x * static_cast<std::uint64_t>(blockDim.x) + threadIdx.x;
  for (std::uint32_t s = blockIdx.y; s < segs; s += gridDim.y) {
    const segment_entry en = table[s];
    if (en.raw) continue;
    const std::byte* idx = packet + en.payload + 8;
    const std::uint64_t numel = lay.numel[en.layer];
    for (std::uint64_t i = first; i < en.count; i += step) {
      const std::uint64_t ix = load_index(idx, en.width, i);
      if (ix >= numel)
        atomicCAS(&out->verdict, 0u, static_cast<std::uint32_t>(v_index_range));
      else if (i > 0 && ix <= load_index(idx, en.width, i - 1))
        atomicCAS(&out->verdict, 0u, static_cast<std::uint32_t>(v_index_order));
    }
    const auto* bits = reinterpret_cast<const std::uint8_t*>(idx + pad8(en.count * en.width));
    const std::uint64_t used = (en.count + 7) / 8, padded = pad8(used);
    for (std::uint64_t q = first; q < padded; q += step) {
      const unsigned v = bits[q];
      const bool bad =
          q + 1 < used ? false : (q + 1 == used ? (en.count % 8 != 0 && (v >> (en.count % 8)) != 0) : v != 0);
      if (bad) atomicCAS(&out->verdict, 0u, static_cast<std::uint32_t>(v_adacomp_padding));
    }
  }
}

//! out[layer offset + index] += scale * (±segment scale) for every AdaComp segment of a
//! validated packet; raw segments add densely. The products and sums are rounded as on
//! the host (no FMA). Slot y of the grid takes segments y, y + gridDim.y, ...
static __global__ void scatter_add_adacomp(const std::byte* __restrict__ packet, layout_desc lay,
                                           const segment_entry* __restrict__ table,
                                           const walk_result* __restrict__ walk, float* __restrict__ out, float scale) {
  if (walk->verdict != v_ok) return;
  const std::uint32_t segs = walk->segments;
  const std::uint64_t step = static_cast<std::uint64_t>(gridDim.x) * blockDim.x;
  const std::uint64_t first = blockIdx.x * static_cast<std::uint64_t>(blockDim.x) + threadIdx.x;
  for (std::uint32_t s = blockIdx.y; s < segs; s += gridDim.y) {
    const segment_entry en = table[s];
    const std::byte* p = packet + en.payload;
    float* o = out + lay.offset[en.layer];
    if (en.raw) {
      const float* v = reinterpret_cast<const float*>(p);
      for (std::uint64_t i = first; i < en.count; i += step) o[i] = __fadd_rn(o[i], __fmul_rn(scale, v[i]));
      continue;
    }
    float v;
    memcpy(&v, p, 4);
    const float pos = __fmul_rn(scale, v), neg = __fmul_rn(scale, -v);
    const std::byte* idx = p + 8;
    const auto* bits = reinterpret_cast<const std::uint8_t*>(idx + pad8(en.count * en.width));
    for (std::uint64_t j = first; j < en.count; j += step) {
      const std::uint64_t i = load_index(idx, en.width, j);
      const bool negative = (bits[j / 8] >> (j % 8)) & 1u;
      o[i] = __fadd_rn(o[i], negative ? neg : pos);
    }
  }
}

}  // namespace gravac::detail
