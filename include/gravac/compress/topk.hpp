#pragma once
//! \file topk.hpp
//! \brief Exact top-k with error feedback (reference implementation): the k entries of
//! largest |u|, ties to the lower index, per layer or over the whole buffer.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "gravac/compress/detail/layered.hpp"
#include "gravac/compress/sparse_packet.hpp"
#include "gravac/concepts.hpp"

namespace gravac {

namespace detail {
//! Orders indices by |u| descending, then index ascending: the deterministic top-k order.
struct by_magnitude_then_index {
  const float* u;
  bool operator()(std::uint64_t a, std::uint64_t b) const noexcept {
    const float ma = std::fabs(u[a]), mb = std::fabs(u[b]);
    return ma > mb || (ma == mb && a < b);
  }
};

//! Selects the exact top-k of \p u into \p selected (ascending indices); \p order is scratch.
inline void select_topk_reference(std::span<const float> u, std::size_t k, std::vector<std::uint64_t>& order,
                                  std::vector<std::uint64_t>& selected) {
  order.resize(u.size());
  for (std::size_t i = 0; i < u.size(); ++i) order[i] = i;
  selected.clear();
  if (k == 0) return;
  if (k < u.size())
    std::nth_element(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(k - 1), order.end(),
                     by_magnitude_then_index{u.data()});
  // nth_element leaves the k best before and at position k-1 (in some order).
  selected.assign(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(k));
  std::sort(selected.begin(), selected.end());
}
}  // namespace detail

//! Options of top-k.
struct topk_options {
  bool whole_buffer = false;  //!< select over the whole buffer (global k) instead of per layer
};

//! Exact top-k sparsification with error feedback. Models Compressor.
class topk {
 public:
  //! Opt-in tag for the Compressor concept.
  using compressor_tag = void;
  //! Works on host memory.
  using memory_space = host_space;
  //! Options (see topk_options).
  using options = topk_options;
  //! Values at shared indices can be summed elementwise.
  static constexpr bool summable_by_index = true;
  //! Packet kind written.
  static constexpr packet_kind kind = packet_kind::sparse;

  //! A compressor for \p lay.
  topk(const layout& lay, const options& opt = {}) : layout_(lay), options_(opt) {
    per_layer_selected_.resize(lay.size());
  }

  //! Upper bound of the packet size (every value kept, with indices).
  [[nodiscard]] std::size_t max_packet_bytes() const noexcept {
    std::size_t n = sizeof(packet_header);
    for (const auto& l : layout_.layers()) n += std::max(sparse_segment_bytes(l.numel, l.numel), raw_segment_bytes(l.numel));
    return n;
  }

  //! Keeps the top kept_fraction of each layer (or of the whole buffer); e = u - sent.
  std::size_t compress(host_view g, host_view e, const step_params& p, std::span<std::byte> out,
                       compress_stats& st) {
    if (options_.whole_buffer) select_whole_buffer(g.span(), e.span(), p);
    return detail::compress_layers(
        layout_, kind, g.span(), e.span(), p, out, st, scratch_,
        [&](byte_writer& w, std::uint32_t index, std::span<const float> gl, std::span<float> el, double fraction,
            layer_stats& ls) {
          u_.resize(gl.size());
          double gsq = 0, usq = 0;
          for (std::size_t i = 0; i < gl.size(); ++i) {
            u_[i] = gl[i] + el[i];
            gsq += static_cast<double>(gl[i]) * gl[i];
            usq += static_cast<double>(u_[i]) * u_[i];
          }
          auto& selected = per_layer_selected_[index];
          if (!options_.whole_buffer)
            detail::select_topk_reference(u_, kept_count(gl.size(), fraction), order_, selected);
          values_.resize(selected.size());
          double ksq = 0;
          for (std::size_t j = 0; j < selected.size(); ++j) {
            values_[j] = u_[selected[j]];
            ksq += static_cast<double>(values_[j]) * values_[j];
          }
          write_sparse_segment<std::uint64_t>(w, index, gl.size(), selected, values_);
          std::copy(u_.begin(), u_.end(), el.begin());
          for (auto ix : selected) el[ix] = 0.0f;
          ls = {selected.size(), gsq, usq, ksq};
        });
  }

  //! Validates an untrusted packet.
  [[nodiscard]] validation validate(std::span<const std::byte> packet) const {
    return detail::validate_layers(packet, layout_, kind, validate_sparse_segment);
  }
  //! Adds scale * the packet's values at their indices to \p out.
  void decompress_add(std::span<const std::byte> packet, host_view out, float scale) const {
    detail::decompress_layers(packet, layout_, out.span(), scale,
                              [](const segment_header& sh, std::span<const std::byte> payload, std::span<float> o,
                                 float s) { add_sparse_segment(sh, payload, o, s); });
  }

 private:
  // Global top-k over the compressed layers; the result is split into per-layer lists.
  void select_whole_buffer(std::span<const float> g, std::span<const float> e, const step_params& p) {
    u_.clear();
    offsets_.clear();
    for (std::size_t i = 0; i < layout_.size(); ++i) {
      const auto& l = layout_[i];
      offsets_.push_back(u_.size());
      if (p.kept_fraction[i] >= dense_fraction) continue;
      for (std::size_t j = 0; j < l.numel; ++j) u_.push_back(g[l.offset + j] + e[l.offset + j]);
    }
    detail::select_topk_reference(u_, kept_count(u_.size(), p.global_fraction), order_, global_selected_);
    for (auto& s : per_layer_selected_) s.clear();
    std::size_t layer = 0;
    for (auto gi : global_selected_) {
      while (layer + 1 < layout_.size() && gi >= offsets_[layer + 1]) ++layer;
      per_layer_selected_[layer].push_back(gi - offsets_[layer]);
    }
  }

  layout layout_;
  options options_;
  detail::layered_scratch scratch_;
  std::vector<float> u_;
  std::vector<float> values_;
  std::vector<std::uint64_t> order_;
  std::vector<std::uint64_t> global_selected_;
  std::vector<std::size_t> offsets_;
  std::vector<std::vector<std::uint64_t>> per_layer_selected_;
};
static_assert(Compressor<topk>);

}  // namespace gravac
