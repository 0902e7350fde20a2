#pragma once
//! \file candidate_segment.hpp
//! \brief Writing the sparse segment of a layer from its selected candidates: values from
//! the candidate list (when the pass left them as zero in e) or from u held in e.

#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>

#include "gravac/compress/detail/candidate_select.hpp"
#include "gravac/core/detail/square_sum.hpp"
#include "gravac/packet/format.hpp"
#include "gravac/packet/sparse_packet.hpp"

namespace gravac::detail {

//! The header of a sparse segment of \p count values of layer \p index (\p numel elements).
[[nodiscard]] inline segment_header sparse_header(std::uint32_t index, std::size_t numel, std::size_t count) noexcept {
  segment_header sh;
  sh.layer = index;
  sh.index_width = index_width_for(numel);
  sh.numel = numel;
  sh.count = count;
  return sh;
}

//! Writes the sparse segment of layer \p index (\p numel elements) from the \p count
//! candidates of \p s at \p slot, values from the pass (after a pass that zeroed them in e:
//! the residual is already right, and e is not touched). Returns the energy sent (the
//! values in packet order, square_sum.hpp's tree).
inline double write_segment_from_candidates(byte_writer& w, candidate_slots s, std::uint32_t index, std::size_t numel,
                                            std::size_t slot, std::size_t count) {
  const segment_header sh = sparse_header(index, numel, count);
  double ksq = 0;
  const std::uint32_t* ip = s.idx + slot;
  const std::uint32_t* bp = s.bits + slot;
  write_segment(w, sh, [&](byte_writer& bw) {
    std::byte* id = bw.reserve(count * sizeof(std::uint32_t));
    std::byte* vd = bw.reserve(count * sizeof(float));
    std::memcpy(id, ip, count * sizeof(std::uint32_t));
    std::memcpy(vd, bp, count * sizeof(float));
    ksq = square_sum_of(count, [bp](std::size_t j) { return std::bit_cast<float>(bp[j]); });
  });
  return ksq;
}

//! Writes the sparse segment of layer \p index from the \p count selected indices of \p s
//! at \p slot, taking each value from u (held in e) and leaving zero in the residual.
//! Returns the energy sent (the values in packet order, square_sum.hpp's tree).
inline double write_segment_from(byte_writer& w, candidate_slots s, std::uint32_t index, std::span<float> e,
                                 std::size_t slot, std::size_t count) {
  const segment_header sh = sparse_header(index, e.size(), count);
  double ksq = 0;
  const std::uint32_t* ip = s.idx + slot;
  write_segment(w, sh, [&](byte_writer& bw) {
    std::byte* id = bw.reserve(count * sizeof(std::uint32_t));
    std::byte* vd = bw.reserve(count * sizeof(float));
    // The selected elements are scattered over a layer that left the cache during the
    // fused pass: prefetching 64 ahead overlaps their misses (3x faster at 2^24).
    constexpr std::size_t ahead = 64;
    for (std::size_t j = 0; j < count; ++j) {
      if (j + ahead < count) __builtin_prefetch(e.data() + ip[j + ahead], 1);
      const std::uint32_t ix = ip[j];
      const float v = e[ix];
      e[ix] = 0.0f;
      std::memcpy(id + j * sizeof(std::uint32_t), &ix, sizeof ix);
      std::memcpy(vd + j * sizeof(float), &v, sizeof v);
    }
    ksq = square_sum_bytes(vd, count);  // the values sent, in their packet order
  });
  return ksq;
}

}  // namespace gravac::detail
