#pragma once
//! \file
//! \brief The quantized segment (packet_kind::quantized) shared by QSGD, TernGrad, EF-sign,
//! cast16 and the block-scaled formats (MXFP8, MXFP4, NVFP4): one encoding byte per segment
//! says which quantizer wrote it.
//!
//! One segment kind, so every quantizer shares its sizes and header checks; each encoding's
//! prefix, scales and codes: docs/algorithms.md, "The quantized segment".

#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>

#include "gravac/packet/detail/bit_codes.hpp"
#include "gravac/packet/format.hpp"

namespace gravac {

//! Which quantizer wrote a quantized segment (segment_header::encoding).
enum class quant_encoding : std::uint8_t {
  qsgd = 1,          //!< QSGD: stochastic levels of |u| / ||u_bucket||
  terngrad = 2,      //!< TernGrad: scale * {-1, 0, 1}, stochastic
  sign = 3,          //!< EF-sign: sign bits and one scale
  fp16 = 4,          //!< IEEE half precision of u / N
  bf16 = 5,          //!< bfloat16 of u / N
  mxfp8_e4m3 = 6,    //!< MXFP8: FP8 E4M3 elements, one E8M0 scale per 32
  mxfp8_e5m2 = 7,    //!< MXFP8: FP8 E5M2 elements, one E8M0 scale per 32
  mxfp4 = 8,         //!< MXFP4: FP4 E2M1 elements, one E8M0 scale per 32
  nvfp4 = 9,         //!< NVFP4: FP4 E2M1 elements, one E4M3 scale per 16 and one float scale per layer
  fp8_rowwise = 10,  //!< FP8 E4M3 elements, one float scale per row (torchft's fp8 allreduce)
};

//! Bytes of the prefix every quantized payload starts with.
inline constexpr std::size_t quant_prefix_bytes = 8;

//! Largest level count QSGD accepts (codes are at most 16 bits, one of them the sign).
inline constexpr std::uint32_t qsgd_max_levels = 32767;

//! Code width in bits for \p levels stochastic levels: the smallest of 2, 4, 8, 16 that
//! holds a sign bit and the values 0..levels. Power-of-two widths keep codes inside 64-bit
//! words, so packing needs no carries across words.
constexpr unsigned code_width(std::uint32_t levels) noexcept {
  const unsigned bits = 1u + static_cast<unsigned>(std::bit_width(levels));
  return bits <= 2 ? 2u : bits <= 4 ? 4u : bits <= 8 ? 8u : 16u;
}

//! Number of buckets of \p bucket elements (0 = the whole layer) covering \p numel.
constexpr std::size_t bucket_count(std::size_t numel, std::size_t bucket) noexcept {
  if (numel == 0) return 0;
  return bucket == 0 ? 1 : (numel + bucket - 1) / bucket;
}

//! Payload bytes of a QSGD or TernGrad segment.
constexpr std::size_t leveled_payload_bytes(std::size_t numel, std::uint32_t levels, std::size_t bucket) noexcept {
  return quant_prefix_bytes + pad8(bucket_count(numel, bucket) * sizeof(float)) +
         pad8(detail::code_bytes(numel, code_width(levels)));
}

//! Payload bytes of an EF-sign segment.
constexpr std::size_t sign_payload_bytes(std::size_t numel) noexcept {
  return quant_prefix_bytes + pad8(detail::code_bytes(numel, 1));
}

//! Payload bytes of a cast16 segment.
constexpr std::size_t half_payload_bytes(std::size_t numel) noexcept { return quant_prefix_bytes + pad8(numel * 2); }

//! Elements per scale of the MX formats (OCP MX v1.0: k = 32).
inline constexpr std::size_t mx_block = 32;
//! Elements per E4M3 scale of NVFP4.
inline constexpr std::size_t nvfp4_block = 16;

//! Payload bytes of a block-scaled segment of \p numel elements: the prefix, one scale
//! byte per block of \p block elements, and \p code_bits (8 or 4) per element, each part
//! padded to 8 bytes.
constexpr std::size_t block_scaled_payload_bytes(std::size_t numel, std::size_t block, unsigned code_bits) noexcept {
  return quant_prefix_bytes + pad8(bucket_count(numel, block)) + pad8(detail::code_bytes(numel, code_bits));
}

//! Payload bytes of an fp8_rowwise segment of \p numel elements in rows of \p row: the
//! prefix, one float scale per row and one byte per element, each part padded to 8 bytes.
constexpr std::size_t rowwise_payload_bytes(std::size_t numel, std::size_t row) noexcept {
  return quant_prefix_bytes + pad8(bucket_count(numel, row) * sizeof(float)) + pad8(numel);
}

}  // namespace gravac
