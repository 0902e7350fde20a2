#pragma once
//! \file quantized_packet_kernels.hpp
//! \brief Quantized packets (packet_kind::quantized) in device memory: the header walk,
//! the payload checks and the decoding of the device quantizers. The same checks as the
//! host's validate (leveled_codec::check, sign::validate, cast16::validate,
//! block_codec::check) and the same decoded values bit for bit (every float operation
//! rounded explicitly, no contraction).

#include "gravac/cuda/detail/nvcc_flags.hpp"
// (first, and apart from the includes below: a missing compiler option is one readable error)

#include <cstddef>
#include <cstdint>

#include "gravac/cuda/detail/block_scaled_kernels.hpp"
#include "gravac/cuda/detail/packet_kernels.hpp"
#include "gravac/cuda/detail/quantize_cuda_kernels.hpp"
#include "gravac/packet/format.hpp"
#include "gravac/packet/quantized_packet.hpp"
#include "gravac/packet/raw_segment.hpp"

namespace gravac::detail {

//! Which quantized encodings a packet may hold (besides raw segments).
enum class quant_family : std::uint8_t {
  qsgd,      //!< quant_encoding::qsgd, any level count 1..32767
  terngrad,  //!< quant_encoding::terngrad, one level
  sign,      //!< quant_encoding::sign
  cast16,    //!< quant_encoding::fp16 or bf16
  mxfp8,     //!< quant_encoding::mxfp8_e4m3 or mxfp8_e5m2 (the compressor's element format only)
  mxfp4,     //!< quant_encoding::mxfp4
  nvfp4,     //!< quant_encoding::nvfp4
};

//! True for the block-scaled families (mxfp8, mxfp4, nvfp4).
constexpr bool is_block_family(quant_family f) noexcept {
  return f == quant_family::mxfp8 || f == quant_family::mxfp4 || f == quant_family::nvfp4;
}

//! Verdicts of the quantized checks (after packet_kernels.hpp's verdict codes).
enum quant_verdict : std::uint32_t {
  qv_encoding = 64,
  qv_prefix,
  qv_levels,
  qv_ternary,
  qv_bucket,
  qv_indices,
  qv_count,
  qv_size,
  qv_scale,
  qv_code,
  qv_padding,
  qv_special,
  qv_block,
  qv_prefix_word,
};

//! Human-readable reason of a verdict of the quantized walk or checks.
inline const char* quant_validation_reason(std::uint32_t v) {
  switch (v) {
    case qv_encoding:
      return "quantized segment: unexpected encoding";
    case qv_prefix:
      return "quantized segment: payload truncated";
    case qv_levels:
      return "quantized segment: level count out of range";
    case qv_ternary:
      return "ternary segment with more than one level";
    case qv_bucket:
      return "quantized segment: bucket not a multiple of 64";
    case qv_indices:
      return "quantized segment with indices";
    case qv_count:
      return "quantized segment: count differs from numel";
    case qv_size:
      return "quantized segment: payload size wrong";
    case qv_scale:
      return "quantized segment: scale or multiplier not finite, or negative";
    case qv_code:
      return "quantized segment: invalid code or level out of range";
    case qv_padding:
      return "quantized segment: padding bits set";
    case qv_special:
      return "cast16 segment: infinite or NaN value";
    case qv_block:
      return "block-scaled segment: wrong block size";
    case qv_prefix_word:
      return "block-scaled segment: prefix word set";
    default:
      return validation_reason(v);
  }
}

//! A segment found by the quantized walk.
struct quant_segment {
  std::uint64_t payload = 0;  //!< offset of the payload in the packet
  std::uint64_t numel = 0;    //!< elements
  std::uint32_t layer = 0;    //!< layer index
  std::uint32_t levels = 0;   //!< leveled: level count s
  std::uint32_t bucket = 0;   //!< leveled: elements per bucket (0: the whole layer); block-scaled: elements per scale
  std::uint8_t encoding = 0;  //!< segment_header::encoding
  std::uint8_t raw = 0;       //!< a raw (dense) segment
  std::uint8_t width = 0;     //!< code width in bits
  std::uint8_t pad_ = 0;
};

//! code_width() on the device (without std::bit_width, which device code may not call).
__device__ __forceinline__ unsigned code_width_dev(std::uint32_t levels) {
  const unsigned bits = 1u + static_cast<unsigned>(32 - __clz(static_cast<int>(levels)));
  return bits <= 2 ? 2u : bits <= 4 ? 4u : bits <= 8 ? 8u : 16u;
}

//! leveled_payload_bytes() on the device.
__device__ __forceinline__ std::uint64_t leveled_payload_bytes_dev(std::uint64_t numel, std::uint32_t levels,
                                                                   std::uint64_t bucket) {
  return quant_prefix_bytes + pad8(bucket_count(numel, bucket) * sizeof(float)) +
         pad8(detail::code_bytes(numel, code_width_dev(levels)));
}

//! A finite, non-negative float (detail::valid_scale).
__device__ __forceinline__ bool valid_scale_dev(float s) { return s >= 0.0f && s <= 3.402823466e38f; }

//! Walks an untrusted quantized packet (one thread): every header check of validate_packet,
//! raw segments as validate_raw_segment, quantized segments' encoding, prefix and size as
//! the host's; fills the segment table. A block-scaled family accepts \p block_encoding
//! only (mxfp8's element format). Reads no byte outside [packet, packet + size).
static __global__ void walk_quantized_packet(const std::byte* __restrict__ packet, std::uint64_t size, layout_desc lay,
                                             quant_family family, std::uint8_t block_encoding,
                                             quant_segment* __restrict__ table, walk_result* __restrict__ out) {
  if (blockIdx.x != 0 || threadIdx.x != 0) return;
  auto fail = [&](std::uint32_t v) { *out = {v, 0}; };
  packet_header h;
  const auto kind = static_cast<std::uint8_t>(packet_kind::quantized);
  if (const std::uint32_t v = read_packet_header(packet, size, lay, kind, h); v != v_ok) return fail(v);
  std::uint64_t pos = sizeof(packet_header);
  long long last = -1;
  for (std::uint32_t s = 0; s < h.segment_count; ++s) {
    segment_header sh;
    if (const std::uint32_t v = read_segment_header(packet, size, lay, pos, last, sh); v != v_ok) return fail(v);
    const std::byte* pl = packet + pos;
    quant_segment en;
    en.payload = pos;
    en.numel = sh.numel;
    en.layer = sh.layer;
    en.encoding = sh.encoding;
    if (sh.encoding == raw_encoding) {
      if (const std::uint32_t v = check_raw_segment(sh); v != v_ok) return fail(v);
      en.raw = 1;
    } else if (family == quant_family::qsgd || family == quant_family::terngrad) {
      const auto enc = family == quant_family::qsgd ? quant_encoding::qsgd : quant_encoding::terngrad;
      if (sh.encoding != static_cast<std::uint8_t>(enc)) return fail(qv_encoding);
      if (sh.payload_bytes < quant_prefix_bytes) return fail(qv_prefix);
      std::uint32_t prefix[2];
      memcpy(prefix, pl, sizeof prefix);
      if (prefix[0] == 0 || prefix[0] > qsgd_max_levels) return fail(qv_levels);
      if (family == quant_family::terngrad && prefix[0] != 1) return fail(qv_ternary);
      if (prefix[1] % 64 != 0) return fail(qv_bucket);
      if (sh.index_width != 0) return fail(qv_indices);
      if (sh.count != sh.numel) return fail(qv_count);
      if (sh.payload_bytes != leveled_payload_bytes_dev(sh.numel, prefix[0], prefix[1])) return fail(qv_size);
      en.levels = prefix[0];
      en.bucket = prefix[1];
      en.width = static_cast<std::uint8_t>(code_width_dev(prefix[0]));
    } else if (family == quant_family::sign) {
      if (sh.encoding != static_cast<std::uint8_t>(quant_encoding::sign)) return fail(qv_encoding);
      if (sh.index_width != 0) return fail(qv_indices);
      if (sh.count != sh.numel) return fail(qv_count);
      if (sh.payload_bytes != sign_payload_bytes(sh.numel)) return fail(qv_size);
      float scale;
      std::uint32_t word1;
      memcpy(&scale, pl, 4);
      memcpy(&word1, pl + 4, 4);
      if (!valid_scale_dev(scale) || word1 != 0) return fail(qv_scale);
      en.width = 1;
    } else if (is_block_family(family)) {
      // block_codec::check: the shared checks, then the prefix (block size; the second word
      // zero for MX, NVFP4's per-layer scale usable).
      if (sh.encoding != block_encoding) return fail(qv_encoding);
      if (sh.index_width != 0) return fail(qv_indices);
      if (sh.count != sh.numel) return fail(qv_count);
      const bool nv = family == quant_family::nvfp4;
      const std::uint32_t block = nv ? static_cast<std::uint32_t>(nvfp4_block) : static_cast<std::uint32_t>(mx_block);
      const unsigned width = family == quant_family::mxfp8 ? 8u : 4u;
      if (sh.payload_bytes != block_scaled_payload_bytes(sh.numel, block, width)) return fail(qv_size);
      std::uint32_t prefix[2];
      memcpy(prefix, pl, sizeof prefix);
      if (prefix[0] != block) return fail(qv_block);
      if (!nv && prefix[1] != 0) return fail(qv_prefix_word);
      if (nv && !nvfp4_tensor_scale_ok_dev(__uint_as_float(prefix[1]))) return fail(qv_scale);
      en.bucket = block;
      en.width = static_cast<std::uint8_t>(width);
    } else {
      if (sh.encoding != static_cast<std::uint8_t>(quant_encoding::fp16) &&
          sh.encoding != static_cast<std::uint8_t>(quant_encoding::bf16))
        return fail(qv_encoding);
      if (sh.index_width != 0) return fail(qv_indices);
      if (sh.count != sh.numel) return fail(qv_count);
      if (sh.payload_bytes != half_payload_bytes(sh.numel)) return fail(qv_size);
      float mult;
      std::uint32_t word1;
      memcpy(&mult, pl, 4);
      memcpy(&word1, pl + 4, 4);
      if (!(valid_scale_dev(mult) && mult > 0.0f) || word1 != 0) return fail(qv_scale);
      en.width = 16;
    }
    table[s] = en;
    pos += sh.payload_bytes;
  }
  if (pos != size) return fail(v_trailing);
  *out = {v_ok, h.segment_count};
}

//! Bytes from a quantized payload's start to its codes.
__device__ __forceinline__ std::uint64_t code_offset(const quant_segment& en) {
  if (en.encoding == static_cast<std::uint8_t>(quant_encoding::qsgd) ||
      en.encoding == static_cast<std::uint8_t>(quant_encoding::terngrad))
    return quant_prefix_bytes + pad8(bucket_count(en.numel, en.bucket) * sizeof(float));
  if (is_block_encoding(en.encoding)) return quant_prefix_bytes + pad8(bucket_count(en.numel, en.bucket));
  return quant_prefix_bytes;
}

//! Checks the payload of every quantized segment the walk found: leveled scales finite and
//! non-negative, block scales in range (block_scale_invalid), every code valid (leveled:
//! level <= s and no sign on level 0; cast16: not infinite or NaN; FP8: not NaN or
//! infinite), every padding bit zero (the block scales' padding bytes too). Slot y of the grid takes segments y, y +
//! gridDim.y, ...; a failure is recorded once (atomicCAS on the verdict).
static __global__ void check_quantized_payloads(const std::byte* __restrict__ packet,
                                                const quant_segment* __restrict__ table,
                                                walk_result* __restrict__ out) {
  if (!block_sees_verdict_ok(&out->verdict)) return;
  const std::uint32_t segs = out->segments;
  const std::uint64_t step = static_cast<std::uint64_t>(gridDim.x) * blockDim.x;
  const std::uint64_t first = blockIdx.x * static_cast<std::uint64_t>(blockDim.x) + threadIdx.x;
  auto fail = [&](std::uint32_t v) { atomicCAS(&out->verdict, 0u, v); };
  for (std::uint32_t s = blockIdx.y; s < segs; s += gridDim.y) {
    const quant_segment en = table[s];
    if (en.raw) continue;
    const std::byte* pl = packet + en.payload;
    const bool leveled = en.encoding == static_cast<std::uint8_t>(quant_encoding::qsgd) ||
                         en.encoding == static_cast<std::uint8_t>(quant_encoding::terngrad);
    if (leveled) {
      const std::uint64_t nb = bucket_count(en.numel, en.bucket);
      const auto* scales = reinterpret_cast<const float*>(pl + quant_prefix_bytes);
      for (std::uint64_t b = first; b < nb; b += step)
        if (!valid_scale_dev(scales[b])) fail(qv_scale);
    }
    const bool block = is_block_encoding(en.encoding);
    if (block) {
      const std::uint64_t nb = bucket_count(en.numel, en.bucket);
      const auto* scales = reinterpret_cast<const std::uint8_t*>(pl + quant_prefix_bytes);
      for (std::uint64_t b = first; b < pad8(nb); b += step) {
        if (b >= nb) {
          if (scales[b] != 0) fail(qv_padding);
        } else if (block_scale_invalid(en.encoding, scales[b])) {
          fail(qv_scale);
        }
      }
    }
    const unsigned W = en.width;
    const unsigned per = 32 / W;
    const std::uint32_t mask = (1u << W) - 1u;  // W <= 16
    const std::uint32_t sign_bit = 1u << (W - 1);
    const std::uint16_t special = en.encoding == static_cast<std::uint8_t>(quant_encoding::bf16) ? 0x7f80u : 0x7c00u;
    const auto* words = reinterpret_cast<const std::uint32_t*>(pl + code_offset(en));
    const std::uint64_t word_count = pad8(detail::code_bytes(en.numel, W)) / 4;
    for (std::uint64_t w = first; w < word_count; w += step) {
      const std::uint32_t word = words[w];
      for (unsigned j = 0; j < per; ++j) {
        const std::uint32_t c = (word >> (j * W)) & mask;
        const std::uint64_t i = w * per + j;
        if (i >= en.numel) {
          if (c != 0) fail(qv_padding);
        } else if (leveled) {
          if ((c & (sign_bit - 1u)) > en.levels || c == sign_bit) fail(qv_code);
        } else if (W == 16) {
          if ((c & special) == special) fail(qv_special);
        } else if (block) {
          if (block_code_invalid(en.encoding, c)) fail(qv_code);
        }
      }
    }
  }
}

//! The decoded values of one quantized (not raw) segment of a validated packet: value i is
//! decompress(segment)[i], in the host decoders' arithmetic (scale * value(i) is what they
//! add: a sign applied to the bits commutes with the rounded product).
class quantized_values {
 public:
  //! The segment \p en, its payload at \p pl.
  __device__ quantized_values(const std::byte* pl, const quant_segment& en)
      : words_(reinterpret_cast<const std::uint32_t*>(pl + code_offset(en))),
        width_(en.width),
        per_(32u / en.width),
        mask_(en.width >= 32 ? ~0u : (1u << en.width) - 1u),
        encoding_(en.encoding) {
    const auto enc = static_cast<quant_encoding>(en.encoding);
    if (enc == quant_encoding::sign || enc == quant_encoding::fp16 || enc == quant_encoding::bf16) {
      memcpy(&factor_, pl, 4);  // sign: the scale; cast16: the multiplier N
    } else if (is_block_encoding(en.encoding)) {
      block_scales_ = reinterpret_cast<const std::uint8_t*>(pl + quant_prefix_bytes);
      std::uint32_t tb;
      memcpy(&tb, pl + 4, 4);
      factor_ = enc == quant_encoding::nvfp4 ? __uint_as_float(tb) : 0.0f;  // NVFP4's per-layer scale t
      bucket_ = en.bucket;
    } else {
      level_scales_ = reinterpret_cast<const float*>(pl + quant_prefix_bytes);
      bucket_ = en.bucket ? en.bucket : en.numel;
      factor_ = static_cast<float>(en.levels);
    }
  }

  //! decompress(segment)[i].
  __device__ float operator()(std::uint64_t i) const {
    const std::uint32_t c = (words_[i / per_] >> ((i % per_) * width_)) & mask_;
    switch (static_cast<quant_encoding>(encoding_)) {
      case quant_encoding::sign:
        return __uint_as_float(__float_as_uint(factor_) ^ (c << 31));
      case quant_encoding::fp16:
        return __fmul_rn(fp16_to_float_dev(c), factor_);
      case quant_encoding::bf16:
        return __fmul_rn(bf16_to_float_dev(c), factor_);
      case quant_encoding::qsgd:
      case quant_encoding::terngrad: {
        const float f = __fdiv_rn(level_scales_[i / bucket_], factor_);
        const float v = __fmul_rn(f, __int2float_rn(static_cast<std::int32_t>(c & (mask_ >> 1))));
        return __uint_as_float(__float_as_uint(v) ^ ((c >> (width_ - 1)) << 31));
      }
      default:
        return block_value_dev(encoding_, c, block_scales_[i / bucket_], factor_);
    }
  }

 private:
  const std::uint32_t* words_;
  unsigned width_, per_;
  std::uint32_t mask_;
  std::uint8_t encoding_;
  float factor_ = 0.0f;  // sign: the scale; cast16: N; block-scaled: t; leveled: the level count
  std::uint64_t bucket_ = 1;
  const float* level_scales_ = nullptr;
  const std::uint8_t* block_scales_ = nullptr;
};

//! out[layer offset + i] += scale * decompress(segment)[i] for every segment of a validated
//! packet, in the host decoders' arithmetic. Slot y of the grid takes segments y, y +
//! gridDim.y, ...
static __global__ void decode_quantized(const std::byte* __restrict__ packet, layout_desc lay,
                                        const quant_segment* __restrict__ table, const walk_result* __restrict__ walk,
                                        float* __restrict__ out, float scale) {
  if (walk->verdict != v_ok) return;
  const std::uint32_t segs = walk->segments;
  const std::uint64_t step = static_cast<std::uint64_t>(gridDim.x) * blockDim.x;
  const std::uint64_t first = blockIdx.x * static_cast<std::uint64_t>(blockDim.x) + threadIdx.x;
  for (std::uint32_t s = blockIdx.y; s < segs; s += gridDim.y) {
    const quant_segment en = table[s];
    const std::byte* pl = packet + en.payload;
    float* o = out + lay.offset[en.layer];
    const std::uint64_t n = en.numel;
    if (en.raw) {
      const auto* v = reinterpret_cast<const float*>(pl);
      for (std::uint64_t i = first; i < n; i += step) o[i] = __fadd_rn(o[i], __fmul_rn(scale, v[i]));
      continue;
    }
    const quantized_values value(pl, en);
    for (std::uint64_t i = first; i < n; i += step) o[i] = __fadd_rn(o[i], __fmul_rn(scale, value(i)));
  }
}

}  // namespace gravac::detail
