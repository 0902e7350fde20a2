#pragma once
//! \file
//! \brief detail::layer_events<Space>: how an asynchronous step learns that a layer's
//! gradient is final in memory space Space. On the host, ready() itself says so (backward
//! ran in the caller's thread before it), so the primary template does nothing. A backend
//! whose gradients are produced asynchronously specializes it (CUDA:
//! gravac/cuda/detail/layer_events_cuda.hpp, which every CUDA compressor includes through
//! cuda/detail/space_hooks.hpp, records an event per layer on the caller's stream and
//! orders each bucket's work after its layers' events; its synchronous step orders every
//! bucket after one event on the caller's default stream).

#include <cstddef>

namespace gravac::detail {

//! Host memory: nothing to record or wait for. The check that Space is host memory sits in
//! the functions, not the class (the trainer holds a member of every space's).
template <class Space>
struct layer_events {
  //! Whether ready(layer, s) accepts \p S as the stream its gradient was produced on
  //! (host memory has no streams).
  template <class S>
  static constexpr bool accepts_stream = false;

  //! Readies the step of a layout of \p layers layers (the device's: creates the events
  //! once, and remembers the caller's device for the communication thread).
  void begin(std::size_t /*layers*/) {
    static_assert(Space::host_accessible,
                  "layer_events: no asynchronous step for this memory space (its backend specializes "
                  "detail::layer_events)");
  }
  //! Layer \p layer is final once the work queued so far on the calling thread's default
  //! stream is (the device's: its per-thread default stream, cudaStreamPerThread).
  void record_default(std::size_t /*layer*/) {}
  //! The synchronous step: the whole gradient is final once the work queued so far on the
  //! calling thread's default stream is.
  void record_step() {}
  //! Orders what compressor \p c queues next after record_step().
  template <class C>
  void wait_step(const C& /*c*/) const {}
  //! Called by the communication thread before a bucket (the device's: makes the
  //! caller's device current there).
  void enter_thread() const {}
  //! Orders what compressor \p c queues next after the events of layers [first, last).
  template <class C>
  void wait(const C& /*c*/, std::size_t /*first*/, std::size_t /*last*/) const {}
};

}  // namespace gravac::detail
