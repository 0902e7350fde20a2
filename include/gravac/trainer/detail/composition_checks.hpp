#pragma once
//! \file
//! \brief The trainer's compile-time checks, one static_assert per requirement, each with
//! a message that names what failed and what would work. They run before anything else of
//! the composition is instantiated, so the first error line is the cause. Each asserts a
//! requirement concept of concepts.hpp or collective_for.hpp, never its expression again.

#include "gravac/collective/collective_for.hpp"
#include "gravac/concepts/composition.hpp"
#include "gravac/concepts/concepts.hpp"

namespace gravac::detail {

//! One static_assert per requirement of the Compressor concept.
template <class C>
consteval bool check_compressor() {
  static_assert(compressor_opts_in<C>,
                "gravac::trainer: the compressor is not a gravac::Compressor: it has no opt-in member "
                "`using compressor_tag = void;` (see docs/concept_compressor.md)");
  static_assert(compressor_has_memory_space<C>,
                "gravac::trainer: Compressor requirement: a member type memory_space (gravac::host_space or "
                "gravac::cuda_space)");
  static_assert(compressor_has_options<C>, "gravac::trainer: Compressor requirement: a member type options");
  static_assert(compressor_constructible<C>,
                "gravac::trainer: Compressor requirement: a constructor C(const gravac::layout&, const C::options&)");
  static_assert(compressor_has_summable_by_index<C>,
                "gravac::trainer: Compressor requirement: static constexpr bool summable_by_index");
  static_assert(compressor_has_max_packet_bytes<C>,
                "gravac::trainer: Compressor requirement: std::size_t max_packet_bytes() const");
  static_assert(compressor_has_compress<C>,
                "gravac::trainer: Compressor requirement: std::size_t compress(grad_view g, grad_view e, const "
                "step_params&, std::span<std::byte> out, compress_stats&)");
  static_assert(compressor_has_validate<C>,
                "gravac::trainer: Compressor requirement: validation validate(std::span<const std::byte>) const");
  static_assert(compressor_has_decompress_add<C>,
                "gravac::trainer: Compressor requirement: void decompress_add(std::span<const std::byte>, grad_view, "
                "float scale)");
  return Compressor<C>;
}

//! The requirements of the Collective concept.
template <class K>
consteval bool check_collective() {
  static_assert(collective_opts_in<K>,
                "gravac::trainer: the collective is not a gravac::Collective: it has no opt-in member "
                "`using collective_tag = void;` (see docs/concept_collective.md)");
  static_assert(collective_has_options<K>, "gravac::trainer: Collective requirement: a member type options");
  return Collective<K>;
}

//! One static_assert per requirement of the Policy concept.
template <class P>
consteval bool check_policy() {
  static_assert(policy_opts_in<P>,
                "gravac::trainer: the policy is not a gravac::Policy: it has no opt-in member "
                "`using policy_tag = void;` (see docs/concept_policy.md)");
  static_assert(policy_has_options<P>, "gravac::trainer: Policy requirement: a member type options");
  static_assert(policy_constructible<P>,
                "gravac::trainer: Policy requirement: a constructor P(const gravac::layout&, const P::options&)");
  static_assert(policy_has_needs_statistics<P>,
                "gravac::trainer: Policy requirement: static constexpr bool needs_statistics");
  static_assert(policy_has_plan<P>, "gravac::trainer: Policy requirement: void plan(step_params&)");
  static_assert(policy_has_observe<P>, "gravac::trainer: Policy requirement: void observe(const step_report&)");
  static_assert(policy_has_on_interval<P>,
                "gravac::trainer: Policy requirement: void on_interval(const interval_info&)");
  static_assert(policy_has_save<P>, "gravac::trainer: Policy requirement: void save(std::vector<std::byte>&) const");
  static_assert(policy_has_load<P>, "gravac::trainer: Policy requirement: void load(std::span<const std::byte>)");
  return Policy<P>;
}

//! Whether collective \p K declares the requirement named by the member \p flag.
template <class K>
inline constexpr bool needs_index_selection_v = requires {
  requires K::needs_index_selection;
};
template <class K>
inline constexpr bool needs_low_rank_v = requires {
  requires K::needs_low_rank;
};
template <class K>
inline constexpr bool rejects_low_rank_v = requires {
  requires K::rejects_low_rank;
};

//! Why collective \p K refuses compressor \p C (composition_verdict's first half).
template <class C, class K>
consteval rejection why_refused() {
  if constexpr (K::template accepts<C>) {
    return rejection::none;
  } else if constexpr (needs_index_selection_v<K>) {
    // AR-Topk runs in host and device memory alike, given the hook's form for that memory: a
    // device compressor refused here lacks the device form (a host hook cannot read its u).
    if constexpr (!static_cast<bool>(C::summable_by_index))
      return rejection::not_summable;
    else if constexpr (!C::memory_space::host_accessible)
      return rejection::no_device_index_hook;
    else
      return rejection::no_index_hook;
  } else if constexpr (needs_low_rank_v<K> && !LowRankCompressor<C>) {
    return rejection::not_low_rank;
  } else if constexpr (rejects_low_rank_v<K> && LowRankCompressor<C>) {
    return rejection::low_rank_needs_allreduces;
  } else {
    return rejection::not_accepted;
  }
}

//! Why \p K cannot aggregate \p C, one readable assertion per cause, each naming the
//! collectives that can; a collective of the user's own gets the generic message.
template <class C, class K>
consteval bool check_accepts() {
  constexpr rejection r = why_refused<C, K>();
  static_assert(r != rejection::not_summable,
                "gravac::trainer: allreduce_compatible (AR-Topk) sums values at shared indices, and this compressor's "
                "values cannot be summed that way (it is not a SummableCompressor: quantizers, sign, cast16, "
                "PowerSGD, AdaComp); compose it with allgather, dense_allreduce or flexible");
  static_assert(r != rejection::no_index_hook,
                "gravac::trainer: allreduce_compatible needs an index-selection hook on this summable compressor "
                "(members shared_indices and select_indices, see compress/index_selection.hpp); or compose it "
                "with allgather or dense_allreduce");
  static_assert(r != rejection::no_device_index_hook,
                "gravac::trainer: allreduce_compatible (AR-Topk) on device memory needs the device form of the "
                "index-selection hook on this summable compressor (select_indices into device memory and "
                "finish_selection, as topk_cuda and threshold_cuda have; a host select_indices cannot read device "
                "memory, see compress/index_selection.hpp); or compose it with allgather or dense_allreduce");
  static_assert(r != rejection::not_low_rank,
                "gravac::trainer: low_rank_allreduce drives PowerSGD's project/factor/reconstruct protocol, and this "
                "compressor is not a LowRankCompressor; compose it with allgather, dense_allreduce or flexible");
  static_assert(r != rejection::low_rank_needs_allreduces,
                "gravac::trainer: a LowRankCompressor (PowerSGD) needs two dependent Allreduces (P, then Q), which "
                "allgather cannot run; compose it with low_rank_allreduce or dense_allreduce");
  static_assert(r != rejection::not_accepted,
                "gravac::trainer: this collective cannot aggregate this compressor's packets (K::accepts<C> is false)");
  return r == rejection::none;
}

//! The operations the trainer calls on collective \p K for compressor \p C (CollectiveFor),
//! one readable assertion each.
template <class C, class K>
consteval bool check_operations() {
  static_assert(collective_constructible<K>,
                "gravac::trainer: Collective requirement: a constructor K(const gravac::layout&, const K::options&)");
  static_assert(collective_has_prepare<K, C>,
                "gravac::trainer: Collective requirement: void prepare(C&) (sizes the workspaces from the compressor)");
  static_assert(
      collective_has_aggregate<K, C>,
      "gravac::trainer: Collective requirement: void aggregate(C&, Communicator&, step_buffers<space>&, const "
      "step_params&, compress_stats&, step_report&) (see docs/concept_collective.md)");
  return CollectiveFor<K, C>;
}

//! A policy whose every decision the compressor ignores is refused (composition.hpp).
template <class C, class P>
consteval bool check_decisions() {
  static_assert(decisions_reach_v<C, P>,
                "gravac::trainer: the policy's decisions would be ignored: the compressor acts on none of what the "
                "policy decides (composition.hpp: decides_v<P>, acts_on_v<C>; e.g. Accordion's or GraVAC's kept "
                "fraction with AdaComp or a quantizer). Pick a compressor that acts on them, or opt in with "
                "template <> inline constexpr bool gravac::allow_ignored_decisions<C, P> = true;");
  return decisions_reach_v<C, P>;
}

//! The verdict on trainer<C, K, P> for the library's own types, as the trainer's checks
//! decide it (the composition table of docs/compositions.md is generated from it).
template <class C, class K, class P>
consteval rejection composition_verdict() {
  constexpr rejection r = why_refused<C, K>();
  if constexpr (r != rejection::none)
    return r;
  else if constexpr (!decisions_reach_v<C, P>)
    return rejection::decisions_ignored;
  else
    return rejection::none;
}

//! Every check of trainer<C, K, P>, in order: each concept's requirements, then what the
//! collective accepts, then the policy's decisions. A failing concept stops the rest (they
//! would only add errors that follow from it).
template <class C, class K, class P>
consteval bool check_composition() {
  constexpr bool concepts = check_compressor<C>() && check_collective<K>() && check_policy<P>();
  if constexpr (concepts) {
    if constexpr (why_refused<C, K>() == rejection::none)
      return check_operations<C, K>() && check_decisions<C, P>();
    else
      return check_accepts<C, K>();
  } else {
    return false;
  }
}

//! The communicator's memory space is the compressor's; checked in the trainer's
//! constructor signature, before communicator_ref is instantiated.
template <class M, class C>
consteval bool check_communicator() {
  static_assert(Communicator<M>,
                "gravac::trainer: the communicator is not a gravac::Communicator (opt-in member "
                "`using communicator_tag = void;` and the collectives of docs/concept_communicator.md)");
  static_assert(!Communicator<M> || same_memory_space<M, C>,
                "gravac::trainer: the communicator's memory space differs from the compressor's (a device-memory "
                "compressor needs a communicator that accepts device memory: nccl_communicator)");
  return true;
}

}  // namespace gravac::detail
