#pragma once
//! \file
//! \brief The packet-size bound of a per-layer compressor, written once: the packet header
//! plus, for every layer, the larger of its compressed segment and the raw segment the
//! skeleton writes when the layer is sent dense. Every compressor's max_packet_bytes()
//! is this bound with its own segment size.

#include <algorithm>
#include <cstddef>

#include "gravac/core/layout.hpp"
#include "gravac/packet/format.hpp"
#include "gravac/packet/raw_segment.hpp"

namespace gravac {

//! Upper bound of the size of a packet over \p lay: `sizeof(packet_header)` plus, per layer
//! i, `max(segment_bytes(i, lay[i]), raw_segment_bytes(lay[i].numel))`. \p segment_bytes
//! returns the largest compressed segment of the layer, its segment header included (0 for
//! a compressor that sends the layer only raw).
template <class SegmentBytes>
[[nodiscard]] std::size_t packet_bytes_bound(const layout& lay, SegmentBytes&& segment_bytes) {
  std::size_t n = sizeof(packet_header);
  for (std::size_t i = 0; i < lay.size(); ++i)
    n += std::max<std::size_t>(segment_bytes(i, lay[i]), raw_segment_bytes(lay[i].numel));
  return n;
}

}  // namespace gravac
