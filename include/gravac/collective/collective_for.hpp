#pragma once
//! \file
//! \brief CollectiveFor<K, C>: collective \p K can run the trainer's step for compressor
//! \p C. The Collective concept (concepts.hpp) is the opt-in; this one checks the
//! operations the trainer calls, with the buffers and communicator of C's memory space.

#include <concepts>

#include "gravac/collective/step_buffers.hpp"
#include "gravac/comm/communicator_ref.hpp"
#include "gravac/concepts/concepts.hpp"
#include "gravac/core/layout.hpp"
#include "gravac/core/step.hpp"

namespace gravac {

//! The operations of CollectiveFor, one concept each (the trainer's checks name the one
//! that failed, trainer/detail/composition_checks.hpp).
namespace detail {

//! `K(const layout&, const K::options&)`.
template <class K>
concept collective_constructible = std::constructible_from<K, const layout&, const typename K::options&>;
//! `prepare(C&)`.
template <class K, class C>
concept collective_has_prepare = requires(K& k, C& c) {
  k.prepare(c);
};
//! `aggregate(C&, communicator_ref<space>&, step_buffers<space>&, const step_params&, compress_stats&, step_report&)`.
template <class K, class C>
concept collective_has_aggregate = requires(K& k, C& c, communicator_ref<typename C::memory_space>& m,
                                            step_buffers<typename C::memory_space>& b, const step_params& p,
                                            compress_stats& st, step_report& r) {
  k.aggregate(c, m, b, p, st, r);
};

}  // namespace detail

//! \p K aggregates \p C's packets and offers every operation the trainer calls:
//! - a constructor `K(const layout&, const K::options&)` (it validates the options);
//! - `prepare(c)`: sizes the workspaces once, from the compressor;
//! - `aggregate(c, comm, buf, params, stats, report)`: one step over
//!   communicator_ref<space> (compress, communicate, validate, decompress, average).
template <class K, class C>
concept CollectiveFor = CollectiveAccepts<K, C> && detail::collective_constructible<K> &&
    detail::collective_has_prepare<K, C> && detail::collective_has_aggregate<K, C>;

//! \p K can give this rank's packet back to its residual after its collective
//! (`return_sent(c, buf)`), so the trainer can abandon a step without losing a value
//! (optional: a collective without it has sent nothing a later step would miss).
template <class K, class C>
concept ReturnsSent = requires(K& k, C& c, step_buffers<typename C::memory_space>& b) {
  k.return_sent(c, b);
};

}  // namespace gravac
