#pragma once
//! \file method.hpp
//! \brief The example's names for gravac's runtime composition (gravac/runtime/): a method
//! chosen by name at run time, built into a trainer<C, K, P> by gravac::runtime::make_trainer.
//! The training loop sees only the type-erased trainer.

#include <gravac/runtime/make_local_steps.hpp>
#include <gravac/runtime/make_trainer.hpp>
#include <gravac/runtime/option_table.hpp>
#include <gravac/runtime/presets.hpp>
#include <memory>
#include <string>

namespace fmnist {

using gravac::runtime::collective_id;
using gravac::runtime::collective_names;
using gravac::runtime::compressor_id;
using gravac::runtime::compressor_names;
using gravac::runtime::method_config;
using gravac::runtime::method_name;
using gravac::runtime::name_of;
using gravac::runtime::named;
using gravac::runtime::policy_id;
using gravac::runtime::policy_names;

//! The training loop's view of the trainer.
using stepper = gravac::runtime::any_trainer;
//! The communicator a stepper runs on (any engine, possibly a simulated network).
using host_comm = gravac::runtime::host_comm;

//! Builds the trainer for \p m over \p comm and \p lay (gravac::runtime::make_trainer:
//! throws gravac::error naming what the library accepts when it refuses the composition).
inline std::unique_ptr<stepper> make_stepper(const method_config& m, host_comm comm, const gravac::layout& lay) {
  return gravac::runtime::make_trainer(m, comm, lay);
}

//! The training loop's view of local-step training (--local-steps).
using local_stepper = gravac::runtime::any_local_steps;

//! Builds local steps for \p m over \p comm and \p lay from \p params
//! (gravac::runtime::make_local_steps).
inline std::unique_ptr<local_stepper> make_local_stepper(const method_config& m, host_comm comm,
                                                         const gravac::layout& lay, std::span<const float> params) {
  return gravac::runtime::make_local_steps(m, comm, lay, params);
}

//! The run's method as text: method_name(m), or for local steps what rounds they take over
//! which exchange ("local steps H 10, nesterov, over sparseloco + allgather").
inline std::string run_method_name(const method_config& m, bool local_steps) {
  if (!local_steps) return method_name(m);
  const std::string rounds = m.local.adaptive
                                 ? "adaptive local steps (H <= " + std::to_string(m.local.policy.max_period) + ")"
                                 : "local steps H " + std::to_string(m.local.period);
  return rounds + ", " + (m.local.outer.kind == gravac::outer_kind::averaging ? "averaging" : "nesterov") + ", over " +
         std::string(name_of(compressor_names, m.compressor)) + " + " +
         std::string(name_of(collective_names, m.collective));
}

}  // namespace fmnist
