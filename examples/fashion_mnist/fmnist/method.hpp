#pragma once
//! \file method.hpp
//! \brief The example's names for gravac's runtime composition (gravac/runtime/): a method
//! chosen by name at run time, built into a trainer<C, K, P> by gravac::runtime::make_trainer.
//! The training loop sees only the type-erased trainer.

#include <gravac/runtime/make_trainer.hpp>
#include <gravac/runtime/option_table.hpp>
#include <gravac/runtime/presets.hpp>
#include <memory>

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

}  // namespace fmnist
