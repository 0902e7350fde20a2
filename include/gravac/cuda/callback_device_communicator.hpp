#pragma once
//! \file callback_device_communicator.hpp
//! \brief A device-memory communicator over collectives the caller provides as C callbacks
//! (gravac_device_comm_callbacks of gravac_c.h): how the C ABI hands gravac a transport
//! over CUDA memory (a framework's process group, the caller's own NCCL). Part of target
//! gravac::cuda.

#include "gravac/cuda/detail/nvcc_flags.hpp"
// (first, and apart from the includes below: a missing compiler option is one readable error)

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "gravac/concepts/concepts.hpp"
#include "gravac/core/error.hpp"
#include "gravac/core/memory.hpp"
#include "gravac/cuda/cuda_error.hpp"
#include "gravac/cuda/device_buffer.hpp"
#include "gravac/cuda/stream.hpp"
#include "gravac_c.h"

namespace gravac {

//! A Communicator over device memory whose collectives are C callbacks that receive device
//! pointers and the stream to order on. Its contract is nccl_communicator's: float spans
//! and byte buffers are device memory, double spans (statistics) host memory, byte_buffer
//! a device buffer, and every operation has completed when it returns.
//!
//! Streams: the callbacks run on a non-blocking stream the communicator owns (never a
//! default stream). Each operation first orders that stream after the work queued so far
//! on the producer stream (the one given at construction: the trainer's compressors run
//! there) and on the stream of any output buffer it grows, by an event; it then calls the
//! callback with the owned stream, and waits for that stream after the callback returns,
//! so a callback may complete its collective before returning or leave it queued on the
//! stream. Host values (the double statistics, the sizes of allgatherv) go through pinned
//! staging and a device scratch buffer; a host input to allgatherv (the trainer's layout
//! check) is staged to the device. allgatherv is an allgather of the 8-byte sizes, then one
//! padded to the largest, compacted on the device. A callback that returns nonzero becomes
//! gravac::error(status::backend_failure).
class callback_device_communicator {
 public:
  //! Opt-in tag for the Communicator concept.
  using communicator_tag = void;
  //! Buffers live in device memory.
  using memory_space = cuda_space;
  //! allgatherv's output buffer (device memory).
  using byte_buffer = device_byte_buffer;

  //! Over a copy of \p cb, ordering every operation after the work queued on \p producer.
  //! gravac::error (invalid_argument) when a callback is NULL or rank and size disagree.
  //! `cb.user` must outlive this object.
  explicit callback_device_communicator(const gravac_device_comm_callbacks& cb, stream_ref producer = {})
      : cb_(cb), producer_(producer) {
    require(cb_.size > 0, "device callback communicator: size must be positive, got " + std::to_string(cb_.size));
    require(cb_.rank >= 0 && cb_.rank < cb_.size, "device callback communicator: rank " + std::to_string(cb_.rank) +
                                                      " is out of range [0, " + std::to_string(cb_.size) + ")");
    require(cb_.allreduce && cb_.allgather && cb_.broadcast && cb_.barrier,
            "device callback communicator: allreduce, allgather, broadcast and barrier are required");
    GRAVAC_TRY_CUDA(cudaEventCreateWithFlags(&ordered_, cudaEventDisableTiming));
    scratch_.set_stream(own_);
    padded_in_.set_stream(own_);
    padded_out_.set_stream(own_);
    const auto n = static_cast<std::size_t>(cb_.size);
    sizes_dev_.set_stream(own_);
    sizes_dev_.resize(n + 1);  // [0, n): gathered; n: this rank's
    host_sizes_.resize(n + 1);
    host_values_.resize(initial_host_values);
    scratch_.resize(initial_host_values);
  }
  callback_device_communicator(const callback_device_communicator&) = delete;
  callback_device_communicator& operator=(const callback_device_communicator&) = delete;
  //! Waits for the owned stream (its buffers are freed on it); never throws.
  ~callback_device_communicator() {
    (void)cudaStreamSynchronize(own_.ref().get());
    if (ordered_) GRAVAC_TRY_CUDA_NO_THROW(cudaEventDestroy(ordered_));
  }

  //! This rank.
  [[nodiscard]] int rank() const noexcept { return cb_.rank; }
  //! Number of ranks.
  [[nodiscard]] int size() const noexcept { return cb_.size; }
  //! The stream whose earlier work every operation is ordered after.
  [[nodiscard]] stream_ref stream() const noexcept { return producer_; }
  //! Orders later operations after \p producer instead.
  void set_stream(stream_ref producer) noexcept { producer_ = producer; }
  //! The stream the callbacks are given (owned, non-blocking).
  [[nodiscard]] stream_ref callback_stream() const noexcept { return own_; }

  //! Sums device floats over the ranks, in place.
  void allreduce_sum(std::span<float> d) {
    if (d.empty()) return;
    order_after(producer_);
    check(cb_.allreduce(cb_.user, d.data(), d.size(), GRAVAC_FLOAT32, GRAVAC_SUM, s()), "allreduce");
    wait("allreduce");
  }
  //! Sums host doubles over the ranks, in place.
  void allreduce_sum(std::span<double> d) { host_reduce(d, GRAVAC_SUM); }
  //! Elementwise maximum of host doubles over the ranks, in place.
  void allreduce_max(std::span<double> d) { host_reduce(d, GRAVAC_MAX); }

  //! Stages reductions of up to \p doubles host doubles so that none allocates: a larger
  //! one would grow the pinned staging in the step, and cudaMallocHost synchronizes the
  //! whole device. Call between steps (it may allocate and free pinned memory); the trainer
  //! calls it at construction with the most values one reduction of its device step
  //! carries. Never shrinks.
  void reserve_host_staging(std::size_t doubles) {
    if (host_values_.size() >= doubles) return;
    host_values_.resize(doubles);
    scratch_.resize(doubles);  // as large (stream-ordered, on the owned stream)
  }

  //! Gathers every rank's bytes (device or host memory) back to back in rank order into
  //! \p out (device memory); \p sizes receives each rank's byte count.
  void allgatherv(std::span<const std::byte> in, byte_buffer& out, std::vector<std::size_t>& sizes) {
    const auto n = static_cast<std::size_t>(cb_.size);
    order_after(producer_);
    host_sizes_[n] = in.size();
    GRAVAC_TRY_CUDA(cudaMemcpyAsync(sizes_dev_.data() + n, host_sizes_.data() + n, sizeof(std::uint64_t),
                                    cudaMemcpyHostToDevice, s()));
    check(cb_.allgather(cb_.user, sizes_dev_.data() + n, sizeof(std::uint64_t), sizes_dev_.data(), s()), "allgather");
    GRAVAC_TRY_CUDA(
        cudaMemcpyAsync(host_sizes_.data(), sizes_dev_.data(), n * sizeof(std::uint64_t), cudaMemcpyDeviceToHost, s()));
    wait("allgather");
    sizes.resize(n);
    std::size_t total = 0, largest = 0;
    for (std::size_t r = 0; r < n; ++r) {
      sizes[r] = static_cast<std::size_t>(host_sizes_[r]);
      total += sizes[r];
      largest = std::max(largest, sizes[r]);
    }
    if (sizes[static_cast<std::size_t>(cb_.rank)] != in.size())
      throw error(status::backend_failure, "callback allgather: this rank's size came back changed", cb_.rank);
    out.resize(total);
    if (largest == 0) return;
    order_after(out.stream());  // a grown buffer is allocated in the order of its own stream
    padded_in_.resize(largest);
    padded_out_.resize(largest * n);
    if (!in.empty())
      GRAVAC_TRY_CUDA(cudaMemcpyAsync(padded_in_.data(), in.data(), in.size(),
                                      is_device_pointer(in.data()) ? cudaMemcpyDeviceToDevice : cudaMemcpyHostToDevice,
                                      s()));
    if (in.size() < largest)  // deterministic padding
      GRAVAC_TRY_CUDA(cudaMemsetAsync(padded_in_.data() + in.size(), 0, largest - in.size(), s()));
    check(cb_.allgather(cb_.user, padded_in_.data(), largest, padded_out_.data(), s()), "allgather");
    std::size_t at = 0;
    for (std::size_t r = 0; r < n; ++r) {
      if (sizes[r] > 0)
        GRAVAC_TRY_CUDA(cudaMemcpyAsync(out.data() + at, padded_out_.data() + r * largest, sizes[r],
                                        cudaMemcpyDeviceToDevice, s()));
      at += sizes[r];
    }
    wait("allgather");
  }

  //! Copies \p root's device bytes into every rank's \p d.
  void broadcast(std::span<std::byte> d, int root) {
    require(root >= 0 && root < cb_.size, "broadcast: root out of range");
    if (d.empty()) return;
    order_after(producer_);
    check(cb_.broadcast(cb_.user, d.data(), d.size(), root, s()), "broadcast");
    wait("broadcast");
  }
  //! Copies \p root's device values into every rank's \p d.
  template <class T>
  void broadcast_values(std::span<T> d, int root) {
    broadcast(std::as_writable_bytes(d), root);
  }

  //! Waits for every rank.
  void barrier() {
    check(cb_.barrier(cb_.user, s()), "barrier");
    wait("barrier");
  }

 private:
  [[nodiscard]] cudaStream_t s() const noexcept { return own_.ref().get(); }

  // The owned stream waits for the work queued so far on \p producer.
  void order_after(stream_ref producer) {
    GRAVAC_TRY_CUDA(cudaEventRecord(ordered_, producer.get()));
    GRAVAC_TRY_CUDA(cudaStreamWaitEvent(s(), ordered_, 0));
  }

  void check(int rc, const char* what) const {
    if (rc != 0)
      throw error(status::backend_failure, std::string("callback ") + what + " returned " + std::to_string(rc),
                  cb_.rank);
  }

  // Waits for what the callback queued on the owned stream (a failure of that work is a
  // failure of the callback's collective).
  void wait(const char* what) const {
    const cudaError_t e = cudaStreamSynchronize(s());
    if (e != cudaSuccess)
      throw error(status::backend_failure,
                  std::string("callback ") + what + ": the stream it was given failed: " + cudaGetErrorName(e),
                  cb_.rank);
  }

  static bool is_device_pointer(const void* p) {
    cudaPointerAttributes a{};
    if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
      (void)cudaGetLastError();
      return false;
    }
    return a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged;
  }

  void host_reduce(std::span<double> d, gravac_reduce_op op) {
    if (d.empty()) return;
    if (host_values_.size() < d.size()) {  // not reserved: grows, never frees pinned memory during a step
      detail::grow_pinned_keeping(host_values_, d.size(), retired_host_values_);
      scratch_.resize(host_values_.size());
    }
    std::copy(d.begin(), d.end(), host_values_.data());
    order_after(producer_);
    GRAVAC_TRY_CUDA(cudaMemcpyAsync(scratch_.data(), host_values_.data(), d.size_bytes(), cudaMemcpyHostToDevice, s()));
    check(cb_.allreduce(cb_.user, scratch_.data(), d.size(), GRAVAC_FLOAT64, op, s()), "allreduce");
    GRAVAC_TRY_CUDA(cudaMemcpyAsync(host_values_.data(), scratch_.data(), d.size_bytes(), cudaMemcpyDeviceToHost, s()));
    wait("allreduce");
    std::copy(host_values_.data(), host_values_.data() + d.size(), d.begin());
  }

  // Doubles host_reduce stages without growing until reserve_host_staging asks for more.
  static constexpr std::size_t initial_host_values = 256;

  gravac_device_comm_callbacks cb_;
  stream_ref producer_;
  cuda_stream own_;  // the callbacks' stream: declared before the buffers freed on it
  cudaEvent_t ordered_ = nullptr;
  device_buffer<double> scratch_;
  device_byte_buffer padded_in_, padded_out_;
  device_buffer<std::uint64_t> sizes_dev_;
  pinned_buffer<std::uint64_t> host_sizes_;
  pinned_buffer<double> host_values_;
  std::vector<pinned_buffer<double>> retired_host_values_;
};
static_assert(Communicator<callback_device_communicator>);

}  // namespace gravac
