#pragma once
//! \file make_local_steps.hpp
//! \brief From a runtime method to local-step training: local_steps<C, K, P> with the
//! method's compressor and collective for the exchanges, and P the fixed policy (H =
//! method_config::local.period) or local_steps_policy (local.adaptive: H and the kept
//! fraction chosen as the network and the compute per step are measured). Link
//! gravac::runtime.

#include <memory>
#include <span>

#include "gravac/concepts/composition.hpp"
#include "gravac/core/layout.hpp"
#include "gravac/runtime/any_local_steps.hpp"
#include "gravac/runtime/make_trainer.hpp"
#include "gravac/runtime/method_config.hpp"

namespace gravac::runtime {

//! Builds local_steps<C, K, P> for \p m over \p comm and \p lay, starting from \p params
//! (the same on every rank). Throws gravac::error (invalid_argument) saying why when the
//! library refuses the composition or the policy is not `fixed`, and local_steps' own errors
//! for invalid options.
std::unique_ptr<any_local_steps> make_local_steps(const method_config& m, host_comm comm, const layout& lay,
                                                  std::span<const float> params);

//! Why the library refuses \p m's exchange (rejection::none: it accepts it): the verdict of
//! its compressor and collective under the policy of its rounds.
rejection local_verdict(const method_config& m);

//! Throws gravac::error (invalid_argument) with the reason when make_local_steps would
//! refuse \p m (its composition, or a policy other than `fixed`).
void require_local_accepted(const method_config& m);

}  // namespace gravac::runtime
