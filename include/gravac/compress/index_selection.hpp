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
//!
//! A device-memory compressor (topk_cuda, threshold_cuda) has the device form of the hook:
//! `shared_indices`, `select_indices(u, layer_index, params, out)` with `u` a
//! `grad_view<memory_space>` of the layer and `out` a device array of 32-bit indices (it
//! queues the selection on the compressor's stream, or lists it for finish_selection to
//! queue with the others, and writes exactly kept_count entries; u and out must stay valid
//! until finish_selection), and `finish_selection()` (waits for the selections; throws
//! gravac::error when one did not yield exactly its count). The trait then has `on_device = true`, `select` and
//! `finish`.

#include <algorithm>
#include <cmath>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <numeric>
#include <span>
#include <vector>

#include "gravac/concepts/concepts.hpp"
#include "gravac/core/detail/random.hpp"

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

//! The device form of the hook (see the file comment), from the compressor's members.
template <class C>
requires requires(C& c, grad_view<typename C::memory_space> u, std::size_t i, const step_params& p,
                  std::uint32_t* out) {
  requires !C::memory_space::host_accessible;
  { C::shared_indices } -> std::convertible_to<bool>;
  c.select_indices(u, i, p, out);
  c.finish_selection();
}
struct index_selection<C> {
  //! As the compressor says.
  static constexpr bool shared_indices = C::shared_indices;
  //! The indices are written to device memory, on the compressor's stream.
  static constexpr bool on_device = true;
  //! Queues the selection of layer \p i of \p u (its slice) into \p out (device memory).
  static void select(C& c, grad_view<typename C::memory_space> u, std::size_t i, const step_params& p,
                     std::uint32_t* out) {
    c.select_indices(u, i, p, out);
  }
  //! Waits for the queued selections; throws when one did not yield its count.
  static void finish(C& c) { c.finish_selection(); }
};

//! A summable compressor over host memory with the host form of the hook (a device-memory
//! compressor needs the device form: the host one would read device memory).
template <class C>
concept HostIndexSelector = SummableCompressor<C> && C::memory_space::host_accessible &&
    requires(const C& c, std::span<const float> u, std::size_t i, const step_params& p, std::vector<std::uint64_t>& v) {
  { index_selection<C>::shared_indices } -> std::convertible_to<bool>;
  index_selection<C>::select(c, u, i, p, v, v);
};

//! A summable compressor with the device form of the hook.
template <class C>
concept DeviceIndexSelector = SummableCompressor<C> &&
    requires(C& c, grad_view<typename C::memory_space> u, std::size_t i, const step_params& p, std::uint32_t* out) {
  { index_selection<C>::shared_indices } -> std::convertible_to<bool>;
  requires index_selection<C>::on_device;
  index_selection<C>::select(c, u, i, p, out);
  index_selection<C>::finish(c);
};

//! A summable compressor with an index-selection hook, of either form: what
//! allreduce_compatible accepts.
template <class C>
concept IndexSelector = HostIndexSelector<C> || DeviceIndexSelector<C>;

}  // namespace gravac
