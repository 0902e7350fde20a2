#pragma once
// The control-plane check shared by the test_control_plane_* files: a trainer step makes
// no collective besides the gradient's own, for every valid compressor x collective x
// policy, with the default on_non_finite (throw_error, whose flag rides along too).

#include <catch2/catch.hpp>
#include <string>
#include <type_traits>

#include "combinations.hpp"
#include "counting_communicator.hpp"
#include "gravac/collective/allgather.hpp"
#include "gravac/collective/allreduce_compatible.hpp"
#include "gravac/collective/dense_allreduce.hpp"
#include "gravac/collective/flexible.hpp"
#include "gravac/collective/low_rank_allreduce.hpp"
#include "gravac/comm/thread_communicator.hpp"
#include "gravac/policy/accordion_policy.hpp"
#include "gravac/policy/adacomp_policy.hpp"
#include "gravac/policy/fixed_policy.hpp"
#include "gravac/policy/gravac_policy.hpp"
#include "gravac/policy/moo_policy.hpp"
#include "gravac/trainer.hpp"
#include "policy_test_util.hpp"

namespace gravac::test {

//! Options that make each policy decide within a short run (warm-ups of a few steps).
template <class P>
typename P::options quick_policy_options() {
  typename P::options o{};
  if constexpr (std::is_same_v<P, gravac_policy>) {
    o.cf_min = 4;
    o.cf_max = 64;
    o.window = 3;
    o.warmup_steps = 3;
    o.epsilon = 0.3;
    o.period_steps = 4;
  } else if constexpr (std::is_same_v<P, moo_policy>) {
    o.warmup_steps = 6;
  } else if constexpr (std::is_same_v<P, fixed_policy>) {
    o.kept_fraction = 0.1;
  }
  return o;
}

//! Collectives the gradient itself needs in one step of collective K that reported \p kind:
//! throws a Catch failure when \p d holds anything else.
template <class C, class K>
void check_gradient_collectives_only(const collective_counts& d, collective_kind kind) {
  if constexpr (std::is_same_v<K, low_rank_allreduce>) {
    CHECK(d.allreduce == 2);  // P, then Q (with the control values)
    CHECK(d.total() == 2);
  } else if (kind == collective_kind::allgather) {
    CHECK(d.allgather == 1);
    CHECK(d.total() == 1);
  } else if (kind == collective_kind::compressed_allreduce) {
    CHECK(d.alltoall == 1);   // the shards' packets
    CHECK(d.allgather == 1);  // the recompressed shards, with the control trailer
    CHECK(d.total() == 2);
  } else if (kind == collective_kind::allreduce_compatible) {
    CHECK(d.allreduce == 1);  // the values, with the control values at their end
    CHECK(d.allgather == 0);
    CHECK(d.broadcast <= 1);  // the index list (none with shared indices or all layers dense)
    CHECK(d.barrier == 0);
  } else {
    CHECK(d.allreduce == 1);  // one dense Allreduce, with the control values at its end
    CHECK(d.total() == 1);
  }
}

//! Runs 30 steps (epochs of 5, with end_interval) of trainer<C, K, P> on 4 thread ranks
//! through a counting decorator, then checks every step and every end_interval (Catch's
//! assertions are checked on the main thread: they are not thread-safe).
template <class C, class K, class P>
void check_control_plane() {
  constexpr int ranks = 4, steps = 30;
  struct step_record {
    collective_counts step, interval;
    collective_kind kind = collective_kind::automatic;
  };
  const auto lay = mixed_layout();
  std::vector<std::vector<step_record>> log(ranks, std::vector<step_record>(steps));
  run_ranks(ranks, [&](thread_communicator& comm) {
    counting_communicator<thread_communicator> counted(comm);
    typename trainer<C, K, P>::options o;
    o.policy = quick_policy_options<P>();
    o.seed = 3;
    trainer<C, K, P> t(counted, lay, o);
    auto& mine = log[static_cast<std::size_t>(comm.rank())];
    for (int s = 0; s < steps; ++s) {
      auto g = rank_gradient(lay, s, comm.rank(), amplitude_at(s));
      const collective_counts before = counted.counts();
      mine[static_cast<std::size_t>(s)].kind = t.step(g).collective;
      mine[static_cast<std::size_t>(s)].step = counted.counts() - before;
      if ((s + 1) % steps_per_epoch == 0) {
        const collective_counts at = counted.counts();
        t.end_interval({static_cast<std::uint64_t>(s + 1), static_cast<std::uint64_t>((s + 1) / steps_per_epoch),
                        s < 15 ? 0.1 : 0.01, 40.0 * steps_per_epoch});
        mine[static_cast<std::size_t>(s)].interval = counted.counts() - at;
      }
    }
  });
  for (int r = 0; r < ranks; ++r)
    for (int s = 0; s < steps; ++s) {
      const auto& e = log[static_cast<std::size_t>(r)][static_cast<std::size_t>(s)];
      INFO("rank " << r << " step " << s << " collective " << to_string(e.kind) << ": " << e.step.allreduce
                   << " allreduce, " << e.step.allgather << " allgather, " << e.step.alltoall << " alltoall, "
                   << e.step.broadcast << " broadcast, " << e.step.barrier << " barrier");
      check_gradient_collectives_only<C, K>(e.step, e.kind);
      CHECK(e.interval.total() == 0);  // decisions at interval ends ride in later steps
    }
}

//! check_control_plane for every collective that accepts C and every policy whose decisions reach it.
template <class C>
void check_control_plane_all() {
  for_each_collective_accepting<C>([&]<class K>() {
    INFO("collective " << typeid(K).name());
    for_each_policy_reaching<C>([&]<class P>() { check_control_plane<C, K, P>(); });
  });
}

}  // namespace gravac::test
