#pragma once
//! \file
//! \brief non_finite_action: what the trainer does when a step's u = g + e is not finite
//! (trainer::options::on_non_finite).

#include <cstdint>

namespace gravac {

//! What the trainer does when u = g + e (the gradient plus the error-feedback residual, as
//! every compressor computes it) holds NaN or infinity: a non-finite gradient, or a finite
//! one whose sum with the residual overflows the float range.
enum class non_finite_action : std::uint8_t {
  //! throw gravac::error on every rank, naming the layer (the failing rank) or the failing
  //! rank (the others). The flag rides in the step's collective, so the others learn of it
  //! after sending: each gives what it sent back to its residual (it then holds u = g + e);
  //! the failing rank's residual is unchanged. The step counter does not advance. On
  //! device memory (no control plane rides in the device collectives) every rank screens
  //! its whole u before anything is sent and one small Allreduce decides: every residual
  //! is then unchanged. The asynchronous device step decides so per bucket, before each is
  //! sent: the buckets sent before give back what they sent, as on the host.
  throw_error,
  //! skip the step on every rank: gradient zeroed, residuals untouched. The ranks must know
  //! before anything is sent, which costs one small Allreduce per step.
  skip_step,
  zero_values,  //!< zero g wherever g + e is not finite (u is then the residual there) and go on
  ignore,       //!< do not check (fastest; the caller guarantees finite gradients)
};

}  // namespace gravac
