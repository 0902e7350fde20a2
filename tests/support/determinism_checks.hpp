#pragma once
// The determinism check shared by the test_determinism_* files and the MPI test: the same
// training (seed, layout, rank count) run twice gives bit-identical outputs, decisions and
// residuals on every rank, with another trainer run in between (other buffers, other
// addresses) and whatever the thread timing (6 thread ranks on however many cores).
// Every policy and collective whose decisions could depend on measured time gets a clock
// that does not: gravac_policy on the simulated clock without codec times, moo_policy and
// flexible on a fixed network (flexible without charge_codec, which adds measured times).

#include <bit>
#include <catch2/catch.hpp>
#include <cstdint>
#include <cstring>
#include <span>
#include <type_traits>
#include <vector>

#include "combinations.hpp"
#include "control_plane_checks.hpp"
#include "gravac/compress/topk.hpp"

namespace gravac::test {

//! FNV-1a over the bytes of \p bytes, continuing from \p h.
inline std::uint64_t fnv1a_bytes(std::span<const std::byte> bytes, std::uint64_t h = 0xcbf29ce484222325ull) {
  for (std::byte b : bytes) {
    h ^= static_cast<std::uint64_t>(b);
    h *= 0x100000001b3ull;
  }
  return h;
}
inline std::uint64_t fnv1a_floats(std::span<const float> v, std::uint64_t h = 0xcbf29ce484222325ull) {
  return fnv1a_bytes(std::as_bytes(v), h);
}

//! Options of trainer<C, K, P> for the determinism runs: the quick policy options, and no
//! decision on a measured clock.
template <class C, class K, class P>
typename trainer<C, K, P>::options determinism_options(std::uint64_t seed = 3) {
  typename trainer<C, K, P>::options o;
  o.policy = quick_policy_options<P>();
  if constexpr (std::is_same_v<P, gravac_policy>) o.policy.time = {time_source::simulated, 0.0, false};
  if constexpr (std::is_same_v<P, moo_policy>) o.policy.source = network_source::fixed;
  if constexpr (std::is_same_v<K, flexible>) {
    o.collective.source = network_source::fixed;
    o.collective.charge_codec = false;  // measured compression times would steer the choice
  }
  o.seed = seed;
  return o;
}

//! One rank's hashes of a run: per step, the output gradient's bytes and the step's
//! parameters (the decisions); at the end, the residual's bytes.
struct run_hashes {
  std::vector<std::uint64_t> step;
  std::vector<collective_kind> kind;  //!< the collective each step took
  std::uint64_t residual = 0;
  bool operator==(const run_hashes&) const = default;
};

//! Runs \p steps steps of the policy-test schedule (end_interval every steps_per_epoch
//! steps) of trainer<C, K, P> as this rank of \p comm, and hashes what it produced.
template <class C, class K, class P, class M>
run_hashes hashed_run(M& comm, const layout& lay, int steps) {
  trainer<C, K, P> t(comm, lay, determinism_options<C, K, P>());
  run_hashes h;
  for (int s = 0; s < steps; ++s) {
    auto g = rank_gradient(lay, s, comm.rank(), amplitude_at(s));
    h.kind.push_back(t.step(std::span<float>(g)).collective);
    h.step.push_back(fnv1a_floats(g, params_hash(t.last_params())));
    end_interval_after(t, s);
  }
  const auto& ct = t;  // read without marking the residual as written
  h.residual = fnv1a_floats(std::span<const float>(ct.residual().data(), ct.residual().size()));
  return h;
}

//! hashed_run on \p ranks thread ranks; one slot per rank (each written by its own thread
//! only), read on the calling thread after run_ranks joined.
template <class C, class K, class P>
std::vector<run_hashes> thread_hashed_run(int ranks, const layout& lay, int steps) {
  std::vector<run_hashes> out(static_cast<std::size_t>(ranks));
  run_ranks(ranks, [&](thread_communicator& comm) {
    out[static_cast<std::size_t>(comm.rank())] = hashed_run<C, K, P>(comm, lay, steps);
  });
  return out;
}

//! Another training between the two runs: other sizes, seed and kept fraction, so that the
//! second run's buffers lie elsewhere and the allocator's state differs.
inline void unrelated_thread_run(int ranks) {
  layout lay;
  lay.add("big", {97, 31}, layer_kind::dense);
  lay.add("odd", {7}, layer_kind::bias_or_norm);
  run_ranks(ranks, [&](thread_communicator& comm) {
    trainer<topk, allgather, fixed_policy> t(comm, lay, {.policy = {.kept_fraction = 0.37}, .seed = 11});
    for (int s = 0; s < 3; ++s) {
      auto g = rank_gradient(lay, s + 5, comm.rank());
      t.step(std::span<float>(g));
    }
  });
}

constexpr int determinism_ranks = 6;  // more ranks than CI's two cores: threads interleave
constexpr int determinism_steps = 20;

//! The same training twice in this process, with another one in between: every rank's
//! hashes equal bit for bit.
template <class C, class K, class P>
void check_determinism(const char* policy_name) {
  const auto lay = mixed_layout();
  const auto first = thread_hashed_run<C, K, P>(determinism_ranks, lay, determinism_steps);
  unrelated_thread_run(determinism_ranks);
  const auto second = thread_hashed_run<C, K, P>(determinism_ranks, lay, determinism_steps);
  INFO("collective " << typeid(K).name() << ", policy " << policy_name);
  for (int r = 0; r < determinism_ranks; ++r) {
    const auto& a = first[static_cast<std::size_t>(r)];
    const auto& b = second[static_cast<std::size_t>(r)];
    INFO("rank " << r);
    REQUIRE(a.step.size() == static_cast<std::size_t>(determinism_steps));
    REQUIRE(b.step.size() == a.step.size());
    for (std::size_t s = 0; s < a.step.size(); ++s) {
      INFO("step " << s);
      CHECK(a.step[s] == b.step[s]);
    }
    CHECK(a.kind == b.kind);
    CHECK(a.residual == b.residual);
  }
}

//! check_determinism for every collective that accepts C and every policy whose decisions reach it.
template <class C>
void check_determinism_all() {
  for_each_collective_accepting<C>([&]<class K>() {
    // Every policy whose decisions reach C: the others do not compile (composition.hpp).
    if constexpr (decisions_reach_v<C, fixed_policy>) check_determinism<C, K, fixed_policy>("fixed");
    if constexpr (decisions_reach_v<C, gravac_policy>)
      check_determinism<C, K, gravac_policy>("gravac (simulated clock, no codec)");
    if constexpr (decisions_reach_v<C, accordion_policy>) check_determinism<C, K, accordion_policy>("accordion");
    if constexpr (decisions_reach_v<C, adacomp_policy>) check_determinism<C, K, adacomp_policy>("adacomp");
    if constexpr (decisions_reach_v<C, moo_policy>) check_determinism<C, K, moo_policy>("moo (fixed network)");
  });
}

}  // namespace gravac::test
