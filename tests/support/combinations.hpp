#pragma once
// The collectives a compressor can be composed with, for tests that cover every valid
// compressor x collective x policy combination.

#include "gravac/collective/allgather.hpp"
#include "gravac/collective/allreduce_compatible.hpp"
#include "gravac/collective/dense_allreduce.hpp"
#include "gravac/collective/flexible.hpp"
#include "gravac/collective/low_rank_allreduce.hpp"

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

}  // namespace gravac::test
