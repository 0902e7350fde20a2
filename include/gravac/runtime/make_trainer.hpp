#pragma once
//! \file make_trainer.hpp
//! \brief From a runtime method to a trainer: every composition the library accepts
//! (composition_verdict of the library's own compressors, collectives and policies, so the
//! list is never written by hand), built over any host communicator. Link gravac::runtime,
//! where the instantiations are compiled once.

#include <memory>
#include <string>
#include <vector>

#include "gravac/comm/communicator_ref.hpp"
#include "gravac/concepts/composition.hpp"
#include "gravac/core/layout.hpp"
#include "gravac/runtime/any_trainer.hpp"
#include "gravac/runtime/method_config.hpp"

namespace gravac::runtime {

//! The communicator a runtime trainer runs on (any host engine, possibly simulated).
using host_comm = communicator_ref<host_space>;

//! Builds trainer<C, K, P> for \p m over \p comm and \p lay. Throws gravac::error
//! (invalid_argument) saying why when the library refuses the composition, and the
//! trainer's own errors for invalid options.
std::unique_ptr<any_trainer> make_trainer(const method_config& m, host_comm comm, const layout& lay);

//! Why the library refuses \p m's composition (rejection::none: it accepts it).
rejection verdict(const method_config& m);

//! Throws gravac::error (invalid_argument) with the reason and the alternatives when
//! verdict(m) is not none.
void require_accepted(const method_config& m);

//! One composition of the library's compressors, collectives and policies.
struct composition {
  compressor_id compressor;  //!< the compressor
  collective_id collective;  //!< the collective
  policy_id policy;          //!< the policy
  rejection verdict;         //!< none: accepted; otherwise why not
};

//! Every composition of the named parts, accepted or not, in name-table order.
std::vector<composition> compositions();

}  // namespace gravac::runtime
