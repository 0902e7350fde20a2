#pragma once
//! \file
//! \brief The four concepts that compose at compile time (Compressor, Collective,
//! Communicator, Policy) and the compatibility concepts between them.
//!
//! A model opts in with a member tag (`compressor_tag`, `collective_tag`,
//! `communicator_tag`, `policy_tag`) and satisfies the structural requirements below.
//! Each model has `static_assert(Concept<model>)` beside its definition.

#include <concepts>
#include <cstddef>
#include <span>
#include <vector>

#include "gravac/core/layout.hpp"
#include "gravac/core/memory.hpp"
#include "gravac/core/step.hpp"
#include "gravac/packet/format.hpp"

namespace gravac {

//! The requirements of the Compressor, Collective and Policy concepts, one concept each, so
//! that the trainer's checks (trainer/detail/composition_checks.hpp) name the one that failed.
namespace detail {

//! Opts in to Compressor.
template <class C>
concept compressor_opts_in = requires {
  typename C::compressor_tag;
};
//! The memory space the compressor's gradients live in.
template <class C>
concept compressor_has_memory_space = requires {
  typename C::memory_space;
};
//! The compressor's options struct.
template <class C>
concept compressor_has_options = requires {
  typename C::options;
};
//! `C(const layout&, const C::options&)`.
template <class C>
concept compressor_constructible = std::constructible_from<C, const layout&, const typename C::options&>;
//! `static constexpr bool summable_by_index`.
template <class C>
concept compressor_has_summable_by_index = requires {
  { C::summable_by_index } -> std::convertible_to<bool>;
};
//! `std::size_t max_packet_bytes() const`.
template <class C>
concept compressor_has_max_packet_bytes = requires(const C& c) {
  { c.max_packet_bytes() } -> std::same_as<std::size_t>;
};
//! `std::size_t compress(grad_view g, grad_view e, const step_params&, std::span<std::byte>, compress_stats&)`.
template <class C>
concept compressor_has_compress = requires(C& c, grad_view<typename C::memory_space> v, const step_params& p,
                                           std::span<std::byte> out, compress_stats& st) {
  { c.compress(v, v, p, out, st) } -> std::same_as<std::size_t>;
};
//! `validation validate(std::span<const std::byte>) const`.
template <class C>
concept compressor_has_validate = requires(const C& c, std::span<const std::byte> in) {
  { c.validate(in) } -> std::same_as<validation>;
};
//! `decompress_add(std::span<const std::byte>, grad_view, float scale)`.
template <class C>
concept compressor_has_decompress_add = requires(C& c, std::span<const std::byte> in,
                                                 grad_view<typename C::memory_space> v, float scale) {
  c.decompress_add(in, v, scale);
};

//! Opts in to Collective.
template <class K>
concept collective_opts_in = requires {
  typename K::collective_tag;
};
//! The collective's options struct.
template <class K>
concept collective_has_options = requires {
  typename K::options;
};

//! Opts in to Policy.
template <class P>
concept policy_opts_in = requires {
  typename P::policy_tag;
};
//! The policy's options struct.
template <class P>
concept policy_has_options = requires {
  typename P::options;
};
//! `P(const layout&, const P::options&)`.
template <class P>
concept policy_constructible = std::constructible_from<P, const layout&, const typename P::options&>;
//! `static constexpr bool needs_statistics`.
template <class P>
concept policy_has_needs_statistics = requires {
  { P::needs_statistics } -> std::convertible_to<bool>;
};
//! `plan(step_params&)`.
template <class P>
concept policy_has_plan = requires(P& p, step_params& sp) {
  p.plan(sp);
};
//! `observe(const step_report&)`.
template <class P>
concept policy_has_observe = requires(P& p, const step_report& r) {
  p.observe(r);
};
//! `on_interval(const interval_info&)`.
template <class P>
concept policy_has_on_interval = requires(P& p, const interval_info& iv) {
  p.on_interval(iv);
};
//! `save(std::vector<std::byte>&) const`.
template <class P>
concept policy_has_save = requires(const P& p, std::vector<std::byte>& out) {
  p.save(out);
};
//! `load(std::span<const std::byte>)`.
template <class P>
concept policy_has_load = requires(P& p, std::span<const std::byte> in) {
  p.load(in);
};

//! Communicator \p M carries data of the memory space of compressor \p C.
template <class M, class C>
concept same_memory_space = std::same_as<typename M::memory_space, typename C::memory_space>;

}  // namespace detail

//! A transport engine: ranks, reductions, variable-length allgather, broadcast, barrier.
//!
//! Float spans live in `memory_space`; double spans (statistics) are always host memory.
//! `byte_buffer` is the growable buffer type allgatherv writes into (std::vector<std::byte>
//! for host engines).
template <class M>
concept Communicator = requires {
  typename M::communicator_tag;
  typename M::memory_space;
  typename M::byte_buffer;
}
&&requires(M& m, const M& cm, std::span<float> f, std::span<double> d, std::span<std::byte> b,
           std::span<const std::byte> in, typename M::byte_buffer& out, std::vector<std::size_t>& sizes, int root) {
  { cm.rank() } -> std::same_as<int>;
  { cm.size() } -> std::same_as<int>;
  m.allreduce_sum(f);
  m.allreduce_sum(d);
  m.allreduce_max(d);
  m.allgatherv(in, out, sizes);
  m.broadcast(b, root);
  m.barrier();
};

//! A Communicator with a personalised all-to-all of variable-length blocks:
//! `alltoallv(send, send_sizes, out, recv_sizes)` sends block j of \p send (send_sizes[j]
//! bytes, blocks back to back in rank order) to rank j, and fills \p out with the blocks
//! addressed to this rank, back to back in source-rank order (recv_sizes[i] bytes from
//! rank i). The compressed allreduce's reduce-scatter needs it; other collectives do not,
//! so it is not part of Communicator.
template <class M>
concept AlltoallCommunicator = Communicator<M> &&
    requires(M& m, std::span<const std::byte> in, std::span<const std::size_t> send_sizes, typename M::byte_buffer& out,
             std::vector<std::size_t>& recv_sizes) {
  m.alltoallv(in, send_sizes, out, recv_sizes);
};

//! Turns `u = g + e` into a packet and back, updating the residual `e` (error feedback).
//!
//! - `compress(g, e, params, out, stats)` computes u = g + e, writes the packet into
//!   `out` (at most `max_packet_bytes()` bytes), sets e = u - decompress(packet) and
//!   returns the packet size.
//! - `validate(packet)` checks an untrusted packet completely without touching memory
//!   outside it; `decompress_add(packet, out, scale)` adds scale * decompress(packet)
//!   to `out` and must only be called on a validated packet.
//! - `summable_by_index` says whether values at shared indices can be summed across
//!   ranks (top-k, threshold, random-k), which allreduce_compatible needs.
template <class C>
concept Compressor =
    detail::compressor_opts_in<C> && detail::compressor_has_memory_space<C> && detail::compressor_has_options<C> &&
    detail::compressor_constructible<C> && detail::compressor_has_summable_by_index<C> &&
    detail::compressor_has_max_packet_bytes<C> && detail::compressor_has_compress<C> &&
    detail::compressor_has_validate<C> && detail::compressor_has_decompress_add<C>;

//! How compressed gradients from all ranks become one averaged gradient.
//! `K::accepts<C>` says which compressors it can aggregate.
template <class K>
concept Collective = detail::collective_opts_in<K> && detail::collective_has_options<K>;

//! Reads step statistics and decides the next step's parameters, identically on every rank.
//!
//! - `plan(params)` fills the kept fractions, collective hint and gain candidates for
//!   step `params.step`; it must depend only on what all ranks share.
//! - `observe(report)` sees the step's report; when `needs_statistics` is true the
//!   trainer averages norms, gains and kept fractions over the ranks first, and hands the
//!   ranks' average of the previous step's times (step_report::previous_times). All of it
//!   rides in the step's own gradient collective: a policy never costs a collective.
//! - `on_interval(info)` marks the end of an epoch or of every F steps.
//! - `save(bytes)` / `load(bytes)` carry the policy's state through a checkpoint; it must
//!   be the same on every rank (checkpoints compare it).
//!
//! Optional members, found by the trainer with `requires`:
//! - `accumulate(std::span<const float> local_grad, std::size_t first_layer, std::size_t
//!   last_layer)`: this rank's whole flat gradient (host memory, layout order), once per
//!   bucket before its aggregation, of which the layers [first_layer, last_layer) are the
//!   bucket's, e.g. Accordion's summed gradient. A policy with only the one-argument form
//!   is refused at compile time; on device memory the trainer does not call it.
//! - `agreement_request()` -> `std::span<const double>` and `agreed(std::span<const double>
//!   sums)`: values this rank contributes, summed over the ranks in the step's own
//!   collective and handed back after it (before observe), e.g. norms at a decision.
//! - `save_local(bytes)` / `load_local(bytes)`: rank-local state (not compared across
//!   ranks), stored in each rank's checkpoint beside its residual.
template <class P>
concept Policy = detail::policy_opts_in<P> && detail::policy_has_options<P> && detail::policy_constructible<P> &&
    detail::policy_has_needs_statistics<P> && detail::policy_has_plan<P> && detail::policy_has_observe<P> &&
    detail::policy_has_on_interval<P> && detail::policy_has_save<P> && detail::policy_has_load<P>;

//! Compressor \p C and collective \p K can be composed.
template <class K, class C>
concept CollectiveAccepts = Collective<K> && Compressor<C> && K::template accepts<C>;

//! Communicator \p M carries data of compressor \p C's memory space.
template <class M, class C>
concept CommunicatorFor = Communicator<M> && Compressor<C> && detail::same_memory_space<M, C>;

//! Compressors whose packets can be summed elementwise once indices are shared.
template <class C>
concept SummableCompressor = Compressor<C> && static_cast<bool>(C::summable_by_index);

//! Compressors aggregated by two dependent allreduces (PowerSGD: P, then Q), which a
//! compress-then-gather collective cannot run. They opt in with `low_rank_tag` and provide
//! the phases a low-rank collective drives: `project(g, e, params, stats)` returns the
//! floats to sum first, `factor(e, params, stats)` the floats to sum second, and
//! `reconstruct(out, scale)` writes scale * the aggregate (see collective/low_rank_allreduce.hpp).
template <class C>
concept LowRankCompressor = Compressor<C> && requires {
  typename C::low_rank_tag;
} && requires(C& c, grad_view<typename C::memory_space> v, const step_params& p, compress_stats& st, float s) {
  { c.project(v, v, p, st) } -> std::same_as<std::span<float>>;
  { c.factor(v, p, st) } -> std::same_as<std::span<float>>;
  c.reconstruct(v, s);
};

}  // namespace gravac
