#pragma once
//! \file step_buffers.hpp
//! \brief What a collective works on during one step, and the shared timing helper.

#include <chrono>

#include "gravac/collective/control/step_control.hpp"
#include "gravac/core/detail/seconds_since.hpp"
#include "gravac/core/memory.hpp"

namespace gravac {

//! The gradient (in: local, out: averaged) and the error-feedback residual of one step.
template <class Space>
struct step_buffers {
  grad_view<Space> grad;       //!< local gradient in, averaged gradient out
  grad_view<Space> residual;   //!< error-feedback residual, updated in place
  bool residual_zero = false;  //!< the residual is known to be all zero (lets dense steps skip a pass)
  //! Control values that ride in the step's collective (step_control.hpp); null: none. A
  //! collective carries them and leaves their sums over the ranks in it.
  step_control* control = nullptr;
};

}  // namespace gravac
