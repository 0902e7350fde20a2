#pragma once
// The collectives and policies a compressor can be composed with, for tests that cover
// every valid compressor x collective x policy combination.

#include "gravac/collective/allgather.hpp"
#include "gravac/collective/allreduce_compatible.hpp"
#include "gravac/collective/dense_allreduce.hpp"
#include "gravac/collective/flexible.hpp"
#include "gravac/collective/low_rank_allreduce.hpp"
#include "gravac/composition.hpp"
#include "gravac/policy/accordion_policy.hpp"
#include "gravac/policy/adacomp_policy.hpp"
#include "gravac/policy/fixed_policy.hpp"
#include "gravac/policy/gravac_policy.hpp"
#include "gravac/policy/moo_policy.hpp"

namespace gravac::test {

//! Calls \p f.template operator()<K>() for every built-in collective K that accepts C.
template <class C, class F>
void for_each_collective_accepting(F&& f) {
  const auto one = [&]<class K>() {
    if constexpr (K::template accepts<C>) f.template operator()<K>();
  };
  one.template operator()<dense_allreduce>();
  one.template operator()<allgather>();
  one.template operator()<allreduce_compatible>();
  one.template operator()<flexible>();
  one.template operator()<low_rank_allreduce>();
}

//! Calls \p f.template operator()<P>() for every built-in policy P whose decisions reach C
//! (the compositions the trainer accepts; composition.hpp).
template <class C, class F>
void for_each_policy_reaching(F&& f) {
  const auto one = [&]<class P>() {
    if constexpr (decisions_reach_v<C, P>) f.template operator()<P>();
  };
  one.template operator()<fixed_policy>();
  one.template operator()<gravac_policy>();
  one.template operator()<accordion_policy>();
  one.template operator()<adacomp_policy>();
  one.template operator()<moo_policy>();
}

}  // namespace gravac::test
