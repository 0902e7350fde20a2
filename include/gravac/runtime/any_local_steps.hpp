#pragma once
//! \file any_local_steps.hpp
//! \brief One local_steps<C, K, P> behind a virtual interface: local-step training (local
//! SGD, DiLoCo and its family) chosen by name at run time, for the front ends that pick a
//! method at run time (the example's training loop, the C ABI, Python).

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "gravac/core/layout.hpp"
#include "gravac/core/step.hpp"

namespace gravac::runtime {

//! A type-erased local_steps<C, K, P> (local_steps.hpp): the calls a training loop makes
//! around its inner optimizer, and the state as bytes. Made by make_local_steps. Host
//! memory only.
class any_local_steps {
 public:
  virtual ~any_local_steps() = default;
  //! After backward, before the inner optimizer's step (local_steps::before_inner_step): in
  //! a per-step round (H = 1) \p grads becomes the rank average and the exchange's report is
  //! returned; in a round of local steps \p grads stays this rank's and nullptr is returned.
  virtual const step_report* before_inner_step(std::span<float> grads) = 0;
  //! After the inner optimizer's step on \p params (local_steps::after_inner_step): at the
  //! end of a round the exchange and the outer step run and \p params becomes the point to
  //! continue from; returns the report of the exchange that completed (nullptr when none).
  virtual const step_report* after_inner_step(std::span<float> params) = 0;
  //! Ends the round in progress now (local_steps::finish_round): the ranks exchange their
  //! progress, the outer step runs and \p params becomes the global point, the same on every
  //! rank. Collective. Returns the report of the last exchange it completed, or nullptr.
  virtual const step_report* finish_round(std::span<float> params) = 0;
  //! Completes an exchange in flight (overlap); collective, at the same inner step on every
  //! rank. Call it after the last inner step.
  virtual void complete_exchange() = 0;
  //! Whether the call that just ended a round of local steps began per-step rounds (H = 1):
  //! the inner optimizer's state, each rank's own so far, must be made the same on every
  //! rank before the next inner step (local_steps::inner_state_must_agree).
  [[nodiscard]] virtual bool inner_state_must_agree() const = 0;
  //! Replaces \p state (the inner optimizer's state) with its average over the ranks, the
  //! same bits on every rank (local_steps::average_inner_state). Collective.
  virtual void average_inner_state(std::span<float> state) = 0;
  //! Marks the end of an interval (an epoch) for the policy.
  virtual void end_interval(const interval_info& info) = 0;
  //! H of the round in progress.
  [[nodiscard]] virtual std::size_t period() const = 0;
  //! Inner steps taken in the round in progress.
  [[nodiscard]] virtual std::size_t round_step() const = 0;
  //! Inner steps taken in all (restored by load_state).
  [[nodiscard]] virtual std::uint64_t inner_steps() const = 0;
  //! Exchanges completed (per-step rounds count one each).
  [[nodiscard]] virtual std::uint64_t exchanges() const = 0;
  //! Whether an exchange runs in the background (overlap).
  [[nodiscard]] virtual bool exchange_in_flight() const = 0;
  //! The global parameters as of the last exchange, the same on every rank.
  [[nodiscard]] virtual std::span<const float> global_params() const = 0;
  //! The last completed exchange's report (a default report before the first).
  [[nodiscard]] virtual const step_report& last_report() const = 0;
  //! The layout it was built for.
  [[nodiscard]] virtual const layout& get_layout() const = 0;
  //! A short line about the rounds (H, the kept fraction), for progress output.
  [[nodiscard]] virtual std::string policy_state() const = 0;
  //! The state between inner steps (local_steps::save: the global point, the round, the
  //! outer optimizer, both residuals, the exchange's trainer). Completes an exchange in
  //! flight first, so every rank calls it at the same inner step.
  [[nodiscard]] virtual std::vector<std::byte> save_state() = 0;
  //! Restores what save_state() returned on the same rank for the same method and layout;
  //! throws gravac::error, changing nothing, when the bytes are unusable.
  virtual void load_state(std::span<const std::byte> bytes) = 0;
};

}  // namespace gravac::runtime
