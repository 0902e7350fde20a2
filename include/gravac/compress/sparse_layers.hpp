#pragma once
//! \file
//! \brief sparse_layers: the public base of the host sparsifiers (top-k, threshold, a
//! user's own, docs/custom_sparse_compressor.md): packets of sparse segments over the
//! layered skeleton (validation, decoding, the packet bound) and AR-Topk's exact-k index
//! selection at the index rank.

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "gravac/compress/detail/select_topk_indices.hpp"
#include "gravac/compress/layered.hpp"
#include "gravac/core/layout.hpp"
#include "gravac/core/memory.hpp"
#include "gravac/core/step.hpp"
#include "gravac/packet/packet_bound.hpp"
#include "gravac/packet/sparse_packet.hpp"

namespace gravac {

//! The base of the host sparsifiers: their layout, and every member that depends only on
//! their packets being sparse segments.
class sparse_layers {
 public:
  //! Packet kind written.
  static constexpr packet_kind kind = packet_kind::sparse;

  //! Upper bound of the packet size of compress(): every layer at its largest sparse or raw
  //! segment.
  [[nodiscard]] std::size_t max_packet_bytes() const noexcept {
    return packet_bytes_bound(layout_,
                              [](std::size_t, const layer& l) { return sparse_segment_bytes(l.numel, l.numel); });
  }

  //! AR-Topk's index selection (compress/index_selection.hpp): one rank chooses the indices
  //! and broadcasts them.
  static constexpr bool shared_indices = false;
  //! The kept indices of layer \p i of u (its slice \p u), ascending: exactly the k largest
  //! |u|, ties to the lower index, per layer. AR-Topk needs the same count on every rank
  //! without a second exchange, so threshold's approximate count (which allgather allows)
  //! and top-k's whole_buffer option do not apply here.
  void select_indices(std::span<const float> u, std::size_t i, const step_params& p, std::vector<std::uint64_t>& out,
                      std::vector<std::uint64_t>& scratch) const {
    detail::select_topk_indices(u, kept_count(u.size(), p.kept_fraction[i]), scratch, out);
  }

  //! Validates an untrusted packet.
  [[nodiscard]] validation validate(std::span<const std::byte> packet) const {
    return validate_layers(packet, layout_, kind, validate_sparse_segment);
  }
  //! Adds scale * the packet's values at their indices to \p out.
  void decompress_add(std::span<const std::byte> packet, host_view out, float scale) const {
    decompress_layers(packet, layout_, out.span(), scale,
                      [](const segment_header& sh, std::span<const std::byte> payload, std::span<float> o, float s) {
                        add_sparse_segment(sh, payload, o, s);
                      });
  }

 protected:
  //! For the layers of \p lay.
  explicit sparse_layers(const layout& lay) : layout_(lay) {}

  layout layout_;  //!< the layers compressed
};

}  // namespace gravac
