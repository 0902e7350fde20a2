#pragma once
//! \file any_trainer.hpp
//! \brief One trainer<C, K, P> behind a virtual interface: what every front end that
//! picks a method at run time sees (the example's training loop, the C ABI, Python).

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "gravac/core/layout.hpp"
#include "gravac/core/step.hpp"

namespace gravac::runtime {

//! A type-erased trainer: the operations of trainer<C, K, P> a training loop calls, and
//! its state as bytes. Made by make_trainer.
class any_trainer {
 public:
  virtual ~any_trainer() = default;
  //! Runs one step on the flat gradient buffer (left holding the rank average).
  virtual const step_report& step(std::span<float> grads) = 0;
  //! Starts an asynchronous step on \p grads, which backward is about to fill
  //! (trainer::begin_step): the buckets run on the trainer's communication thread as
  //! ready() fills them.
  virtual void begin_step(std::span<float> grads) = 0;
  //! Layer \p layer's gradient is final, at \p ready_s seconds on the modeled timeline of
  //! the step (from begin_step) (trainer::ready).
  virtual void ready(std::size_t layer, double ready_s) = 0;
  //! Layer \p layer's gradient is final now: its time on the timeline is the wall time since
  //! begin_step (trainer::ready).
  virtual void ready(std::size_t layer) = 0;
  //! Ends the asynchronous step: waits for every bucket, leaves the rank average in the
  //! buffer given to begin_step and returns the step's report (trainer::finish).
  virtual const step_report& finish() = 0;
  //! The last completed step's report (a default report before the first step).
  [[nodiscard]] virtual const step_report& last_report() const = 0;
  //! Steps completed (restored by load_state).
  [[nodiscard]] virtual std::uint64_t steps() const = 0;
  //! Buckets the trainer aggregates a step in.
  [[nodiscard]] virtual std::size_t buckets() const = 0;
  //! The layout the trainer was built for.
  [[nodiscard]] virtual const layout& get_layout() const = 0;
  //! Marks the end of an interval (an epoch) for the policy.
  virtual void end_interval(const interval_info& info) = 0;
  //! The parameters the policy chose for the last step.
  [[nodiscard]] virtual const step_params& last_params() const = 0;
  //! A short line about the policy's state (phase, ratio), for progress output.
  [[nodiscard]] virtual std::string policy_state() const = 0;
  //! This rank's state (residuals, policy, compressor and collective state, step counter)
  //! as a gravac checkpoint. Rank-local: no collective.
  [[nodiscard]] virtual std::vector<std::byte> save_state() const = 0;
  //! Restores what save_state() returned on the same rank for the same layout. Rank-local;
  //! throws gravac::error without changing the trainer when the bytes are unusable.
  virtual void load_state(std::span<const std::byte> bytes) = 0;
  //! Writes save_state() to \p path, atomically (rank-local).
  virtual void save_checkpoint(const std::string& path) = 0;
  //! Restores from \p path, written by save_checkpoint on the same rank (rank-local).
  virtual void restore_checkpoint(const std::string& path) = 0;
};

}  // namespace gravac::runtime
