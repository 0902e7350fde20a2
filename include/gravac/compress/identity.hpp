#pragma once
//! \file identity.hpp
//! \brief The dense "compressor": sends u = g + e whole (e is then zero). The baseline
//! every other compressor is measured against.

#include <cstddef>
#include <cstdint>
#include <numeric>
#include <span>
#include <vector>

#include "gravac/compress/index_selection.hpp"
#include "gravac/compress/layered.hpp"
#include "gravac/concepts/composition.hpp"
#include "gravac/concepts/concepts.hpp"

namespace gravac {

//! identity has no options.
struct identity_options {};

//! Sends every layer uncompressed. Models Compressor.
class identity {
 public:
  //! Opt-in tag for the Compressor concept.
  using compressor_tag = void;
  //! What it acts on (composition.hpp): nothing but "kept fraction 1 = raw"; it sends everything.
  static constexpr decision acts_on = decision::none;
  //! Works on host memory.
  using memory_space = host_space;
  //! Options (see identity_options).
  using options = identity_options;
  //! Dense values can be summed elementwise.
  static constexpr bool summable_by_index = true;
  //! Packet kind written.
  static constexpr packet_kind kind = packet_kind::dense;

  //! A compressor for \p lay.
  identity(const layout& lay, const options& = {}) : layout_(lay) {
    dense_params_.kept_fraction.assign(lay.size(), dense_fraction);
  }

  //! Upper bound of the packet size.
  [[nodiscard]] std::size_t max_packet_bytes() const noexcept { return raw_packet_bytes(layout_); }

  //! Writes u = g + e for every layer and zeroes e; the kept fractions are ignored.
  std::size_t compress(host_view g, host_view e, const step_params& p, std::span<std::byte> out, compress_stats& st) {
    // identity sends every layer dense whatever the policy says
    dense_params_.step = p.step;
    dense_params_.seed = p.seed;
    dense_params_.gain_candidates = p.gain_candidates;
    return compress_layers(layout_, kind, g.span(), e.span(), dense_params_, out, st, scratch_, [](auto&&...) {});
  }
  //! AR-Topk's index selection (compress/index_selection.hpp): identity keeps every index,
  //! on every rank, so AR-Topk degenerates into a dense Allreduce.
  static constexpr bool shared_indices = true;
  //! All indices of the layer.
  void select_indices(std::span<const float> u, std::size_t, const step_params&,
                      std::vector<std::uint64_t>& out) const {
    out.resize(u.size());
    std::iota(out.begin(), out.end(), std::uint64_t{0});
  }

  //! Validates an untrusted packet.
  [[nodiscard]] validation validate(std::span<const std::byte> packet) const {
    return validate_layers(packet, layout_, kind, [](const segment_header&, std::span<const std::byte>) {
      return validation::fail("dense packet with a non-raw segment");
    });
  }
  //! Adds scale * the packet's values to \p out.
  void decompress_add(std::span<const std::byte> packet, host_view out, float scale) const {
    decompress_layers(packet, layout_, out.span(), scale, [](auto&&...) {});
  }

 private:
  layout layout_;
  step_params dense_params_;
  layered_scratch scratch_;
};
static_assert(Compressor<identity>);
static_assert(IndexSelector<identity>);

}  // namespace gravac
