#pragma once
//! \file quantize_cuda_kernels.hpp
//! \brief Device kernels of the quantizing compressors (qsgd_cuda, terngrad_cuda,
//! sign_cuda, cast16_cuda): the same codes, scales and residuals as the host's, bit for bit.
//!
//! Bit identity needs the host's arithmetic exactly: explicitly rounded intrinsics (no FMA)
//! and the host's summation order; how: docs/algorithms.md, "The device kernels".

#include "gravac/cuda/detail/nvcc_flags.hpp"
// (first, and apart from the includes below: a missing compiler option is one readable error)

#include <cfloat>
#include <cstddef>
#include <cstdint>

#include "gravac/compress/detail/quantize_kernels.hpp"
#include "gravac/cuda/detail/cub_primitives.hpp"
#include "gravac/cuda/detail/job_search.hpp"
#include "gravac/cuda/detail/launch_config.hpp"
#include "gravac/cuda/detail/ordered_sums.hpp"
#include "gravac/packet/format.hpp"
#include "gravac/packet/quantized_packet.hpp"

namespace gravac::detail {

//! Elements per host chunk (detail::quant_chunk) and float lanes per chunk (detail::sum_lanes).
inline constexpr unsigned long long quant_chunk_elems = detail::quant_chunk;
//! Float partial sums per chunk, as on the host.
inline constexpr int quant_lanes = static_cast<int>(detail::sum_lanes);
static_assert(quant_lanes == 16 && quant_chunk_elems == 1024, "the device mirrors the host's chunking");
//! Chunks one block of accumulate_chunks handles (quant_lanes threads each).
inline constexpr int chunks_per_block = quant_threads / quant_lanes;

//! The passes of a step; a job's first block in each pass grid is quant_job::block_first[pass].
enum quant_pass : int { pass_accumulate = 0, pass_scales = 1, pass_codes = 2, pass_raw = 3, pass_kept = 4 };
//! Passes with a grid of their own.
inline constexpr int quant_passes = 5;

//! One layer of a packet being written (device memory, planned on the host every step).
struct quant_job {
  unsigned long long offset = 0;                      //!< first element of the layer in g and e
  unsigned long long numel = 0;                       //!< elements
  unsigned long long payload = 0;                     //!< offset of the segment payload in the packet
  unsigned long long stream = 0;                      //!< random stream (mix_seed of seed, step, layer id)
  unsigned long long bucket = 0;                      //!< elements per bucket (numel for one bucket)
  unsigned long long buckets = 0;                     //!< buckets of the layer
  unsigned long long chunks_per_bucket = 0;           //!< chunks of a full bucket
  unsigned long long chunks = 0;                      //!< chunks of the layer
  unsigned long long chunk_first = 0;                 //!< first chunk record of the layer
  unsigned long long bucket_first = 0;                //!< first bucket record of the layer
  unsigned long long block_first[quant_passes] = {};  //!< first block of the job in each pass grid
  std::uint32_t index = 0;                            //!< job index (its quant_sums slot)
  std::uint32_t raw = 0;                              //!< sent dense (raw segment)
};

//! Sums of one chunk, in the host's order.
struct chunk_sums {
  double u_sq;   //!< sum of u^2
  double u_abs;  //!< sum of |u|
  float u_max;   //!< max |u| (with the host's NaN behaviour)
  std::uint32_t pad_;
};

//! What the code pass needs of one bucket: levels / scale, finite (0 for a zero or
//! non-finite scale).
struct bucket_scale {
  float inv;
};

//! The kept energy of one job (device memory, zeroed every step); its norms and its
//! non-finite flag come from the fused pass that wrote u.
struct quant_sums {
  double kept_sq;             //!< ||decompress(segment)||^2
  std::uint32_t blocks_done;  //!< counts the job's blocks of the residual pass (square_sums_pass)
  std::uint32_t pad_;
};

//! The job that owns block \p block of pass \p pass (owning_job over block_first[pass]).
__device__ __forceinline__ quant_job find_job(const quant_job* __restrict__ jobs, std::uint32_t count, int pass,
                                              unsigned long long block) {
  return jobs[owning_job(jobs, count, block, [pass](const quant_job& j) { return j.block_first[pass]; })];
}

//! |x| by clearing the sign bit (std::fabs on the host; keeps a NaN's payload).
__device__ __forceinline__ float abs_bits(float x) { return __uint_as_float(__float_as_uint(x) & 0x7fffffffu); }

//! static_cast<std::int32_t>(a) for a >= 0 or NaN as x86 computes it: truncation, and
//! INT_MIN for NaN or a >= 2^31.
__device__ __forceinline__ std::int32_t x86_trunc(float a) {
  return a < 2147483648.0f ? __float2int_rz(a) : static_cast<std::int32_t>(0x80000000u);
}

//! detail::uniform24 on the device.
__device__ __forceinline__ float uniform24_dev(std::uint32_t bits) {
  return __fmul_rn(__int2float_rn(static_cast<std::int32_t>(bits >> 8)), 0x1p-24f);
}

//! A finite float (neither infinity nor NaN).
__device__ __forceinline__ bool finite_bits(float x) { return (__float_as_uint(x) & 0x7f800000u) != 0x7f800000u; }

//! The blocks job \p jb has in pass \p pass (up to the next job's first block).
__device__ __forceinline__ unsigned long long job_blocks(const quant_job* __restrict__ jobs, std::uint32_t count,
                                                         int pass, const quant_job& jb) {
  const unsigned long long end = jb.index + 1 < count ? jobs[jb.index + 1].block_first[pass] : gridDim.x;
  return end - jb.block_first[pass];
}

//! Pass 1 of QSGD, TernGrad and EF-sign, over u in e (the fused pass wrote it): each
//! chunk's sums exactly as detail::accumulate_block computes them: 16 threads per chunk,
//! thread k summing lane k in float, the tail in double by the chunk's first thread, then
//! lane by lane in double. The sums of g count only as the host's: a lane of g that
//! overflows sends the chunk to the exact path.
__global__ void __launch_bounds__(quant_threads)
    accumulate_chunks(const float* __restrict__ g, const float* __restrict__ e, const quant_job* __restrict__ jobs,
                      std::uint32_t job_count, chunk_sums* __restrict__ chunks) {
  const quant_job jb = find_job(jobs, job_count, pass_accumulate, blockIdx.x);
  const unsigned lane = threadIdx.x % quant_lanes;
  const unsigned group_base = (threadIdx.x % 32u) - lane;  // the group's first lane in its warp
  const unsigned long long j =
      (blockIdx.x - jb.block_first[pass_accumulate]) * chunks_per_block + threadIdx.x / quant_lanes;
  float gs = 0, us = 0, ua = 0, um = 0;  // this lane's float partials
  double tg = 0, tu = 0, ta = 0;         // the tail's double sums (lane 0)
  float tm = 0;                          // the tail's max (lane 0)
  const float* chunk_g = nullptr;        // the chunk's g and u, and its length
  const float* chunk_u = nullptr;
  unsigned long long chunk_m = 0;
  if (j < jb.chunks) {
    const unsigned long long b = j / jb.chunks_per_bucket;
    const unsigned long long c = (j % jb.chunks_per_bucket) * quant_chunk_elems;
    const unsigned long long lo = b * jb.bucket;
    const unsigned long long mb = jb.numel - lo < jb.bucket ? jb.numel - lo : jb.bucket;
    const unsigned long long mc = mb - c < quant_chunk_elems ? mb - c : quant_chunk_elems;
    const float* gp = g + jb.offset + lo + c;
    const float* ep = e + jb.offset + lo + c;
    chunk_g = gp;
    chunk_u = ep;
    chunk_m = mc;
    const unsigned long long rows = mc / quant_lanes;
    for (unsigned long long r = 0; r < rows; ++r) {
      const unsigned long long i = r * quant_lanes + lane;
      const float gi = gp[i];
      const float u = ep[i];
      const float a = abs_bits(u);
      gs = __fadd_rn(gs, __fmul_rn(gi, gi));
      us = __fadd_rn(us, __fmul_rn(u, u));
      ua = __fadd_rn(ua, a);
      um = um > a ? um : a;
    }
    if (lane == 0) {
      for (unsigned long long i = rows * quant_lanes; i < mc; ++i) {
        const float gi = gp[i];
        const float u = ep[i];
        const float a = u < 0.0f ? -u : u;  // the host's tail takes |u| this way
        tg = __dadd_rn(tg, __dmul_rn(static_cast<double>(gi), static_cast<double>(gi)));
        tu = __dadd_rn(tu, __dmul_rn(static_cast<double>(u), static_cast<double>(u)));
        ta = __dadd_rn(ta, static_cast<double>(a));
        tm = tm > a ? tm : a;
      }
    }
  }
  // Lane 0 adds the 16 lanes in order after its tail (every lane of the warp shuffles).
  for (unsigned k = 0; k < static_cast<unsigned>(quant_lanes); ++k) {
    const float lg = __shfl_sync(0xffffffffu, gs, static_cast<int>(group_base + k));
    const float lu = __shfl_sync(0xffffffffu, us, static_cast<int>(group_base + k));
    const float la = __shfl_sync(0xffffffffu, ua, static_cast<int>(group_base + k));
    const float lm = __shfl_sync(0xffffffffu, um, static_cast<int>(group_base + k));
    tg = __dadd_rn(tg, static_cast<double>(lg));
    tu = __dadd_rn(tu, static_cast<double>(lu));
    ta = __dadd_rn(ta, static_cast<double>(la));
    tm = tm > lm ? tm : lm;
  }
  // accumulate_block's rare path (detail::exact_block_sums): when a float lane overflowed
  // (or the chunk is not finite), or the chunk is tiny and not zero (its squares
  // underflow), the first lane sums the chunk again in double in index order.
  if (lane == 0 && j < jb.chunks &&
      (!(isfinite(tg) && isfinite(tu) && isfinite(ta)) || (tu < detail::tiny_block_sq && tm > 0.0f))) {
    double sg = 0, su = 0, sa = 0;
    for (unsigned long long i = 0; i < chunk_m; ++i) {
      const double gi = static_cast<double>(chunk_g[i]), ui = static_cast<double>(chunk_u[i]);
      sg = __dadd_rn(sg, __dmul_rn(gi, gi));
      su = __dadd_rn(su, __dmul_rn(ui, ui));
      sa = __dadd_rn(sa, ui < 0 ? -ui : ui);
    }
    tg = sg;
    tu = su;
    ta = sa;
  }
  if (lane == 0 && j < jb.chunks) chunks[jb.chunk_first + j] = {tu, ta, tm, 0u};
}

//! Pass 2 of QSGD (\p L2: the norm) and TernGrad (max |u|): one thread per bucket adds its
//! chunks in order as the host does, writes the scale (and the prefix, and the scales'
//! padding) into the packet, and keeps levels / scale for the code pass.
template <bool L2>
__global__ void __launch_bounds__(quant_threads)
    bucket_scales(const quant_job* __restrict__ jobs, std::uint32_t job_count, const chunk_sums* __restrict__ chunks,
                  bucket_scale* __restrict__ out, std::byte* __restrict__ packet, std::uint32_t levels,
                  std::uint32_t bucket_option) {
  const quant_job jb = find_job(jobs, job_count, pass_scales, blockIdx.x);
  const unsigned long long b = (blockIdx.x - jb.block_first[pass_scales]) * quant_threads + threadIdx.x;
  if (b >= jb.buckets) return;
  const unsigned long long first = b * jb.chunks_per_bucket;
  const unsigned long long last = b + 1 == jb.buckets ? jb.chunks : first + jb.chunks_per_bucket;
  double sq = 0;
  float mx = 0;
  for (unsigned long long c = first; c < last; ++c) {
    const chunk_sums s = chunks[jb.chunk_first + c];
    sq = __dadd_rn(sq, s.u_sq);
    mx = mx < s.u_max ? s.u_max : mx;  // std::max(bucket_max, s.u_max)
  }
  const float norm_or_max = L2 ? __double2float_rn(__dsqrt_rn(sq)) : mx;
  // std::min(norm_or_max, max_level_scale): a norm past the float maximum is capped.
  const float scale = detail::max_level_scale < norm_or_max ? detail::max_level_scale : norm_or_max;
  const float lv = static_cast<float>(levels);
  float inv = 0.0f;
  if (scale > 0.0f) {
    const float q = __fdiv_rn(lv, scale);
    inv = FLT_MAX < q ? FLT_MAX : q;  // std::min(q, FLT_MAX)
  }
  out[jb.bucket_first + b] = {inv};
  std::byte* pl = packet + jb.payload;
  auto* scales = reinterpret_cast<float*>(pl + quant_prefix_bytes);
  scales[b] = scale;
  if (b + 1 == jb.buckets && jb.buckets % 2 == 1) scales[b + 1] = 0.0f;  // padding to 8 bytes
  if (b == 0) {
    auto* prefix = reinterpret_cast<std::uint32_t*>(pl);
    prefix[0] = levels;
    prefix[1] = bucket_option;
  }
}

//! Pass 3 of QSGD and TernGrad: one thread per element (and per padding slot of the last
//! code words): the draw, the level and the code, as leveled_codec's quantize_one (the
//! residual is the last pass's, from the packet: quantized_residuals.hpp); codes of W bits
//! are or-ed across the lanes that share a 32-bit word and written by its first lane.
//! Padding codes are zero.
template <unsigned W>
__global__ void __launch_bounds__(quant_threads)
    quantize_codes(const float* __restrict__ e, const quant_job* __restrict__ jobs, std::uint32_t job_count,
                   const bucket_scale* __restrict__ scales, std::byte* __restrict__ packet, std::int32_t lv) {
  constexpr unsigned per = 32 / W;  // codes per 32-bit word
  const quant_job jb = find_job(jobs, job_count, pass_codes, blockIdx.x);
  const unsigned long long i = (blockIdx.x - jb.block_first[pass_codes]) * quant_threads + threadIdx.x;
  const unsigned long long n = jb.numel;
  const unsigned long long words = pad8(detail::code_bytes(n, W)) / 4;
  std::uint32_t code = 0;
  if (i < n) {
    const bucket_scale s = scales[jb.bucket_first + i / jb.bucket];
    const float x = e[jb.offset + i];
    const std::uint32_t xb = __float_as_uint(x);
    const float a = __fmul_rn(__uint_as_float(xb & 0x7fffffffu), s.inv);
    const std::int32_t fl = x86_trunc(a);
    const float r = uniform24_dev(detail::element_bits(jb.stream, i));
    std::int32_t l = fl + static_cast<std::int32_t>(r < __fsub_rn(a, __int2float_rn(fl)));
    l = l < lv ? l : lv;
    const std::uint32_t neg = (xb >> 31) & static_cast<std::uint32_t>(l != 0);
    code = (static_cast<std::uint32_t>(l) | (neg << (W - 1))) & ((1u << W) - 1u);
  }
  const unsigned slot = threadIdx.x % per;  // blocks start on a word boundary
  code <<= slot * W;
#pragma unroll
  for (unsigned off = per / 2; off > 0; off /= 2) code |= __shfl_xor_sync(0xffffffffu, code, static_cast<int>(off));
  const unsigned long long word = i / per;
  if (slot == 0 && word < words) {
    const std::size_t at = jb.payload + quant_prefix_bytes + pad8(jb.buckets * sizeof(float));
    reinterpret_cast<std::uint32_t*>(packet + at)[word] = code;
  }
}

//! Pass 2 of EF-sign: one block per layer, whose first thread adds the chunks' sums of |u|
//! in order (the host's order), divides by numel in double, and writes the prefix (scale, 0).
__global__ void __launch_bounds__(quant_threads)
    sign_layer_scale(const quant_job* __restrict__ jobs, std::uint32_t job_count, const chunk_sums* __restrict__ chunks,
                     std::byte* __restrict__ packet, quant_sums* __restrict__ sums) {
  const quant_job jb = find_job(jobs, job_count, pass_scales, blockIdx.x);
  if (threadIdx.x != 0) return;
  double s = 0;
  for (unsigned long long c = 0; c < jb.chunks; ++c) s = __dadd_rn(s, chunks[jb.chunk_first + c].u_abs);
  const float scale = __double2float_rn(__ddiv_rn(s, static_cast<double>(jb.numel)));
  auto* prefix = reinterpret_cast<float*>(packet + jb.payload);
  prefix[0] = scale;
  reinterpret_cast<std::uint32_t*>(packet + jb.payload)[1] = 0u;
  const double sd = static_cast<double>(scale);
  sums[jb.index].kept_sq = __dmul_rn(__dmul_rn(static_cast<double>(jb.numel), sd), sd);
}

//! Pass 3 of EF-sign: one thread per element; bit = u < 0 (a warp's 32 bits by ballot).
//! Padding bits are zero. (The residual e = u - (u < 0 ? -scale : scale) is the last pass's.)
__global__ void __launch_bounds__(quant_threads)
    sign_codes(const float* __restrict__ e, const quant_job* __restrict__ jobs, std::uint32_t job_count,
               std::byte* __restrict__ packet) {
  const quant_job jb = find_job(jobs, job_count, pass_codes, blockIdx.x);
  const unsigned long long i = (blockIdx.x - jb.block_first[pass_codes]) * quant_threads + threadIdx.x;
  const unsigned long long words = pad8(detail::code_bytes(jb.numel, 1)) / 4;
  const bool neg = i < jb.numel && e[jb.offset + i] < 0.0f;
  const std::uint32_t bits = __ballot_sync(0xffffffffu, neg);
  const unsigned long long word = i / 32;
  if (threadIdx.x % 32 == 0 && word < words)
    reinterpret_cast<std::uint32_t*>(packet + jb.payload + quant_prefix_bytes)[word] = bits;
}

//! detail::fp16_of_magnitude on the device.
__device__ __forceinline__ std::uint32_t fp16_of_magnitude_dev(std::uint32_t a) {
  const std::uint32_t subnormal = __float_as_uint(__fadd_rn(__uint_as_float(a), 0.5f)) - 0x3f000000u;
  const std::uint32_t normal = (a + 0xc8000fffu + ((a >> 13) & 1u)) >> 13;
  return a < 0x38800000u ? subnormal : normal;
}

//! detail::fp16_to_float on the device.
__device__ __forceinline__ float fp16_to_float_dev(std::uint32_t h) {
  const std::uint32_t m = h & 0x7fffu;
  const std::uint32_t bits = m < 0x400u
                                 ? __float_as_uint(__fmul_rn(__int2float_rn(static_cast<std::int32_t>(m)), 0x1p-24f))
                                 : (m << 13) + 0x38000000u;
  return __uint_as_float(bits | ((h & 0x8000u) << 16));
}

//! detail::bf16_to_float on the device.
__device__ __forceinline__ float bf16_to_float_dev(std::uint32_t h) { return __uint_as_float((h & 0xffffu) << 16); }

//! cast16's code pass over u in e: one thread per element: the 16-bit code of u / N
//! clamped to \p limit_bits (detail::cast16_limit_bits: the format's largest finite value
//! whose N-fold is finite; cast16::cast_block); two codes per 32-bit word (the residual u -
//! N * decoded is the last pass's). The job's first thread writes the prefix (N, 0).
template <bool BF16>
__global__ void __launch_bounds__(quant_threads)
    cast16_codes(const float* __restrict__ e, const quant_job* __restrict__ jobs, std::uint32_t job_count,
                 std::byte* __restrict__ packet, float ranks, float inv, std::uint32_t limit_bits) {
  const quant_job jb = find_job(jobs, job_count, pass_codes, blockIdx.x);
  const unsigned long long i = (blockIdx.x - jb.block_first[pass_codes]) * quant_threads + threadIdx.x;
  const unsigned long long words = pad8(jb.numel * 2) / 4;
  std::uint32_t code = 0;
  if (i < jb.numel) {
    const std::uint32_t q = __float_as_uint(__fmul_rn(e[jb.offset + i], inv));
    std::uint32_t a = q & 0x7fffffffu;
    a = a < limit_bits ? a : limit_bits;
    const std::uint32_t sign = (q >> 16) & 0x8000u;
    if constexpr (BF16)
      code = ((a + 0x7fffu + ((a >> 16) & 1u)) >> 16) | sign;
    else
      code = fp16_of_magnitude_dev(a) | sign;
    code &= 0xffffu;
  }
  code <<= (threadIdx.x % 2) * 16;
  code |= __shfl_xor_sync(0xffffffffu, code, 1);
  const unsigned long long word = i / 2;
  if (threadIdx.x % 2 == 0 && word < words)
    reinterpret_cast<std::uint32_t*>(packet + jb.payload + quant_prefix_bytes)[word] = code;
  if (i == 0) {
    auto* prefix = reinterpret_cast<float*>(packet + jb.payload);
    prefix[0] = ranks;
    reinterpret_cast<std::uint32_t*>(packet + jb.payload)[1] = 0u;
  }
}

//! Layers sent dense: u (in e: the fused pass wrote it) written raw, e = 0; the padding
//! float of an odd-sized layer is zero. One thread per float of the padded payload.
__global__ void __launch_bounds__(quant_threads) raw_jobs(float* __restrict__ e, const quant_job* __restrict__ jobs,
                                                          std::uint32_t job_count, std::byte* __restrict__ packet) {
  const quant_job jb = find_job(jobs, job_count, pass_raw, blockIdx.x);
  const unsigned long long i = (blockIdx.x - jb.block_first[pass_raw]) * quant_threads + threadIdx.x;
  auto* out = reinterpret_cast<float*>(packet + jb.payload);
  if (i < jb.numel) {
    float* ep = e + jb.offset + i;
    out[i] = *ep;
    *ep = 0.0f;
  } else if (i < pad8(jb.numel * sizeof(float)) / sizeof(float)) {
    out[i] = 0.0f;
  }
}

//! The repair of a step that failed after raw_jobs ran: e = u again for every job sent raw,
//! from its segment (raw_jobs wrote u there and zeroed e). The grid of raw_jobs.
__global__ void __launch_bounds__(quant_threads)
    restore_raw_jobs(float* __restrict__ e, const quant_job* __restrict__ jobs, std::uint32_t job_count,
                     const std::byte* __restrict__ packet) {
  const quant_job jb = find_job(jobs, job_count, pass_raw, blockIdx.x);
  const unsigned long long i = (blockIdx.x - jb.block_first[pass_raw]) * quant_threads + threadIdx.x;
  if (i < jb.numel) e[jb.offset + i] = reinterpret_cast<const float*>(packet + jb.payload)[i];
}

}  // namespace gravac::detail
