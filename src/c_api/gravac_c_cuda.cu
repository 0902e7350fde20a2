// SPDX-License-Identifier: MIT
// The CUDA half of the C ABI (src/c_api/device_path.hpp): device communicators over the
// caller's callbacks and device trainers of the runtime composition (gravac::runtime_cuda).
#include <cstring>

#include "device_path.hpp"
#include "gravac/cuda/callback_device_communicator.hpp"
#include "gravac/cuda/cuda_error.hpp"
#include "gravac/runtime/make_device_trainer.hpp"

namespace gravac::c_device {

struct comm {
  explicit comm(const gravac_device_comm_callbacks& cb) : engine(cb) {}
  callback_device_communicator engine;
};

void comm_deleter::operator()(comm* c) const noexcept { delete c; }

comm_ptr make_comm(const gravac_device_comm_callbacks& cb) { return comm_ptr(new comm(cb)); }

int rank_of(const comm& c) noexcept { return c.engine.rank(); }

std::vector<std::uint64_t> gather(comm& c, std::uint64_t mine) {
  device_byte_buffer out;
  out.set_stream(c.engine.callback_stream());
  std::vector<std::size_t> sizes;
  c.engine.allgatherv(std::as_bytes(std::span(&mine, 1)), out, sizes);
  for (auto s : sizes) require(s == sizeof mine, "a rank sent a malformed method signature");
  std::vector<std::uint64_t> all(sizes.size());
  if (!all.empty())
    GRAVAC_TRY_CUDA(cudaMemcpy(all.data(), out.data(), all.size() * sizeof mine, cudaMemcpyDeviceToHost));
  return all;
}

void order_after(comm& c, void* stream) noexcept { c.engine.set_stream(static_cast<cudaStream_t>(stream)); }

bool has_device_form(const runtime::method_config& m) noexcept { return runtime::has_device_form(m.compressor); }

std::string device_forms() {
  std::string forms;
  for (const auto& c : runtime::compressor_names)
    if (runtime::has_device_form(c.value)) forms += (forms.empty() ? "" : ", ") + std::string(c.name);
  return forms;
}

void require_accepted(const runtime::method_config& m) { runtime::require_device_accepted(m); }

std::unique_ptr<runtime::any_trainer> make_trainer(const runtime::method_config& m, comm& c, const layout& lay,
                                                   void* stream) {
  const stream_ref s(static_cast<cudaStream_t>(stream));
  c.engine.set_stream(s);
  return runtime::make_device_trainer(m, runtime::device_comm(c.engine), lay, s);
}

void order(void* waiter, void* producer) {
  if (waiter == producer) return;
  cudaEvent_t e = nullptr;
  GRAVAC_TRY_CUDA(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  const cudaError_t r = cudaEventRecord(e, static_cast<cudaStream_t>(producer));
  const cudaError_t w = r == cudaSuccess ? cudaStreamWaitEvent(static_cast<cudaStream_t>(waiter), e, 0) : r;
  (void)cudaEventDestroy(e);  // released once the wait is satisfied, as CUDA defines
  GRAVAC_TRY_CUDA(w);
}

void per_thread_default_after(void* producer) { order(cudaStreamPerThread, producer); }

}  // namespace gravac::c_device
