#pragma once
// The host test double of CUDA: the types every part shares (errors, streams, events, dim3)
// and the one interface between the runtime and what runs on a stream (kernels, copies,
// NCCL operations): a stream_op that the runtime polls when a host thread waits.
//
// A stream is a deferred queue: nothing queued on it runs until a host thread waits for it
// (a synchronize, a query, an event wait, a copy into pageable memory) or another stream
// that is being run waits on one of its events. Strict where CUDA is lenient.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

//! CUDA's error codes (the values of the real runtime, for the ones the double returns).
enum cudaError {
  cudaSuccess = 0,
  cudaErrorInvalidValue = 1,
  cudaErrorMemoryAllocation = 2,
  cudaErrorInitializationError = 3,
  cudaErrorInvalidConfiguration = 9,
  cudaErrorInvalidDevicePointer = 17,
  cudaErrorInvalidMemcpyDirection = 21,
  cudaErrorNoDevice = 100,
  cudaErrorInvalidDevice = 101,
  cudaErrorInvalidResourceHandle = 400,
  cudaErrorNotReady = 600,
  cudaErrorIllegalAddress = 700,
  cudaErrorLaunchOutOfResources = 701,
  cudaErrorLaunchFailure = 719,
  cudaErrorUnknown = 999
};
using cudaError_t = cudaError;

struct CUstream_st;
struct CUevent_st;
using cudaStream_t = CUstream_st*;  //!< a stream handle (0, cudaStreamLegacy, cudaStreamPerThread or created)
using cudaEvent_t = CUevent_st*;    //!< an event handle

#define cudaStreamLegacy (reinterpret_cast<cudaStream_t>(0x1))
#define cudaStreamPerThread (reinterpret_cast<cudaStream_t>(0x2))

struct uint3 {
  unsigned x, y, z;
};
struct dim3 {
  unsigned x = 1, y = 1, z = 1;
  constexpr dim3(unsigned vx = 1, unsigned vy = 1, unsigned vz = 1) noexcept : x(vx), y(vy), z(vz) {}
  constexpr dim3(uint3 v) noexcept : x(v.x), y(v.y), z(v.z) {}  // NOLINT: implicit as CUDA's
  constexpr operator uint3() const noexcept { return {x, y, z}; }
};

namespace cuda_double {

//! One unit of work on a stream. poll() does as much of it as it can without blocking and
//! returns true once it is complete (a kernel or a copy completes in one poll; an NCCL
//! operation that waits for its peers returns false until they have arrived). poll() runs
//! with the device lock held, on whichever host thread is driving the stream.
struct stream_op {
  virtual ~stream_op() = default;
  [[nodiscard]] virtual bool poll() = 0;
  //! What the operation is, for the double's reports ("kernel fused_pass<<<4, 256>>>").
  [[nodiscard]] virtual std::string what() const = 0;
};

//! Queues \p op on \p s. The per-thread default stream and the legacy default stream (0,
//! cudaStreamLegacy) are resolved on the calling OS thread, as CUDA does. Returns the
//! sticky error when there is one (the op is then dropped).
cudaError_t enqueue(cudaStream_t s, std::unique_ptr<stream_op> op);

//! The stream \p s names on the calling OS thread (cudaStreamPerThread is this thread's own
//! stream; 0 and cudaStreamLegacy the legacy stream): the handle enqueue() would use.
cudaStream_t resolve(cudaStream_t s);

//! Runs queued work until every stream is empty (cudaDeviceSynchronize).
cudaError_t drain_all();

//! Sets the sticky error (as a kernel fault does on a GPU): every later runtime call
//! returns it, until the process ends.
void set_sticky(cudaError_t e, const std::string& why);

//! A defect the double detected (a race the double can see, a barrier that can never be
//! reached, memory used outside its stream order): prints "gravac CUDA double: <msg>" on
//! stderr and aborts the process. Tests of the double's hazards expect this line.
[[noreturn]] void fail(const std::string& msg);

//! The seed of every random choice the double makes (block order, thread order, stream
//! interleaving): GRAVAC_CUDA_DOUBLE_SEED, or 1. The same seed gives the same bits.
std::uint64_t seed();

//! A fresh 64-bit value derived from seed() and a process-wide counter (deterministic for a
//! deterministic sequence of calls).
std::uint64_t next_seed();

}  // namespace cuda_double

namespace cuda_double {

//! Sets the error cudaGetLastError() returns next (a launch's configuration error: not
//! sticky), unless a sticky error is already set.
void set_last_error(cudaError_t e);

//! Kernel launches accepted in this process so far (what a launch-count test reads: the
//! difference over a step). A launch refused for its configuration or by fail_launch_in,
//! or dropped under a sticky error, does not count.
std::uint64_t launches();

//! Makes the launch \p n launches from now (0: the next one) fail as CUDA fails a launch
//! it cannot start (cudaErrorLaunchOutOfResources from cudaGetLastError, not sticky): the
//! kernel is not queued and later launches run. Once; fail_launch_in(-1) cancels it. For
//! the tests of a failure at every point of a queued step.
void fail_launch_in(long long n);

//! The sticky error, or cudaSuccess.
cudaError_t sticky_error();

//! Runs \p s (as enqueue() resolves it on this thread) until it is empty; blocks, polling.
//! A wait that makes no progress for GRAVAC_CUDA_DOUBLE_HANG_S seconds (default 120) is
//! reported by fail(): the double names the operation it is stuck behind.
cudaError_t synchronize_stream(cudaStream_t s, const char* why);

}  // namespace cuda_double
