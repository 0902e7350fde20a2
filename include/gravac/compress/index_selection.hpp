#pragma once
//! \file index_selection.hpp
//! \brief The index-selection hook that allreduce_compatible (AR-Topk) needs: which
//! indices of a layer a summable compressor would keep, without writing a packet.
//!
//! The hook is the trait `index_selection<C>` with
//! - `shared_indices`: true when every rank can draw the indices itself (random-k's shared
//!   seed), so no indices travel; false when one rank chooses and broadcasts them;
//! - `select(c, u, layer_index, params, out, scratch)`: writes the kept indices of layer
//!   `layer_index` of `u` (the layer's slice of g + e) to `out`, ascending, exactly
//!   `kept_count(numel, params.kept_fraction[layer_index])` of them.
//!
//! It is specialised here for the library's summable compressors, so that their headers
//! (rewritten by the kernels work) stay untouched; a new compressor opts in either with a
//! specialisation or with members `static constexpr bool shared_indices` and
//! `select_indices(u, layer_index, params, out)`.

#include <algorithm>
#include <cmath>
#include <concepts>
#include <functional>
#include <cstddef>
#include <cstdint>
#include <numeric>
#include <span>
#include <vector>

#include "gravac/compress/identity.hpp"
#include "gravac/compress/randomk.hpp"
#include "gravac/compress/threshold.hpp"
#include "gravac/compress/topk.hpp"
#include "gravac/concepts.hpp"
#include "gravac/detail/random.hpp"
#include "gravac/compress/detail/select_topk_indices.hpp"

namespace gravac {

//! The index-selection hook of compressor \p C (see the file comment). The primary
//! template has no `select`: such a compressor cannot be used with allreduce_compatible.
template <class C>
struct index_selection {};

//! A compressor that provides `select_indices` as members opts in by itself.
template <class C>
  requires requires(const C& c, std::span<const float> u, std::size_t i, const step_params& p,
                    std::vector<std::uint64_t>& out) {
    { C::shared_indices } -> std::convertible_to<bool>;
    c.select_indices(u, i, p, out);
  }
struct index_selection<C> {
  //! As the compressor says.
  static constexpr bool shared_indices = C::shared_indices;
  //! Forwards to the member.
  static void select(const C& c, std::span<const float> u, std::size_t i, const step_params& p,
                     std::vector<std::uint64_t>& out, std::vector<std::uint64_t>&) {
    c.select_indices(u, i, p, out);
  }
};

//! Exact top-k: the index rank's k largest |u|, ties to the lower index (per layer; the
//! `whole_buffer` option does not apply to AR-Topk, which selects layer by layer).
template <>
struct index_selection<topk> {
  //! One rank chooses, the others receive the indices.
  static constexpr bool shared_indices = false;
  //! The exact per-layer top-k of \p u.
  static void select(const topk&, std::span<const float> u, std::size_t i, const step_params& p,
                     std::vector<std::uint64_t>& out, std::vector<std::uint64_t>& scratch) {
    detail::select_topk_indices(u, kept_count(u.size(), p.kept_fraction[i]), scratch, out);
  }
};

//! Threshold selection: AR-Topk needs the same count of indices on every rank without a
//! second exchange, so the index rank resolves its threshold to exactly k per layer: the
//! k largest |u|, ties to the lower index (threshold's own approximate count applies to
//! allgather, where every rank may send a different number).
template <>
struct index_selection<threshold> {
  //! One rank chooses, the others receive the indices.
  static constexpr bool shared_indices = false;
  //! The k largest |u| of layer \p i.
  static void select(const threshold&, std::span<const float> u, std::size_t i, const step_params& p,
                     std::vector<std::uint64_t>& out, std::vector<std::uint64_t>& scratch) {
    detail::select_topk_indices(u, kept_count(u.size(), p.kept_fraction[i]), scratch, out);
  }
};

//! Random-k: every rank draws the same indices from (seed, step, layer id). Values are
//! summed unscaled (the `rescale` option is for allgather; error feedback keeps the rest).
template <>
struct index_selection<randomk> {
  //! Every rank draws the indices itself.
  static constexpr bool shared_indices = true;
  //! The seeded indices of layer \p i.
  static void select(const randomk& c, std::span<const float>, std::size_t i, const step_params& p,
                     std::vector<std::uint64_t>& out, std::vector<std::uint64_t>&) {
    c.indices(i, p.seed, p.step, p.kept_fraction[i], out);
  }
};

//! Identity keeps everything: AR-Topk degenerates into a dense Allreduce.
template <>
struct index_selection<identity> {
  //! Every index, on every rank.
  static constexpr bool shared_indices = true;
  //! All indices of the layer.
  static void select(const identity&, std::span<const float> u, std::size_t, const step_params&,
                     std::vector<std::uint64_t>& out, std::vector<std::uint64_t>&) {
    out.resize(u.size());
    std::iota(out.begin(), out.end(), std::uint64_t{0});
  }
};

//! A summable compressor with an index-selection hook: what allreduce_compatible accepts.
template <class C>
concept IndexSelector =
    SummableCompressor<C> &&
    requires(const C& c, std::span<const float> u, std::size_t i, const step_params& p, std::vector<std::uint64_t>& v) {
      { index_selection<C>::shared_indices } -> std::convertible_to<bool>;
      index_selection<C>::select(c, u, i, p, v, v);
    };

static_assert(IndexSelector<topk> && IndexSelector<threshold> && IndexSelector<randomk> && IndexSelector<identity>);

}  // namespace gravac
