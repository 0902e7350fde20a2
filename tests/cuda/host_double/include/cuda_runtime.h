#pragma once
// The host test double's cuda_runtime.h: the CUDA runtime API that gravac and its GPU tests
// call, implemented in src/runtime.cpp over deferred stream queues (see cuda_double/core.hpp).
// Only what the project uses is here; a call the double does not know fails to compile.

#include <cstddef>

#include "cuda_double/core.hpp"

enum cudaMemcpyKind {
  cudaMemcpyHostToHost = 0,
  cudaMemcpyHostToDevice = 1,
  cudaMemcpyDeviceToHost = 2,
  cudaMemcpyDeviceToDevice = 3,
  cudaMemcpyDefault = 4
};

enum cudaMemoryType {
  cudaMemoryTypeUnregistered = 0,
  cudaMemoryTypeHost = 1,
  cudaMemoryTypeDevice = 2,
  cudaMemoryTypeManaged = 3
};

struct cudaPointerAttributes {
  cudaMemoryType type = cudaMemoryTypeUnregistered;
  int device = 0;
  void* devicePointer = nullptr;
  void* hostPointer = nullptr;
};

enum cudaDeviceAttr { cudaDevAttrMaxThreadsPerBlock = 1, cudaDevAttrMultiProcessorCount = 16 };

inline constexpr unsigned cudaStreamDefault = 0x0;
inline constexpr unsigned cudaStreamNonBlocking = 0x1;
inline constexpr unsigned cudaEventDefault = 0x0;
inline constexpr unsigned cudaEventBlockingSync = 0x1;
inline constexpr unsigned cudaEventDisableTiming = 0x2;
inline constexpr unsigned cudaHostAllocDefault = 0x0;

// Errors.
cudaError_t cudaGetLastError();
cudaError_t cudaPeekAtLastError();
const char* cudaGetErrorName(cudaError_t e);
const char* cudaGetErrorString(cudaError_t e);

// Devices.
cudaError_t cudaGetDeviceCount(int* n);
cudaError_t cudaSetDevice(int d);
cudaError_t cudaGetDevice(int* d);
cudaError_t cudaDeviceGetAttribute(int* v, cudaDeviceAttr a, int d);
cudaError_t cudaDeviceSynchronize();

// Memory.
cudaError_t cudaMalloc(void** p, std::size_t bytes);
cudaError_t cudaFree(void* p);
cudaError_t cudaMallocAsync(void** p, std::size_t bytes, cudaStream_t s);
cudaError_t cudaFreeAsync(void* p, cudaStream_t s);
cudaError_t cudaMallocHost(void** p, std::size_t bytes);
cudaError_t cudaHostAlloc(void** p, std::size_t bytes, unsigned flags);
cudaError_t cudaFreeHost(void* p);
cudaError_t cudaPointerGetAttributes(cudaPointerAttributes* a, const void* p);
cudaError_t cudaMemcpy(void* dst, const void* src, std::size_t bytes, cudaMemcpyKind k);
cudaError_t cudaMemcpyAsync(void* dst, const void* src, std::size_t bytes, cudaMemcpyKind k, cudaStream_t s = nullptr);
cudaError_t cudaMemset(void* p, int v, std::size_t bytes);
cudaError_t cudaMemsetAsync(void* p, int v, std::size_t bytes, cudaStream_t s = nullptr);

// Streams.
cudaError_t cudaStreamCreate(cudaStream_t* s);
cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned flags);
cudaError_t cudaStreamDestroy(cudaStream_t s);
cudaError_t cudaStreamSynchronize(cudaStream_t s);
cudaError_t cudaStreamQuery(cudaStream_t s);
cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned flags = 0);

// Events.
cudaError_t cudaEventCreate(cudaEvent_t* e);
cudaError_t cudaEventCreateWithFlags(cudaEvent_t* e, unsigned flags);
cudaError_t cudaEventDestroy(cudaEvent_t e);
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s = nullptr);
cudaError_t cudaEventQuery(cudaEvent_t e);
cudaError_t cudaEventSynchronize(cudaEvent_t e);
cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end);

namespace cuda_double {

//! How often a call that CUDA documents as synchronizing the device was made, so that a
//! test can check that a step makes none: the implicit synchronizations of the CUDA
//! programming guide (cudaMalloc, cudaMallocHost and cudaHostAlloc, cudaMemset, a
//! synchronous cudaMemcpy; cudaFree and cudaFreeHost, which wait for all queued work) and
//! the explicit device-wide one (cudaDeviceSynchronize). The double drains the device only
//! at cudaFree, cudaFreeHost and cudaDeviceSynchronize; the others are counted, not
//! modelled (draining there would hide a missing wait).
std::size_t implicit_device_syncs();

//! The calls implicit_device_syncs() counted, by name: "cudaFree x2, cudaMallocHost x1"
//! ("none"), for a failing test's message.
std::string device_sync_calls();

//! How often \p call ("cudaMallocHost") was counted by implicit_device_syncs().
std::size_t device_syncs_of(const std::string& call);

//! How often a host thread blocked for one stream or event (cudaStreamSynchronize,
//! cudaEventSynchronize, a synchronous copy or memset, a copy into pageable memory): not
//! device-wide, so not in implicit_device_syncs().
std::size_t host_waits();

//! The memory space of \p p: cudaMemoryTypeDevice for live device memory the double
//! allocated, cudaMemoryTypeHost for pinned memory, cudaMemoryTypeUnregistered otherwise.
cudaMemoryType memory_type(const void* p);

//! Checks that [p, p + bytes) lies in live device memory (allocated, reached by its stream,
//! not freed); fail()s naming \p who otherwise. Copies and NCCL operations call it when
//! they run.
void check_device_range(const void* p, std::size_t bytes, const char* who);

}  // namespace cuda_double
