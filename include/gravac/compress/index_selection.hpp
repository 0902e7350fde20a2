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
//! A compressor opts in with members `static constexpr bool shared_indices` and
//! `select_indices(u, layer_index, params, out)` (optionally with a trailing scratch
//! `std::vector<std::uint64_t>&` the collective keeps), as the library's summable
//! compressors do, or with a specialisation of index_selection. This header includes no
//! compressor: AR-Topk pulls in only the one it is composed with.

#include <algorithm>
#include <cmath>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <numeric>
#include <span>
#include <vector>

#include "gravac/concepts.hpp"
#include "gravac/detail/random.hpp"

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

//! The same with the collective's scratch buffer (sized once, reused every step) passed on:
//! `select_indices(u, layer_index, params, out, scratch)`.
template <class C>
requires requires(const C& c, std::span<const float> u, std::size_t i, const step_params& p,
                  std::vector<std::uint64_t>& out) {
  { C::shared_indices } -> std::convertible_to<bool>;
  c.select_indices(u, i, p, out, out);
}
struct index_selection<C> {
  //! As the compressor says.
  static constexpr bool shared_indices = C::shared_indices;
  //! Forwards to the member.
  static void select(const C& c, std::span<const float> u, std::size_t i, const step_params& p,
                     std::vector<std::uint64_t>& out, std::vector<std::uint64_t>& scratch) {
    c.select_indices(u, i, p, out, scratch);
  }
};

//! A summable compressor with an index-selection hook: what allreduce_compatible accepts.
template <class C>
concept IndexSelector = SummableCompressor<C> &&
    requires(const C& c, std::span<const float> u, std::size_t i, const step_params& p, std::vector<std::uint64_t>& v) {
  { index_selection<C>::shared_indices } -> std::convertible_to<bool>;
  index_selection<C>::select(c, u, i, p, v, v);
};

}  // namespace gravac
