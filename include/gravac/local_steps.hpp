#pragma once
//! \file local_steps.hpp
//! \brief local_steps<C, K, P>: local-step training (local SGD, DiLoCo and its family) as a
//! composition of the library: every rank takes H inner optimizer steps alone, then the
//! ranks exchange the pseudo-gradient (how far the parameters moved) through a
//! trainer<C, K, P>, with error feedback, and an outer optimizer moves the global parameters.

#include <algorithm>
#include <chrono>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "gravac/checkpoint.hpp"
#include "gravac/core/error.hpp"
#include "gravac/local/outer_optimizer.hpp"
#include "gravac/policy/detail/policy_state.hpp"
#include "gravac/trainer.hpp"

namespace gravac {

//! Local-step training over compressor \p C, collective \p K and policy \p P.
//!
//! \code
//! gravac::local_steps<gravac::sparseloco, gravac::allgather, gravac::fixed_policy> ls{comm, lay, params, opt};
//! for (...) {
//!   backward(params, grads);
//!   ls.before_inner_step(grads);  // a per-step round (H = 1): grads become the rank average
//!   inner_optimizer.step(params, grads);
//!   ls.after_inner_step(params);  // a round's end: exchange, outer step, params = the new global point
//! }
//! \endcode
//!
//! A round of H > 1 inner steps ends with one exchange: the pseudo-gradient d = x0 - x (x0
//! the round's start, x this rank's parameters) goes through the trainer, which compresses
//! it with its own error feedback and leaves the rank average in place; the outer optimizer
//! (outer_optimizer.hpp) moves x0 by it, and every rank continues from the new x0. A round
//! of H = 1 is ordinary data-parallel training: the trainer averages the gradient itself
//! and the caller's optimizer applies it, so local_steps with H = 1 is the per-step trainer
//! bit for bit, and a policy may switch between the two as the network changes. Gradients
//! and pseudo-gradients keep separate error-feedback residuals (their scales differ).
//!
//! H is options::period, or what P chooses when it has `period()` (local_steps_policy):
//! read at every round's start, the same on every rank.
//!
//! With options::overlap, a round's exchange runs on the trainer's communication thread
//! while the next round's inner steps run, and is applied one round late (as Streaming
//! DiLoCo and DiLoCoX do): at the end of round k+1 the averaged d_k moves x0, and this
//! rank continues from x0 minus its own progress of round k+1, whose exchange starts then.
//! The communicator must accept calls from another thread, and the caller must not use it
//! between the rounds' ends. Before a per-step round, the exchange in flight is completed
//! and the last local round is exchanged at once, so per-step rounds start in agreement.
//!
//! The inner optimizer's state stays the caller's (DiLoCo keeps it local to each rank). In
//! per-step rounds every rank applies its optimizer to the same averaged gradient, so the
//! ranks stay in agreement only if that state agrees too: when a round of local steps ends
//! and per-step rounds follow, inner_state_must_agree() is true, and the caller makes its
//! optimizer's state the same on every rank (average_inner_state) before the next step.
//! Host memory only.
template <class C, class K, class P>
class local_steps {
  static_assert(C::memory_space::host_accessible, "local_steps: host memory only (a device version is not written)");

 public:
  //! The trainer that runs every exchange.
  using trainer_type = trainer<C, K, P>;
  //! Whether the policy chooses H (it has `period()`).
  static constexpr bool policy_chooses_period = requires(const P& p) {
    { p.period() } -> std::convertible_to<std::size_t>;
  };

  //! Options of local-step training.
  struct options {
    typename trainer_type::options exchange{};  //!< the trainer of the exchanges (compressor, collective, policy)
    outer_options outer{};                      //!< the outer optimizer (DiLoCo's Nesterov by default)
    std::size_t period = 10;  //!< H, inner steps per exchange, >= 1 (when the policy does not choose it)
    bool overlap = false;     //!< run each exchange behind the next round, applied one round late
  };

  //! Local-step training over communicator \p comm (which must outlive it) for the tensors
  //! of \p lay, starting from \p params (the same on every rank). Rejects invalid options.
  template <class M>
  local_steps(M& comm, const layout& lay, std::span<const float> params, const options& opt = {})
      : options_(checked(opt, lay, params)),
        outer_(lay.numel(), opt.outer),
        global_(params.begin(), params.end()),
        idle_residual_(lay.numel(), 0.0f),
        delta_(lay.numel(), 0.0f),
        trainer_(comm, lay, exchange_options(opt)) {
    if (opt.overlap) {
      require(trainer_.communicator().accepts_calls_from_other_threads(),
              "local_steps: overlap needs a communicator that may be called from the trainer's communication thread "
              "(MPI: MPI_THREAD_SERIALIZED or more)");
      start_ = global_;
      pending_.assign(lay.numel(), 0.0f);
    }
    period_ = next_period();
    round_began_ = std::chrono::steady_clock::now();
  }

  local_steps(const local_steps&) = delete;
  local_steps& operator=(const local_steps&) = delete;

  //! Call after backward, before the inner optimizer's step. In a per-step round (H = 1)
  //! the trainer averages \p grads over the ranks in place; returns its report. In a round
  //! of local steps \p grads stays this rank's own and nullptr is returned.
  const step_report* before_inner_step(std::span<float> grads) {
    require(!awaiting_after_, "local_steps::before_inner_step: called twice; call after_inner_step first");
    require(grads.size() == global_.size(), "local_steps::before_inner_step: " + std::to_string(grads.size()) +
                                                " gradients for a layout of " + std::to_string(global_.size()));
    awaiting_after_ = true;
    per_step_begins_ = false;
    if (period_ != 1) return nullptr;
    use_residual(residual_mode::gradient);
    tell_round(1);
    const step_report& r = trainer_.step(grads);
    round_began_ = std::chrono::steady_clock::now();
    return &r;
  }

  //! Call after the inner optimizer's step on \p params. At the end of a round of local
  //! steps: exchanges, applies the outer optimizer and writes the point this rank continues
  //! from into \p params; returns the report of the exchange that completed (nullptr when
  //! none did). When per-step rounds follow, see inner_state_must_agree().
  const step_report* after_inner_step(std::span<float> params) {
    require(awaiting_after_, "local_steps::after_inner_step: call before_inner_step first (after backward)");
    require(params.size() == global_.size(), "local_steps::after_inner_step: " + std::to_string(params.size()) +
                                                 " parameters for a layout of " + std::to_string(global_.size()));
    awaiting_after_ = false;
    ++inner_steps_;
    if (period_ == 1) {
      // The ranks hold the same parameters after a per-step round (their inner optimizers'
      // states agree: inner_state_must_agree): they are the global point, and the next round
      // starts there.
      period_ = next_period();
      begin_round(params);
      return nullptr;
    }
    if (++in_round_ < period_) return nullptr;
    in_round_ = 0;
    return options_.overlap ? end_round_overlapped(params) : end_round(params);
  }

  //! Ends the round in progress now, before its H steps: the ranks exchange how far they
  //! moved since its start, the outer optimizer moves the global point, and \p params
  //! becomes it (with overlap, the exchange in flight is completed and applied first). For
  //! the end of training, or before evaluating or saving the model: afterwards every rank
  //! holds the same parameters. Collective: every rank calls it at the same inner step,
  //! between inner steps. Returns the report of the last exchange it completed (nullptr
  //! when the ranks already agreed: a per-step round, or a round of no steps yet).
  const step_report* finish_round(std::span<float> params) {
    require(!awaiting_after_, "local_steps::finish_round: between inner steps only (after after_inner_step)");
    require(params.size() == global_.size(), "local_steps::finish_round: " + std::to_string(params.size()) +
                                                 " parameters for a layout of " + std::to_string(global_.size()));
    if (period_ == 1) return nullptr;
    const step_report* report = nullptr;
    if (options_.overlap) {
      // The exchange in flight carries the last round's progress: the global point moves
      // by its average, and this rank's own progress since then is on top of it.
      if (in_flight_ || pending_ready_) report = &trainer_.last_report();
      complete_exchange();
      if (pending_ready_) {
        outer_.apply(global_, pending_);
        pending_ready_ = false;
        report = &trainer_.last_report();
      }
      for (std::size_t i = 0; i < delta_.size(); ++i) delta_[i] = start_[i] - params[i];
    } else {
      for (std::size_t i = 0; i < delta_.size(); ++i) delta_[i] = global_[i] - params[i];
    }
    if (in_round_ > 0) {
      exchange_now(params, in_round_);
      report = &trainer_.last_report();
    } else {
      std::copy(global_.begin(), global_.end(), params.begin());
    }
    period_ = next_period();
    per_step_begins_ = period_ == 1;
    begin_round(params);
    return report;
  }

  //! Whether the call that just ended a round of local steps (after_inner_step or
  //! finish_round) began per-step rounds (H = 1). The inner optimizer's state (its momentum)
  //! is each rank's own after local steps; per-step rounds apply every rank's optimizer to
  //! the same averaged gradient, so unless that state is made the same on every rank first
  //! (average_inner_state), the ranks' parameters drift apart. True until the next
  //! before_inner_step; save() keeps it, so a state saved before acting on it resumes with it.
  [[nodiscard]] bool inner_state_must_agree() const noexcept { return per_step_begins_; }

  //! Replaces \p state (the inner optimizer's state, e.g. its momentum buffers) with its
  //! average over the ranks, the same bits on every rank: one allreduce through the
  //! exchanges' communicator. Collective: every rank calls it at the same inner step, between
  //! inner steps, with the same length (call it when inner_state_must_agree()).
  void average_inner_state(std::span<float> state) {
    require(!awaiting_after_ && !in_flight_,
            "local_steps::average_inner_state: between inner steps only, with no exchange in flight");
    auto& comm = trainer_.communicator();
    comm.allreduce_sum(state);
    const auto n = static_cast<float>(comm.size());
    for (float& v : state) v /= n;
  }

  //! Completes an exchange in flight (overlap) and keeps its average until the round's
  //! end applies it. Collective: every rank calls it at the same inner step. save() calls it;
  //! call it after the last inner step too: destroying local_steps with an exchange in
  //! flight abandons the exchange (as destroying a trainer mid-step does).
  void complete_exchange() {
    if (!in_flight_) return;
    in_flight_ = false;
    trainer_.finish();
    pending_ready_ = true;
  }

  //! Marks the end of an interval (an epoch) for the policy.
  void end_interval(const interval_info& info) { trainer_.end_interval(info); }

  //! Appends the state between inner steps to \p out: the global parameters, the round's
  //! start and progress, the outer optimizer, both residuals, an averaged exchange not yet
  //! applied, whether the inner state must agree, and the trainer (its residual, policy,
  //! counters). Completes an exchange in flight first, so every rank calls it at the same
  //! inner step. The caller saves its parameters and inner optimizer.
  void save(std::vector<std::byte>& out) {
    require(!awaiting_after_, "local_steps::save: between inner steps only (after after_inner_step)");
    complete_exchange();
    detail::state_writer w(out);
    w.header(state_tag, state_version, fingerprint());
    w.put<std::uint64_t>(period_);
    w.put<std::uint64_t>(in_round_);
    w.put(inner_steps_);
    w.put<std::uint8_t>(static_cast<std::uint8_t>(mode_));
    w.put<std::uint8_t>(pending_ready_ ? 1 : 0);
    w.put<std::uint8_t>(per_step_begins_ ? 1 : 0);
    w.put_vector(global_);
    w.put_vector(start_);
    w.put_vector(pending_);
    w.put_vector(idle_residual_);
    w.put_vector(outer_.momentum());
    w.put_vector(save_checkpoint_bytes(trainer_));
  }
  //! Restores what save() wrote on this rank, between inner steps. Throws gravac::error,
  //! changing nothing, on bytes of another configuration, layout or rank, or damaged bytes.
  void load(std::span<const std::byte> in) {
    require(!awaiting_after_ && !in_flight_, "local_steps::load: between inner steps only, with no exchange in flight");
    detail::state_reader r(in, "local_steps");
    r.header(state_tag, state_version, fingerprint());
    const auto period = static_cast<std::size_t>(r.get<std::uint64_t>());
    const auto in_round = static_cast<std::size_t>(r.get<std::uint64_t>());
    const auto inner = r.get<std::uint64_t>();
    const auto mode = r.get<std::uint8_t>();
    const auto ready = r.get<std::uint8_t>();
    const auto must_agree = r.get<std::uint8_t>();
    const std::size_t n = global_.size();
    std::vector<float> global, start, pending, idle, momentum;
    std::vector<std::byte> trainer_bytes;
    r.get_vector(global, n);
    r.get_vector(start, start_.size());
    r.get_vector(pending, pending_.size());
    r.get_vector(idle, n);
    r.get_vector(momentum, outer_.momentum().size());
    const auto tb = r.get<std::uint64_t>();
    // The trainer's bytes are the rest: read them as a vector of their own length.
    if (tb > in.size()) r.fail("the saved state is truncated");
    trainer_bytes.resize(static_cast<std::size_t>(tb));
    for (auto& b : trainer_bytes) b = r.get<std::byte>();
    r.finish();
    if (period < 1 || in_round >= std::max<std::size_t>(period, 1) || mode > 1 || ready > 1 ||
        (ready == 1 && !options_.overlap) || must_agree > 1 || (must_agree == 1 && (period != 1 || in_round != 0)))
      r.fail("the saved round is inconsistent");
    restore_checkpoint_bytes(trainer_, trainer_bytes);  // checks its own bytes; throws before changing on failure
    period_ = period;
    in_round_ = in_round;
    inner_steps_ = inner;
    mode_ = static_cast<residual_mode>(mode);
    pending_ready_ = ready == 1;
    per_step_begins_ = must_agree == 1;
    global_ = std::move(global);
    start_ = std::move(start);
    pending_ = std::move(pending);
    idle_residual_ = std::move(idle);
    outer_.momentum() = std::move(momentum);
    round_began_ = std::chrono::steady_clock::now();
  }

  //! H of the round in progress.
  [[nodiscard]] std::size_t period() const noexcept { return period_; }
  //! Inner steps taken in the round in progress.
  [[nodiscard]] std::size_t round_step() const noexcept { return in_round_; }
  //! Inner steps taken in all.
  [[nodiscard]] std::uint64_t inner_steps() const noexcept { return inner_steps_; }
  //! Whether an exchange runs in the background (overlap).
  [[nodiscard]] bool exchange_in_flight() const noexcept { return in_flight_; }
  //! The global parameters x0: the same on every rank, the model as of the last exchange
  //! (after a per-step round, the parameters themselves).
  [[nodiscard]] std::span<const float> global_params() const noexcept { return global_; }
  //! The trainer of the exchanges.
  [[nodiscard]] trainer_type& exchange_trainer() noexcept { return trainer_; }
  //! The trainer of the exchanges.
  [[nodiscard]] const trainer_type& exchange_trainer() const noexcept { return trainer_; }
  //! The policy (the trainer's).
  [[nodiscard]] P& policy() noexcept { return trainer_.policy(); }
  //! The outer optimizer.
  [[nodiscard]] const outer_optimizer& outer() const noexcept { return outer_; }
  //! The options.
  [[nodiscard]] const options& get_options() const noexcept { return options_; }

 private:
  static constexpr std::uint32_t state_tag = 0x4c434f4c;  // "LOCL"
  static constexpr std::uint32_t state_version = 2;       // 2: the inner state's flag

  enum class residual_mode : std::uint8_t { gradient, pseudo };

  static const options& checked(const options& opt, const layout& lay, std::span<const float> params) {
    require(opt.period >= 1, "local_steps: period must be >= 1");
    opt.outer.validate("local_steps");
    require(params.size() == lay.numel(), "local_steps: " + std::to_string(params.size()) +
                                              " parameters for a layout of " + std::to_string(lay.numel()));
    return opt;
  }
  // The trainer's options, with the policy told about overlap when it prices it.
  static typename trainer_type::options exchange_options(const options& opt) {
    auto o = opt.exchange;
    if constexpr (requires { o.policy.overlap = true; }) o.policy.overlap = opt.overlap;
    return o;
  }

  std::uint64_t fingerprint() const {
    return detail::fingerprint(trainer_.get_layout())
        .add(std::uint64_t{options_.period})
        .add(std::uint64_t{options_.overlap})
        .add(std::uint64_t(options_.outer.kind))
        .add(options_.outer.lr)
        .add(options_.outer.momentum)
        .value();
  }

  std::size_t next_period() {
    if constexpr (policy_chooses_period)
      return std::max<std::size_t>(trainer_.policy().period(), 1);
    else
      return options_.period;
  }

  // The residual of \p m in the trainer: gradients and pseudo-gradients keep their own.
  void use_residual(residual_mode m) {
    if (mode_ == m) return;
    const std::span<float> r = trainer_.residual();
    std::swap_ranges(r.begin(), r.end(), idle_residual_.begin());
    mode_ = m;
  }

  // Tells a policy that prices compute how long the round that ends took.
  void tell_round(std::size_t steps) {
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - round_began_).count();
    if constexpr (requires(P & p) { p.round_ended(std::size_t{}, 0.0, std::uint64_t{}); })
      trainer_.policy().round_ended(steps, s, inner_steps_);
  }

  // A round of local steps starts at \p params (the same on every rank).
  void begin_round(std::span<const float> params) {
    std::copy(params.begin(), params.end(), global_.begin());
    if (options_.overlap) std::copy(params.begin(), params.end(), start_.begin());
    in_round_ = 0;
    round_began_ = std::chrono::steady_clock::now();
  }

  // The exchange of delta_ (in place) and the outer step; params become x0.
  void exchange_now(std::span<float> params, std::size_t steps) {
    use_residual(residual_mode::pseudo);
    tell_round(steps);
    trainer_.step(delta_);
    outer_.apply(global_, delta_);
    std::copy(global_.begin(), global_.end(), params.begin());
  }

  const step_report* end_round(std::span<float> params) {
    for (std::size_t i = 0; i < delta_.size(); ++i) delta_[i] = global_[i] - params[i];
    exchange_now(params, period_);
    period_ = next_period();
    per_step_begins_ = period_ == 1;
    round_began_ = std::chrono::steady_clock::now();
    return &trainer_.last_report();
  }

  const step_report* end_round_overlapped(std::span<float> params) {
    const bool completed = in_flight_ || pending_ready_;
    complete_exchange();
    if (pending_ready_) {
      outer_.apply(global_, pending_);
      pending_ready_ = false;
    }
    for (std::size_t i = 0; i < delta_.size(); ++i) delta_[i] = start_[i] - params[i];
    const std::size_t steps = period_;
    period_ = next_period();
    if (period_ == 1) {
      // Drain: the last local round is exchanged at once, so the per-step rounds start
      // from the same parameters on every rank.
      exchange_now(params, steps);
      period_ = next_period();
      per_step_begins_ = period_ == 1;
      if (period_ > 1) begin_round(params);
      round_began_ = std::chrono::steady_clock::now();
      return &trainer_.last_report();
    }
    std::copy(delta_.begin(), delta_.end(), pending_.begin());
    use_residual(residual_mode::pseudo);
    tell_round(steps);
    trainer_.begin_step(pending_);
    in_flight_ = true;
    for (std::size_t l = trainer_.get_layout().size(); l-- > 0;) trainer_.ready(l, 0.0);
    // This rank continues from the new global point plus its own progress of the round.
    for (std::size_t i = 0; i < params.size(); ++i) params[i] = global_[i] - delta_[i];
    std::copy(params.begin(), params.end(), start_.begin());
    round_began_ = std::chrono::steady_clock::now();
    return completed ? &trainer_.last_report() : nullptr;
  }

  options options_;
  outer_optimizer outer_;
  std::vector<float> global_;         // x0, the same on every rank
  std::vector<float> start_;          // overlap: where this rank's round started
  std::vector<float> pending_;        // overlap: the exchange in flight's buffer, then its average
  std::vector<float> idle_residual_;  // the residual of the mode the trainer is not in
  std::vector<float> delta_;          // the pseudo-gradient of the round that ends
  residual_mode mode_ = residual_mode::gradient;
  std::size_t period_ = 1;
  std::size_t in_round_ = 0;
  std::uint64_t inner_steps_ = 0;
  bool awaiting_after_ = false;
  bool in_flight_ = false;
  bool pending_ready_ = false;
  bool per_step_begins_ = false;  // a round of local steps just ended and per-step rounds follow
  std::chrono::steady_clock::time_point round_began_{};
  // Last, so destroyed first: destroying local_steps with an exchange in flight abandons it
  // (the trainer's destructor tells the communicator and joins its thread) before the
  // buffers that exchange reads are freed. complete_exchange() first keeps it.
  trainer_type trainer_;
};

}  // namespace gravac
