#pragma once
// The check shared by the bucket tests: for a compressor x collective x policy, the
// asynchronous step (begin_step, ready per layer, finish) on a communication thread gives
// the same bits as the synchronous step with the same buckets: averaged gradients, the
// step's decisions, the reports (all but measured times) and the residuals, on every rank
// of 4 thread ranks (more threads than CI's two cores, so their timing varies).

#include <bit>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstdint>
#include <span>
#include <thread>
#include <vector>

#include "combinations.hpp"
#include "determinism_checks.hpp"

namespace gravac::test {

//! Hash of the report fields that do not measure time.
inline std::uint64_t report_hash(const step_report& r) {
  std::uint64_t h = detail::fnv1a_u64(r.step, 0xcbf29ce484222325ull);
  h = detail::fnv1a_u64(r.bytes_sent, h);
  h = detail::fnv1a_u64(static_cast<std::uint64_t>(r.collective), h);
  h = detail::fnv1a_u64(std::bit_cast<std::uint64_t>(r.gain), h);
  h = detail::fnv1a_u64(r.buckets, h);
  h = detail::fnv1a_u64(r.skipped, h);
  for (double v : r.kept_fraction) h = detail::fnv1a_u64(std::bit_cast<std::uint64_t>(v), h);
  for (double v : r.layer_grad_norm) h = detail::fnv1a_u64(std::bit_cast<std::uint64_t>(v), h);
  for (double v : r.gain_curve) h = detail::fnv1a_u64(std::bit_cast<std::uint64_t>(v), h);
  return h;
}

//! How a run hands its gradient to the trainer.
enum class step_mode {
  synchronous,  //!< step(grads)
  overlapped,   //!< begin_step, ready() from the last layer to the first with work between, finish()
  scrambled,    //!< begin_step, ready() in layout order (the worst order for overlap), finish()
};

//! One rank's run of \p steps steps in \p mode with \p bucket_bytes, hashed per step.
template <class C, class K, class P, class M>
run_hashes bucketed_run(M& comm, const layout& lay, int steps, std::size_t bucket_bytes, step_mode mode) {
  auto opt = determinism_options<C, K, P>();
  opt.bucket_bytes = bucket_bytes;
  trainer<C, K, P> t(comm, lay, opt);
  run_hashes h;
  for (int s = 0; s < steps; ++s) {
    auto g = rank_gradient(lay, s, comm.rank(), amplitude_at(s));
    const step_report* r = nullptr;
    if (mode == step_mode::synchronous) {
      r = &t.step(std::span<float>(g));
    } else {
      t.begin_step(std::span<float>(g));
      for (std::size_t k = 0; k < lay.size(); ++k) {
        const std::size_t i = mode == step_mode::overlapped ? lay.size() - 1 - k : k;
        if ((k + static_cast<std::size_t>(s)) % 3 == 0) std::this_thread::yield();  // backward "computes"
        t.ready(i);
      }
      r = &t.finish();
    }
    h.kind.push_back(r->collective);
    h.step.push_back(fnv1a_floats(g, params_hash(t.last_params()) ^ report_hash(*r)));
    end_interval_after(t, s);
  }
  const auto& ct = t;
  h.residual = fnv1a_floats(std::span<const float>(ct.residual().data(), ct.residual().size()));
  return h;
}

constexpr int bucket_ranks = 4;
constexpr int bucket_steps = 10;  // two interval ends (steps_per_epoch = 5): Accordion and GraVAC decide

//! Synchronous and asynchronous runs with the same buckets: identical on every rank.
template <class C, class K, class P>
void check_async_matches_sync(std::size_t bucket_bytes, const char* policy_name) {
  const auto lay = mixed_layout();
  const auto run = [&](step_mode mode) {
    std::vector<run_hashes> out(bucket_ranks);
    run_ranks(bucket_ranks, [&](thread_communicator& comm) {
      out[static_cast<std::size_t>(comm.rank())] = bucketed_run<C, K, P>(comm, lay, bucket_steps, bucket_bytes, mode);
    });
    return out;
  };
  // The scrambled order (ready() in layout order) matters most with one bucket per layer;
  // larger buckets are checked in backward order only, to keep the sanitizer stages short.
  const bool scramble = bucket_bytes == bucket_per_layer;
  const auto sync = run(step_mode::synchronous);
  const auto overlapped = run(step_mode::overlapped);
  const auto scrambled = scramble ? run(step_mode::scrambled) : sync;
  INFO("collective " << typeid(K).name() << ", policy " << policy_name << ", bucket_bytes " << bucket_bytes);
  for (std::size_t r = 0; r < bucket_ranks; ++r) {
    INFO("rank " << r);
    CHECK(sync[r] == overlapped[r]);
    CHECK(sync[r] == scrambled[r]);
  }
}

//! check_async_matches_sync for every collective accepting C and every policy reaching it,
//! with one bucket per layer and with buckets of a few layers.
template <class C>
void check_async_all() {
  for_each_collective_accepting<C>([&]<class K>() {
    for_each_policy_reaching<C>([&]<class P>() {
      check_async_matches_sync<C, K, P>(bucket_per_layer, typeid(P).name());
      check_async_matches_sync<C, K, P>(2048, typeid(P).name());
    });
  });
}

}  // namespace gravac::test
