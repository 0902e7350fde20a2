#pragma once
//! \file
//! \brief detail::layer_events<cuda_space>: how a device step orders its buckets after the
//! gradient's producer. The asynchronous step: one CUDA event per layer, created once and
//! re-recorded every step: ready(layer, stream) records the layer's event on the stream
//! backward produced it on (ready(layer): the caller's per-thread default stream), and
//! before a bucket's first kernel the communication thread makes the bucket's compressor
//! stream wait for the events of the bucket's layers (cudaStreamWaitEvent), so neither the
//! caller's thread nor its stream waits for the bucket. The synchronous step: one event
//! recorded on the caller's per-thread default stream that every bucket's compressor
//! stream waits for (record_step, wait_step).

#include "gravac/cuda/detail/nvcc_flags.hpp"
// (first, and apart from the includes below: a missing compiler option is one readable error)

#include <concepts>
#include <cstddef>
#include <utility>
#include <vector>

#include "gravac/concepts/detail/layer_events.hpp"
#include "gravac/core/memory.hpp"
#include "gravac/cuda/cuda_error.hpp"
#include "gravac/cuda/stream.hpp"

namespace gravac::detail {

//! The CUDA specialization: events per layer, the device the step runs on.
template <>
struct layer_events<cuda_space> {
  //! ready(layer, s) takes a cudaStream_t or a stream_ref.
  template <class S>
  static constexpr bool accepts_stream = std::convertible_to<S, stream_ref>;

  layer_events() = default;
  layer_events(const layer_events&) = delete;
  layer_events& operator=(const layer_events&) = delete;
  //! Takes \p o's events (a trainer moves between steps).
  layer_events(layer_events&& o) noexcept
      : events_(std::exchange(o.events_, {})), step_(std::exchange(o.step_, nullptr)), device_(o.device_) {}
  //! Takes \p o's events.
  layer_events& operator=(layer_events&& o) noexcept {
    if (this != &o) {
      destroy();
      events_ = std::exchange(o.events_, {});
      step_ = std::exchange(o.step_, nullptr);
      device_ = o.device_;
    }
    return *this;
  }
  ~layer_events() { destroy(); }

  //! Creates the \p layers events on the first step (without timing: they only order) and
  //! remembers the device current in the caller's thread, which the communication thread
  //! makes current before each bucket (a CUDA thread starts on device 0, and a process
  //! that drives GPU k would otherwise launch the bucket's kernels on the wrong device).
  void begin(std::size_t layers) {
    GRAVAC_TRY_CUDA(cudaGetDevice(&device_));
    events_.reserve(layers);
    while (events_.size() < layers) {
      cudaEvent_t e = nullptr;
      GRAVAC_TRY_CUDA(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
      events_.push_back(e);
    }
  }
  //! Records layer \p layer's event on \p s: the layer is final once the work queued on
  //! \p s so far is done.
  void record(std::size_t layer, stream_ref s) { GRAVAC_TRY_CUDA(cudaEventRecord(events_[layer], s.get())); }
  //! Records layer \p layer's event on the calling thread's per-thread default stream
  //! (cudaStreamPerThread, resolved in the caller's thread): what ready(layer) and a layer
  //! never marked ready assume. That stream runs after the work queued before on the legacy
  //! default stream (as CUDA defines), so a backward on either default stream is covered;
  //! it does not wait for other threads' per-thread streams, among them the communication
  //! thread's, so the next bucket never waits behind the buckets in flight (the legacy
  //! stream would: it waits for every blocking stream of the device).
  void record_default(std::size_t layer) { record(layer, cudaStreamPerThread); }
  //! The synchronous step: records one event on the calling thread's per-thread default
  //! stream (as record_default), after which the whole gradient is final.
  void record_step() {
    if (!step_) GRAVAC_TRY_CUDA(cudaEventCreateWithFlags(&step_, cudaEventDisableTiming));
    GRAVAC_TRY_CUDA(cudaEventRecord(step_, cudaStreamPerThread));
  }
  //! Orders what compressor \p c queues next on its stream after record_step()'s event
  //! (issued from the thread that queues the compressor's kernels).
  template <class C>
  void wait_step(const C& c) const {
    GRAVAC_TRY_CUDA(cudaStreamWaitEvent(c.stream().get(), step_, 0));
  }
  //! Makes the step's device current in the calling thread (the communication thread).
  void enter_thread() const { GRAVAC_TRY_CUDA(cudaSetDevice(device_)); }
  //! Orders what compressor \p c queues next on its stream after the events of layers
  //! [first, last). Issued from the thread that then queues the bucket's kernels, so that a
  //! compressor on the per-thread default stream (its default) waits on that thread's one.
  template <class C>
  void wait(const C& c, std::size_t first, std::size_t last) const {
    const cudaStream_t s = c.stream().get();
    for (std::size_t i = first; i < last; ++i) GRAVAC_TRY_CUDA(cudaStreamWaitEvent(s, events_[i], 0));
  }

 private:
  void destroy() noexcept {
    for (cudaEvent_t e : events_) GRAVAC_TRY_CUDA_NO_THROW(cudaEventDestroy(e));
    events_.clear();
    if (step_) GRAVAC_TRY_CUDA_NO_THROW(cudaEventDestroy(step_));
    step_ = nullptr;
  }

  std::vector<cudaEvent_t> events_;
  cudaEvent_t step_ = nullptr;  // the synchronous step's one event (record_step), created on first use
  int device_ = 0;
};

}  // namespace gravac::detail
