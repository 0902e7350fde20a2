#pragma once
//! \file
//! \brief detail::compress_on_device: the skeleton of every device compressor's compress(),
//! as compress_layers (compress/layered.hpp) is for the host compressors. The steps that
//! every device compressor takes the same way are here, once: the step is checked before
//! any memory is touched, the packet's bound for this step is checked against the output
//! buffer, the statistics are reset, the compressor's work is queued on its stream (no
//! host round trip inside it), and the host waits once. A compressor supplies the bound,
//! its kernels and the reading of its statistics.

#include "gravac/cuda/detail/nvcc_flags.hpp"
// (first, and apart from the includes below: a missing compiler option is one readable error)

#include <cstddef>
#include <exception>
#include <span>
#include <string>

#include "gravac/collective/control/detail/statistics_slots.hpp"
#include "gravac/core/error.hpp"
#include "gravac/core/layout.hpp"
#include "gravac/core/memory.hpp"
#include "gravac/core/step.hpp"
#include "gravac/cuda/cuda_error.hpp"
#include "gravac/cuda/detail/select_common.hpp"
#include "gravac/cuda/stream.hpp"

namespace gravac::detail {

//! The compressor that runs a compress_on_device step.
struct device_step {
  const char* who;    //!< its name, which starts every error message
  const layout& lay;  //!< its layout
  stream_ref stream;  //!< the stream all its work is ordered on
};

//! Throws gravac::error(backend_failure, backend::cuda) for a step whose device work failed
//! a check, naming the compressor \p who.
[[noreturn]] inline void throw_device_failure(const char* who, const char* what) {
  throw error(status::backend_failure, std::string(who) + ": " + what, -1, backend::cuda);
}

static_assert(static_cast<std::size_t>(max_gain_candidates) == device_gain_candidates,
              "the trainer stages a device step's statistics for device_gain_candidates candidates");

//! Called while a queuing failure is handled, with the stream idle: runs \p repair (which
//! must leave every layer's residual at u = g + e_old and the stream idle) and rethrows the
//! failure, a gravac::error with the compressor's name and what the residual holds.
template <class Repair>
[[noreturn]] void rethrow_after_repair(const device_step& step, Repair& repair) {
  std::string residual = "the step was abandoned and the residual holds u = g + e: nothing was sent or lost";
  try {
    repair();
  } catch (const std::exception& r) {
    GRAVAC_TRY_CUDA_NO_THROW(cudaStreamSynchronize(step.stream.get()));
    residual = std::string("the step was abandoned and its residual could not be restored (") + r.what() +
               "): a layer may hold e without g, or e less what was being sent";
  }
  try {
    throw;
  } catch (const error& err) {
    throw error(err.code(), std::string(step.who) + "::compress: " + residual + "; the failure: " + err.what(),
                err.rank(), err.engine(), err.engine_code());
  }
}

//! Runs one device compress() step of the compressor \p step on g (gradient), e (residual)
//! and \p out (the packet), all device memory:
//! 1. checks the buffers against the layout, one kept fraction per layer and at most
//!    max_gain_candidates gain candidates (gravac::error, nothing touched);
//! 2. `plan()` returns the largest packet this step can produce (host arithmetic only; it
//!    may stage the step's plan in pinned memory); it must fit in \p out;
//! 3. resets \p st for the layout and the step's gain candidates;
//! 4. `queue(packet)` queues every kernel of the step and the copies of its statistics
//!    into pinned memory on the stream; when it throws (a launch that failed, a host
//!    allocation), the stream is waited for (what it queued has finished with the
//!    buffers), `repair()` puts every layer's residual back to u = g + e_old (what the
//!    queued kernels had not yet written into e, or had taken out of it to send) and waits,
//!    and the error is rethrown: a gravac::error as one that names the compressor and says
//!    what the residual holds, anything else as it was;
//! 5. waits for the stream once;
//! 6. `finish(bound)` reads the copied statistics into \p st, checks what the device
//!    reported (throwing, after any repair of the residual, on a failure) and returns the
//!    packet size.
//! The messages are built only on failure: a step allocates nothing on the host.
template <class Plan, class Queue, class Repair, class Finish>
std::size_t compress_on_device(const device_step& step, grad_view<cuda_space> g, grad_view<cuda_space> e,
                               const step_params& p, std::span<std::byte> out, compress_stats& st, Plan&& plan,
                               Queue&& queue, Repair&& repair, Finish&& finish) {
  const auto fail = [&](const std::string& what) {
    throw error(status::invalid_argument, std::string(step.who) + "::compress: " + what);
  };
  if (g.size() != step.lay.numel() || e.size() != step.lay.numel()) fail("buffer size does not match the layout");
  if (p.kept_fraction.size() != step.lay.size()) fail("one kept fraction per layer is required");
  if (p.gain_candidates.size() > static_cast<std::size_t>(max_gain_candidates))
    fail("at most " + std::to_string(max_gain_candidates) + " gain candidates");
  const std::size_t bound = plan();
  if (bound > out.size())
    fail("packet buffer too small (needs up to " + std::to_string(bound) + " bytes, has " + std::to_string(out.size()) +
         ")");
  st.reset(step.lay.size(), p.gain_candidates.size());
  try {
    queue(out.data());
  } catch (...) {
    // Queuing failed part way (a launch error, a host allocation): the kernels already
    // queued still read g and e and write e and the packet, which the caller may free as
    // the exception unwinds. Wait for them first; the queuing error is the one reported.
    GRAVAC_TRY_CUDA_NO_THROW(cudaStreamSynchronize(step.stream.get()));
    rethrow_after_repair(step, repair);
  }
  step.stream.synchronize();
  return finish(bound);
}

}  // namespace gravac::detail
