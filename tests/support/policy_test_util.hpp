#pragma once
// Helpers of the policy tests: a hash of the parameters a policy chose (to compare
// decisions across ranks), a copy of them that outlives the trainer (for the serial
// reference), and a test-only mock of a network model.

#include <bit>
#include <cstdint>
#include <span>
#include <vector>

#include "gravac/compress/step_settings.hpp"
#include "gravac/trainer/detail/consistency.hpp"
#include "gravac_test_util.hpp"

namespace gravac::test {

// One step of policy p (Accordion's protocol) as the trainer runs it on a single rank: plan,
// accumulate, the collective (over one rank the request's sum is the request itself),
// agreed, observe. Returns the step's parameters.
template <class P>
step_params single_rank_step(P& p, const std::vector<float>& g) {
  step_params sp;
  p.plan(sp);
  p.accumulate(g);
  if (p.decision_pending()) {
    const std::vector<double> sums(p.agreement_request().begin(), p.agreement_request().end());
    p.agreed(sums);
  }
  p.observe(step_report{});
  return sp;
}

// Hash of everything in step_params that changes what is sent.
inline std::uint64_t params_hash(const step_params& p) {
  std::uint64_t h = detail::fnv1a_u64(p.step, 0xcbf29ce484222325ull);
  h = detail::fnv1a_u64(p.seed, h);
  for (double f : p.kept_fraction) h = detail::fnv1a_u64(std::bit_cast<std::uint64_t>(f), h);
  h = detail::fnv1a_u64(std::bit_cast<std::uint64_t>(p.global_fraction), h);
  h = detail::fnv1a_u64(static_cast<std::uint64_t>(p.collective), h);
  for (double f : p.gain_candidates) h = detail::fnv1a_u64(std::bit_cast<std::uint64_t>(f), h);
  h = detail::fnv1a_u64(static_cast<std::uint64_t>(p.ranks), h);
  return h;
}

// The parameters of one step, owned (they outlive the trainer), with AdaComp's bin
// lengths when the trainer's compressor has them (its step settings).
struct recorded_params {
  std::uint64_t step = 0, seed = 0, hash = 0;
  std::vector<double> kept_fraction;
  double global_fraction = 1;
  std::vector<std::uint32_t> bin_length;
  int ranks = 1;

  static recorded_params of(const step_params& p) {
    return {p.step, p.seed, params_hash(p), p.kept_fraction, p.global_fraction, {}, p.ranks};
  }
  // The parameters and the step settings of trainer \p t's last step.
  template <class T>
  static recorded_params of_trainer(const T& t) {
    recorded_params r = of(t.last_params());
    if constexpr (requires { t.last_settings().bin_length; }) {
      r.bin_length = t.last_settings().bin_length;
      r.hash = detail::hash_step_settings(t.last_settings(), r.hash);
    }
    return r;
  }
  // AdaComp's settings for the serial reference.
  [[nodiscard]] adacomp_settings settings() const { return {bin_length}; }
  // Parameters for the serial reference (no gain candidates: they do not change what is sent).
  [[nodiscard]] step_params params() const {
    step_params p;
    p.step = step;
    p.seed = seed;
    p.kept_fraction = kept_fraction;
    p.global_fraction = global_fraction;
    p.ranks = ranks;
    return p;
  }
};

// MOCK (test-only): a network model over a thread communicator. Every allgatherv and
// allreduce charges alpha + beta * bytes to a virtual clock (exposed as modeled_seconds(),
// which the trainer reads), so that a policy on time_source::simulated sees times that are
// identical run to run. The real network model is another component; this is a stand-in.
class mock_network_comm {
 public:
  using communicator_tag = void;
  using memory_space = host_space;
  using byte_buffer = std::vector<std::byte>;

  mock_network_comm(thread_communicator& inner, double alpha, double beta)
      : inner_(inner), alpha_(alpha), beta_(beta) {}
  [[nodiscard]] int rank() const noexcept { return inner_.rank(); }
  [[nodiscard]] int size() const noexcept { return inner_.size(); }
  void allreduce_sum(std::span<float> d) {
    charge(d.size_bytes());
    inner_.allreduce_sum(d);
  }
  void allreduce_sum(std::span<double> d) { inner_.allreduce_sum(d); }  // statistics: not charged
  void allreduce_max(std::span<double> d) { inner_.allreduce_max(d); }
  void allgatherv(std::span<const std::byte> mine, byte_buffer& out, std::vector<std::size_t>& sizes) {
    inner_.allgatherv(mine, out, sizes);
    charge(out.size());
  }
  void broadcast(std::span<std::byte> b, int root) { inner_.broadcast(b, root); }
  void barrier() { inner_.barrier(); }
  [[nodiscard]] double modeled_seconds() const noexcept { return clock_; }

 private:
  void charge(std::size_t bytes) { clock_ += alpha_ + beta_ * static_cast<double>(bytes); }
  thread_communicator& inner_;
  double alpha_, beta_;
  double clock_ = 0;
};
static_assert(Communicator<mock_network_comm>);

// Deliberately different local gradients: rank-dependent distribution and scale, and a
// per-step amplitude so that norms change between intervals.
inline std::vector<float> rank_gradient(const layout& lay, int step, int rank, double amplitude = 1.0) {
  auto g =
      make_data(lay.numel(), 7919ull * static_cast<std::uint64_t>(step) + 31ull * static_cast<std::uint64_t>(rank) + 1,
                rank % 2 ? distribution::laplace : distribution::gaussian);
  const float s = static_cast<float>((1.0 + 0.5 * rank) * amplitude);
  for (auto& x : g) x *= s;
  return g;
}

// The schedule every multi-rank policy test trains on: epochs of 5 steps whose gradient
// amplitude changes (so that Accordion sees critical and quiet intervals) and a
// learning-rate decay after epoch 3.
constexpr int steps_per_epoch = 5;
inline double amplitude_at(int step) {
  static constexpr double a[] = {1.0, 0.3, 0.29, 0.28, 0.1, 0.1, 0.099, 0.098};
  const int e = step / steps_per_epoch;
  return a[e < 7 ? e : 7];
}
inline double learning_rate_of(int epoch) { return epoch < 3 ? 0.1 : 0.01; }
// The schedule's interval end after step s (0-based): every steps_per_epoch steps, with
// the epoch's learning rate and 32 samples per step.
template <class Trainer>
void end_interval_after(Trainer& t, int s) {
  if ((s + 1) % steps_per_epoch != 0) return;
  const auto epoch = static_cast<std::uint64_t>((s + 1) / steps_per_epoch);
  t.end_interval({.step = static_cast<std::uint64_t>(s + 1),
                  .epoch = epoch,
                  .learning_rate = learning_rate_of(static_cast<int>(epoch)),
                  .samples = 32.0 * steps_per_epoch});
}

// What one rank saw: the parameters of every step, its output, and its final residual.
struct rank_log {
  std::vector<recorded_params> params;
  std::vector<std::vector<float>> out;
  std::vector<float> residual;
};

// Runs steps [from, to) of the schedule on trainer \p t as rank \p rank, logging.
template <class T>
void run_schedule(T& t, int rank, int from, int to, rank_log& log) {
  for (int s = from; s < to; ++s) {
    auto g = rank_gradient(t.get_layout(), s, rank, amplitude_at(s));
    t.step(std::span<float>(g));
    log.params.push_back(recorded_params::of_trainer(t));
    log.out.push_back(std::move(g));
    end_interval_after(t, s);
  }
  const auto& ct = t;  // read without marking the residual as written
  log.residual.assign(ct.residual().begin(), ct.residual().end());
}

// The serial reference of the schedule on \p ranks ranks under the parameters \p params
// (one per step): the averaged gradient of every step, and the residuals at the end.
template <class C>
std::vector<std::vector<float>> schedule_reference(const layout& lay, const typename C::options& copt,
                                                   const std::vector<recorded_params>& params, int ranks,
                                                   std::vector<std::vector<float>>& residuals) {
  residuals.assign(static_cast<std::size_t>(ranks), std::vector<float>(lay.numel(), 0.0f));
  std::vector<std::vector<float>> outs;
  for (std::size_t s = 0; s < params.size(); ++s) {
    std::vector<std::vector<float>> grads;
    for (int r = 0; r < ranks; ++r)
      grads.push_back(rank_gradient(lay, static_cast<int>(s), r, amplitude_at(static_cast<int>(s))));
    outs.push_back(serial_reference<C>(lay, copt, params[s].params(), grads, residuals, [&](C& c) {
      if constexpr (requires { c.set_step_settings(adacomp_settings{}); }) c.set_step_settings(params[s].settings());
    }));
  }
  return outs;
}

}  // namespace gravac::test
