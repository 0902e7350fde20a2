#pragma once
//! \file
//! \brief detail::space_ops: the few things a collective's aggregate body does differently
//! in host and device memory. Each collective has one aggregate body for every memory
//! space; what differs is behind these customization points, so a change to the algorithm
//! is made once and reaches both spaces.

#include <algorithm>

#include "gravac/core/memory.hpp"

namespace gravac::detail {

//! allreduce_compatible's passes over host memory (collective/detail/ar_topk_host_passes.hpp,
//! included by allreduce_compatible only: the other collectives do not pay for it).
class ar_topk_host_passes;

//! allreduce_compatible's passes over memory the host cannot read, defined by the backend of
//! that memory (cuda/detail/ar_topk_device_passes.hpp for cuda_space, which the device
//! compressors include): the core headers cannot name device buffers or kernels.
template <class Space>
class ar_topk_device_passes;

//! compressed_allreduce's staging of shards in host memory (collective/detail/shard_plan.hpp).
struct shard_host_staging;

//! compressed_allreduce's staging of shards in memory the host cannot read, defined by the
//! backend of that memory (cuda/detail/shard_staging.hpp for cuda_space, which the device
//! quantizers include): copies between the flat buffers and the shard-major one, and the
//! server residual's copies to and from the host for the checkpoint.
template <class Space>
struct shard_device_staging;

//! The memory-space customization points of the collectives (the primary template is
//! never defined: a space is either host-accessible or not).
template <class Space, bool HostAccessible = Space::host_accessible>
struct space_ops;

//! Host memory: the collective may read and write the buffers itself.
template <class Space>
struct space_ops<Space, true> {
  //! The collective reads and writes the gradient on the host: a dense step's statistics
  //! without the compressor, the averaging after the sum.
  static constexpr bool host_readable = true;
  //! The step's control values (step_control.hpp) ride in the collective: they are
  //! written and read on the host.
  static constexpr bool carries_control = true;
  //! allreduce_compatible's passes (u = g + e, gather, scatter, validation) run on the host.
  using ar_topk_passes = ar_topk_host_passes;
  //! compressed_allreduce's shard gathers and scatters run on the host.
  using shard_staging = shard_host_staging;
  //! Sets \p v to zero.
  template <class C>
  static void zero(const C&, grad_view<Space> v) {
    auto s = v.span();
    std::fill(s.begin(), s.end(), 0.0f);
  }
  //! Waits for the compressor's queued work: none, host decoding is synchronous.
  template <class C>
  static void finish(const C&) noexcept {}
};

//! Memory the host cannot read (device memory): the compressor works on it, on its stream.
template <class Space>
struct space_ops<Space, false> {
  //! The host never reads the buffers: every pass over them is the compressor's.
  static constexpr bool host_readable = false;
  //! Control values are not carried (they would need host reads of the buffers); the
  //! collective leaves a step_control without sums.
  static constexpr bool carries_control = false;
  //! allreduce_compatible's passes run as kernels on the compressor's stream (it carries the
  //! step_control itself: its values are copied to the tail of the device Allreduce buffer).
  using ar_topk_passes = ar_topk_device_passes<Space>;
  //! compressed_allreduce's shard gathers and scatters are copies on the compressor's stream.
  using shard_staging = shard_device_staging<Space>;
  //! Sets \p v to zero on the compressor's stream (a device compressor provides zero(view)).
  template <class C>
  static void zero(const C& c, grad_view<Space> v) {
    static_assert(
        requires { c.zero(v); }, "a device-memory compressor must provide zero(grad_view)");
    c.zero(v);
  }
  //! Waits for the compressor's queued work (decoding is asynchronous on its stream, and the
  //! communicator may use another stream).
  template <class C>
  static void finish(const C& c) {
    static_assert(
        requires { c.synchronize(); }, "a device-memory compressor must provide synchronize()");
    c.synchronize();
  }
};

}  // namespace gravac::detail
