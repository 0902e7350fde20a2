#pragma once
//! \file block_scaled_kernels.hpp
//! \brief Device kernels of the block-scaled compressors (mxfp8_cuda, mxfp4_cuda,
//! nvfp4_cuda): the same scales, codes and residuals as detail::block_codec's, bit for bit,
//! and the element and scale codecs the device validation and decoding share.
//!
//! The host codecs (compress/detail/minifloat.hpp) are integer arithmetic on the float's
//! bits, but nvcc cannot call them from device code (they are neither constexpr nor
//! __device__, and the decoding table is host memory), so the device has its own copies
//! here: the same integer steps (std::bit_width as 32 - __clz), the same float operations
//! explicitly rounded (no contraction of the decoded product into a later addition). The
//! double tests compare them with the host's over every format and rounding.

#include "gravac/cuda/detail/nvcc_flags.hpp"
// (first, and apart from the includes below: a missing compiler option is one readable error)

#include <cstddef>
#include <cstdint>

#include "gravac/compress/detail/block_scaled_codec.hpp"
#include "gravac/compress/detail/minifloat.hpp"
#include "gravac/compress/detail/quantize_kernels.hpp"
#include "gravac/cuda/detail/launch_config.hpp"
#include "gravac/cuda/detail/quantize_cuda_kernels.hpp"
#include "gravac/packet/format.hpp"
#include "gravac/packet/quantized_packet.hpp"

namespace gravac::detail {

//! std::bit_width of a 32-bit word on the device.
__device__ __forceinline__ int bit_width_dev(std::uint32_t x) {
  return 32 - __clz(static_cast<int>(x));  // __clz(0) is 32
}

//! 2^n for n in [-126, 127] (pow2_normal on the device).
__device__ __forceinline__ float pow2_normal_dev(int n) {
  return __uint_as_float(static_cast<std::uint32_t>(n + 127) << 23);
}

//! decode_minifloat<F> of a magnitude code \p mag (sign clear, not a NaN or an infinity):
//! the table's value, computed as the table computes it (a small integer times a power of
//! two, both exact).
template <minifloat F>
__device__ __forceinline__ float minifloat_magnitude_dev(std::uint32_t mag) {
  constexpr minifloat_spec s = spec_of(F);
  constexpr int mb = static_cast<int>(s.mantissa_bits);
  const std::uint32_t e = mag >> mb;
  const std::uint32_t m = mag & ((1u << mb) - 1u);
  if (e == 0) return __fmul_rn(__int2float_rn(static_cast<int>(m)), pow2_normal_dev(1 - s.bias - mb));
  return __fmul_rn(__int2float_rn(static_cast<int>((1u << mb) + m)),
                   pow2_normal_dev(static_cast<int>(e) - s.bias - mb));
}

//! encode_magnitude<F, Stochastic> on the device: the same integer steps.
template <minifloat F, bool Stochastic>
__device__ __forceinline__ std::uint32_t encode_magnitude_dev(std::uint32_t a, int shift, std::uint32_t r) {
  constexpr minifloat_spec s = spec_of(F);
  constexpr int mb = static_cast<int>(s.mantissa_bits);
  constexpr int emin = 1 - s.bias;
  const std::uint32_t fe = a >> 23;
  const std::uint32_t M = (a & 0x7fffffu) | (fe != 0 ? 0x800000u : 0u);
  if (M == 0) return 0u;  // the host's answer for zero (its shifts are then unused)
  const int e0 = static_cast<int>(fe != 0 ? fe : 1u) - 150;
  const int fl = e0 + bit_width_dev(M) - 1 - shift;
  const int top = fl > emin ? fl : emin;
  const int sh = top - mb - (e0 - shift);
  std::uint64_t n;
  if (sh <= 0) {
    n = static_cast<std::uint64_t>(M) << (-sh);
  } else if (sh >= 64) {
    n = 0;
  } else if constexpr (Stochastic) {
    n = (static_cast<std::uint64_t>(M) + ((static_cast<std::uint64_t>(r) << 32) >> (64 - sh))) >> sh;
  } else {
    const std::uint64_t q = static_cast<std::uint64_t>(M) >> sh;
    const std::uint64_t rem = static_cast<std::uint64_t>(M) & ((std::uint64_t{1} << sh) - 1u);
    const std::uint64_t half = std::uint64_t{1} << (sh - 1);
    n = q + static_cast<std::uint64_t>(rem > half || (rem == half && (q & 1u) != 0));
  }
  const std::uint64_t code = (static_cast<std::uint64_t>(top - emin) << mb) + n;
  return static_cast<std::uint32_t>(code < s.max_code ? code : s.max_code);
}

//! e8m0_value on the device (codes 0..254; 0xFF, NaN, never reaches it).
__device__ __forceinline__ float e8m0_value_dev(std::uint32_t c) {
  c &= 0xffu;
  return __uint_as_float(c == 0 ? 0x00400000u : c << 23);
}

//! mx_shared_exponent<F> on the device.
template <minifloat F>
__device__ __forceinline__ int mx_shared_exponent_dev(std::uint32_t amax) {
  if (amax == 0) return e8m0_min_exponent;
  const std::uint32_t fe = amax >> 23;
  const int fl = fe != 0 ? static_cast<int>(fe) - 127 : bit_width_dev(amax & 0x7fffffu) - 150;
  const int k = fl - spec_of(F).emax;
  return k < e8m0_min_exponent ? e8m0_min_exponent : k > e8m0_max_exponent ? e8m0_max_exponent : k;
}

//! nvfp4_tensor_scale_ok on the device.
__device__ __forceinline__ bool nvfp4_tensor_scale_ok_dev(float t) {
  return t >= 0.0f && t <= 3.402823466e38f && finite_bits(__fmul_rn(6.0f, __fmul_rn(448.0f, t)));
}

//! nvfp4_tensor_scale on the device, from the bits of the layer's largest finite |u|.
__device__ __forceinline__ float nvfp4_tensor_scale_dev(std::uint32_t amax) {
  float t = __fdiv_rn(__uint_as_float(amax), nvfp4_scale_range);
  while (!nvfp4_tensor_scale_ok_dev(t)) t = __uint_as_float(__float_as_uint(t) - 1u);  // nextafter toward 0 (t > 0)
  return t;
}

//! block_codec<F>::block_scale on the device.
template <block_format F>
__device__ __forceinline__ float block_scale_dev(std::uint32_t s, float t) {
  if constexpr (shape_of(F).e8m0_scales)
    return e8m0_value_dev(s);
  else
    return __fmul_rn(minifloat_magnitude_dev<minifloat::e4m3>(s), t);
}

//! block_codec<F>::decoded on the device: |value(c)| * x rounded, the code's sign on the bits.
template <block_format F>
__device__ __forceinline__ float block_decoded_dev(std::uint32_t c, float x) {
  constexpr minifloat E = shape_of(F).element;
  constexpr std::uint32_t sign = sign_bit_of(E);
  const float mag = __fmul_rn(minifloat_magnitude_dev<E>(c & (sign - 1u)), x);
  return __uint_as_float(__float_as_uint(mag) | ((c & sign) != 0 ? 0x80000000u : 0u));
}

//! The bits of |x| when x is finite, else 0 (finite_max_bits' term).
__device__ __forceinline__ std::uint32_t finite_abs_bits(float x) {
  const std::uint32_t a = __float_as_uint(x) & 0x7fffffffu;
  return a < 0x7f800000u ? a : 0u;
}

//! NVFP4's pass before the codes: the largest finite |u| of every layer (u in e, written by
//! the fused pass), as bits, into amax[job index] (zeroed every step). One thread per
//! element; each warp's maximum is one atomicMax (integer maxima: the order does not matter).
__global__ void __launch_bounds__(quant_threads)
    layer_finite_amax(const float* __restrict__ e, const quant_job* __restrict__ jobs, std::uint32_t job_count,
                      std::uint32_t* __restrict__ amax) {
  const quant_job jb = find_job(jobs, job_count, pass_scales, blockIdx.x);
  const unsigned long long i = (blockIdx.x - jb.block_first[pass_scales]) * quant_threads + threadIdx.x;
  std::uint32_t m = i < jb.numel ? finite_abs_bits(e[jb.offset + i]) : 0u;
#pragma unroll
  for (int off = 16; off > 0; off /= 2) {
    const std::uint32_t o = __shfl_xor_sync(0xffffffffu, m, off);
    m = m > o ? m : o;
  }
  if (threadIdx.x % 32 == 0 && m != 0) atomicMax(amax + jb.index, m);
}

//! The code pass of format \p F: one thread per code slot of the padded code words, a block
//! of B = 16 or 32 elements on aligned lanes of one warp. The block's largest finite |u| by
//! shuffles, its scale (MX: 2^k as E8M0; NVFP4: the E4M3 code of amax / (6 t), t from the
//! layer's amax), then per element the code (rounded to nearest even, or with the element's
//! draw when \p Stochastic); codes are or-ed across the lanes that share a 32-bit word and
//! written by its first lane (the residual e = u - decoded is the last pass's:
//! quantized_residuals.hpp). The job's first thread writes the prefix (B, t) and the scales' padding.
template <block_format F, bool Stochastic>
__global__ void __launch_bounds__(quant_threads)
    block_scaled_codes(const float* __restrict__ e, const quant_job* __restrict__ jobs, std::uint32_t job_count,
                       const std::uint32_t* __restrict__ layer_amax, std::byte* __restrict__ packet) {
  constexpr block_shape shape = shape_of(F);
  constexpr minifloat E = shape.element;
  constexpr unsigned W = shape.code_bits;
  constexpr unsigned per = 32 / W;  // codes per 32-bit word
  constexpr unsigned B = static_cast<unsigned>(shape.block);
  static_assert(32 % B == 0, "a block lies in one warp");
  const quant_job jb = find_job(jobs, job_count, pass_codes, blockIdx.x);
  const unsigned long long i = (blockIdx.x - jb.block_first[pass_codes]) * quant_threads + threadIdx.x;
  const unsigned long long n = jb.numel;
  const unsigned long long nb = bucket_count(n, B);
  std::byte* pl = packet + jb.payload;
  auto* scales = reinterpret_cast<std::uint8_t*>(pl + quant_prefix_bytes);
  float t = 0.0f;
  if constexpr (!shape.e8m0_scales) t = nvfp4_tensor_scale_dev(layer_amax[jb.index]);
  if (i == 0) {
    auto* prefix = reinterpret_cast<std::uint32_t*>(pl);
    prefix[0] = B;
    prefix[1] = __float_as_uint(t);
    for (unsigned long long b = nb; b < pad8(nb); ++b) scales[b] = 0;
  }
  float v = 0.0f;
  if (i < n) v = e[jb.offset + i];
  std::uint32_t amax = finite_abs_bits(v);
#pragma unroll
  for (unsigned off = B / 2; off > 0; off /= 2) {
    const std::uint32_t o = __shfl_xor_sync(0xffffffffu, amax, static_cast<int>(off));
    amax = amax > o ? amax : o;
  }
  int k = 0;
  std::uint32_t s = 0;
  if constexpr (shape.e8m0_scales) {
    k = mx_shared_exponent_dev<E>(amax);
    s = e8m0_code(k);
  } else if (t > 0.0f) {
    s = encode_magnitude_dev<minifloat::e4m3, false>(
        __float_as_uint(__fdiv_rn(__uint_as_float(amax), __fmul_rn(6.0f, t))), 0, 0);
  }
  const float x = block_scale_dev<F>(s, t);
  std::uint32_t code = 0;
  if (i < n) {
    if (i % B == 0) scales[i / B] = static_cast<std::uint8_t>(s);
    const std::uint32_t b = __float_as_uint(v);
    std::uint32_t a = b & 0x7fffffffu;
    const bool nan = a > 0x7f800000u;
    a = nan ? 0u : a;
    const std::uint32_t r = Stochastic ? element_bits(jb.stream, i) : 0u;
    std::uint32_t mag;
    if constexpr (shape.e8m0_scales) {
      mag = encode_magnitude_dev<E, Stochastic>(a, k, r);
    } else {
      const std::uint32_t y = x > 0.0f ? __float_as_uint(__fdiv_rn(__uint_as_float(a), x)) : 0u;
      mag = encode_magnitude_dev<E, Stochastic>(y, 0, r);
    }
    code = mag | ((b >> 31) != 0 && !nan ? sign_bit_of(E) : 0u);
  }
  const unsigned slot = threadIdx.x % per;  // blocks start on a word boundary
  code <<= slot * W;
#pragma unroll
  for (unsigned off = per / 2; off > 0; off /= 2) code |= __shfl_xor_sync(0xffffffffu, code, static_cast<int>(off));
  const unsigned long long word = i / per;
  if (slot == 0 && word < pad8(detail::code_bytes(n, W)) / 4)
    reinterpret_cast<std::uint32_t*>(pl + quant_prefix_bytes + pad8(nb))[word] = code;
}

//! True when code \p c of a validated segment's encoding \p enc is one the writer never
//! sends and the host's check rejects: an FP8 NaN (E4M3, E5M2) or infinity (E5M2).
__device__ __forceinline__ bool block_code_invalid(std::uint8_t enc, std::uint32_t c) {
  if (enc == static_cast<std::uint8_t>(quant_encoding::mxfp8_e4m3)) return (c & 0x7fu) == 0x7fu;
  if (enc == static_cast<std::uint8_t>(quant_encoding::mxfp8_e5m2)) return (c & 0x7fu) >= 0x7cu;
  return false;
}

//! True when scale code \p s of encoding \p enc is rejected by the host's check: an E8M0
//! code above mx_max_scale_code of the element format (NaN included), an E4M3 scale with a
//! sign or NaN.
__device__ __forceinline__ bool block_scale_invalid(std::uint8_t enc, std::uint32_t s) {
  switch (static_cast<quant_encoding>(enc)) {
    case quant_encoding::mxfp8_e4m3:
      return s > mx_max_scale_code(minifloat::e4m3);
    case quant_encoding::mxfp8_e5m2:
      return s > mx_max_scale_code(minifloat::e5m2);
    case quant_encoding::mxfp4:
      return s > mx_max_scale_code(minifloat::e2m1);
    default:
      return s >= 0x7fu;
  }
}

//! The value code \p c decodes to in a block of scale code \p s (per-layer scale \p t for
//! NVFP4) of encoding \p enc: block_codec::decoded(c, block_scale(s, t)).
__device__ __forceinline__ float block_value_dev(std::uint8_t enc, std::uint32_t c, std::uint32_t s, float t) {
  switch (static_cast<quant_encoding>(enc)) {
    case quant_encoding::mxfp8_e4m3:
      return block_decoded_dev<block_format::mxfp8_e4m3>(c, block_scale_dev<block_format::mxfp8_e4m3>(s, t));
    case quant_encoding::mxfp8_e5m2:
      return block_decoded_dev<block_format::mxfp8_e5m2>(c, block_scale_dev<block_format::mxfp8_e5m2>(s, t));
    case quant_encoding::mxfp4:
      return block_decoded_dev<block_format::mxfp4>(c, block_scale_dev<block_format::mxfp4>(s, t));
    default:
      return block_decoded_dev<block_format::nvfp4>(c, block_scale_dev<block_format::nvfp4>(s, t));
  }
}

//! True for the encodings of the block-scaled formats.
__host__ __device__ constexpr bool is_block_encoding(std::uint8_t enc) {
  return enc == static_cast<std::uint8_t>(quant_encoding::mxfp8_e4m3) ||
         enc == static_cast<std::uint8_t>(quant_encoding::mxfp8_e5m2) ||
         enc == static_cast<std::uint8_t>(quant_encoding::mxfp4) ||
         enc == static_cast<std::uint8_t>(quant_encoding::nvfp4);
}

}  // namespace gravac::detail
