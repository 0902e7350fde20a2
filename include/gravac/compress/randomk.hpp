#pragma once
//! \file randomk.hpp
//! \brief Random-k with error feedback: k indices drawn from a seed shared by all ranks,
//! so no indices travel and the values of all ranks can be summed.

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "gravac/compress/detail/sample_indices.hpp"
#include "gravac/compress/index_selection.hpp"
#include "gravac/compress/layered.hpp"
#include "gravac/concepts/concepts.hpp"
#include "gravac/core/detail/random.hpp"
#include "gravac/packet/packet_bound.hpp"

namespace gravac {

//! Options of random-k.
struct randomk_options {
  //! Scale sent values by numel / k so that C(u) is an unbiased estimate of u.
  //! Off by default: with error feedback the residual carries what was not sent.
  bool rescale = false;
};

//! Random-k sparsification. Models Compressor.
//!
//! Packet segment: 16 bytes (seed, step) then `count` float values; the receiver redraws
//! the indices from the layer id, seed and step.
class randomk {
 public:
  //! Opt-in tag for the Compressor concept.
  using compressor_tag = void;
  //! Works on host memory.
  using memory_space = host_space;
  //! Options (see randomk_options).
  using options = randomk_options;
  //! All ranks share the indices, so values can be summed.
  static constexpr bool summable_by_index = true;
  //! Packet kind written.
  static constexpr packet_kind kind = packet_kind::seeded;

  //! A compressor for \p lay.
  randomk(const layout& lay, const options& opt = {}) : layout_(lay), options_(opt) {}

  //! Upper bound of the packet size.
  [[nodiscard]] std::size_t max_packet_bytes() const noexcept {
    // A value segment holds at most every value, plus its 16 bytes of draw parameters.
    return packet_bytes_bound(layout_, [](std::size_t, const layer& l) { return raw_segment_bytes(l.numel) + 16; });
  }

  //! Keeps kept_fraction of each layer at indices drawn from (seed, step, layer id).
  std::size_t compress(host_view g, host_view e, const step_params& p, std::span<std::byte> out, compress_stats& st) {
    return compress_layers(layout_, kind, g.span(), e.span(), p, out, st, scratch_,
                           [&](byte_writer& w, std::uint32_t index, std::span<const float> gl, std::span<float> el,
                               double fraction, layer_stats& ls) {
                             const std::size_t n = gl.size();
                             const std::size_t k = kept_count(n, fraction);
                             detail::sample_indices(n, k, stream_seed(index, p.seed, p.step), indices_);
                             const float scale =
                                 options_.rescale && k > 0 ? static_cast<float>(static_cast<double>(n) / k) : 1.0f;
                             double gsq = 0, usq = 0, ksq = 0;
                             for (std::size_t i = 0; i < n; ++i) {
                               gsq += static_cast<double>(gl[i]) * gl[i];
                               el[i] += gl[i];
                               usq += static_cast<double>(el[i]) * el[i];
                             }
                             values_.resize(k);
                             for (std::size_t j = 0; j < k; ++j) {
                               const float u = el[indices_[j]];
                               values_[j] = scale * u;
                               ksq += static_cast<double>(values_[j]) * values_[j];
                               el[indices_[j]] = u - values_[j];
                             }
                             segment_header sh;
                             sh.layer = index;
                             sh.numel = n;
                             sh.count = k;
                             write_segment(w, sh, [&](byte_writer& bw) {
                               bw.put(p.seed);
                               bw.put(p.step);
                               bw.put_array<float>(values_);
                             });
                             ls = {k, gsq, usq, ksq};
                           });
  }

  //! AR-Topk's index selection (compress/index_selection.hpp): every rank draws the same
  //! indices from (seed, step, layer id), so none travel. Values are summed unscaled (the
  //! `rescale` option is for allgather; error feedback keeps the rest).
  static constexpr bool shared_indices = true;
  //! The seeded indices of layer \p i.
  void select_indices(std::span<const float>, std::size_t i, const step_params& p,
                      std::vector<std::uint64_t>& out) const {
    indices(i, p.seed, p.step, p.kept_fraction[i], out);
  }

  //! Validates an untrusted packet.
  [[nodiscard]] validation validate(std::span<const std::byte> packet) const {
    return validate_layers(packet, layout_, kind, [](const segment_header& sh, std::span<const std::byte> pl) {
      if (sh.encoding != 0) return validation::fail("random-k segment: unknown encoding");
      if (sh.index_width != 0) return validation::fail("random-k segment with indices");
      if (sh.count > sh.numel) return validation::fail("random-k segment: count exceeds numel");
      if (pl.size() != 16 + pad8(sh.count * sizeof(float)))
        return validation::fail("random-k segment: payload size does not match count");
      return validation{};
    });
  }
  //! Adds scale * the packet's values at the redrawn indices to \p out.
  void decompress_add(std::span<const std::byte> packet, host_view out, float scale) const {
    decompress_layers(packet, layout_, out.span(), scale,
                      [&](const segment_header& sh, std::span<const std::byte> pl, std::span<float> o, float s) {
                        const auto seed = load_at<std::uint64_t>(pl, 0);
                        const auto step = load_at<std::uint64_t>(pl, 1);
                        detail::sample_indices(sh.numel, sh.count, stream_seed(sh.layer, seed, step), decode_indices_);
                        const auto values = pl.subspan(16);
                        for (std::size_t j = 0; j < sh.count; ++j)
                          o[decode_indices_[j]] += s * load_at<float>(values, j);
                      });
  }

  //! The indices random-k keeps of layer \p index at (seed, step): what every rank draws.
  void indices(std::size_t index, std::uint64_t seed, std::uint64_t step, double fraction,
               std::vector<std::uint64_t>& out) const {
    const auto& l = layout_[index];
    detail::sample_indices(l.numel, kept_count(l.numel, fraction), stream_seed(index, seed, step), out);
  }

 private:
  std::uint64_t stream_seed(std::size_t index, std::uint64_t seed, std::uint64_t step) const noexcept {
    return detail::mix_seed(seed, step, layout_[index].id);
  }

  layout layout_;
  options options_;
  layered_scratch scratch_;
  std::vector<std::uint64_t> indices_;
  std::vector<float> values_;
  mutable std::vector<std::uint64_t> decode_indices_;
};
static_assert(Compressor<randomk>);
static_assert(IndexSelector<randomk>);

}  // namespace gravac
