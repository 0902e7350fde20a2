#pragma once
// The CUDA half of the C ABI, as gravac_c.cpp sees it: no CUDA type crosses this header,
// so gravac_c.cpp stays host C++. Defined in gravac_c_cuda.cu (compiled as CUDA, or as C++
// against the host test double of CUDA in the tests), and linked only when the build has
// the CUDA path (GRAVAC_C_WITH_CUDA); without it, the ABI answers GRAVAC_UNSUPPORTED for
// device memory and never calls these.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "gravac/layout.hpp"
#include "gravac/runtime/any_trainer.hpp"
#include "gravac/runtime/method_config.hpp"
#include "gravac_c.h"

namespace gravac::c_device {

//! A gravac::callback_device_communicator.
struct comm;
struct comm_deleter {
  void operator()(comm* c) const noexcept;
};
using comm_ptr = std::unique_ptr<comm, comm_deleter>;

//! A device communicator over \p cb (gravac::error on an invalid table).
comm_ptr make_comm(const gravac_device_comm_callbacks& cb);
//! Its rank.
int rank_of(const comm& c) noexcept;
//! Every rank's \p mine, in rank order (the agreement of gravac_trainer_create).
std::vector<std::uint64_t> gather(comm& c, std::uint64_t mine);
//! Orders \p c's later collectives after the work queued on \p stream (a cudaStream_t).
void order_after(comm& c, void* stream) noexcept;

//! Whether \p m's compressor has a device form (gravac::runtime::has_device_form).
bool has_device_form(const runtime::method_config& m) noexcept;
//! The compressors that have one, comma-separated.
std::string device_forms();
//! gravac::runtime::require_device_accepted.
void require_accepted(const runtime::method_config& m);
//! gravac::runtime::make_device_trainer over \p c, the compressors on \p stream.
std::unique_ptr<runtime::any_trainer> make_trainer(const runtime::method_config& m, comm& c, const layout& lay,
                                                   void* stream);

//! Makes the work queued later on \p waiter wait for the work queued so far on \p producer
//! (both cudaStream_t; an event). Nothing when they are the same stream.
void order(void* waiter, void* producer);

//! Makes the work queued later on the calling thread's per-thread default stream wait for
//! the work queued so far on \p producer (a cudaStream_t).
void per_thread_default_after(void* producer);

}  // namespace gravac::c_device
