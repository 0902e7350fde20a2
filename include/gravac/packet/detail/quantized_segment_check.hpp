#pragma once
//! \file
//! \brief Validation of a quantized segment's header and payload before anything is decoded.

#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>

#include "gravac/packet/quantized_packet.hpp"

namespace gravac::detail {

//! Checks what every quantized segment shares: its encoding, no indices, count == numel and
//! the payload size \p expected_payload. Run before any payload byte is interpreted.
inline validation check_quantized_segment(const segment_header& sh, std::span<const std::byte> payload,
                                          quant_encoding enc, std::size_t expected_payload) {
  if (sh.encoding != static_cast<std::uint8_t>(enc))
    return validation::fail("quantized segment: unexpected encoding " + std::to_string(sh.encoding));
  if (sh.index_width != 0) return validation::fail("quantized segment with indices");
  if (sh.count != sh.numel) return validation::fail("quantized segment: count differs from numel");
  if (payload.size() != expected_payload) return validation::fail("quantized segment: payload size wrong");
  return {};
}

//! A finite, non-negative float scale.
inline bool valid_scale(float s) noexcept { return std::isfinite(s) && s >= 0.0f; }

}  // namespace gravac::detail
