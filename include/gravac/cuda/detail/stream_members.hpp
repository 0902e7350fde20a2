#pragma once
//! \file
//! \brief detail::stream_members: the members every device compressor has because all its
//! work is ordered on one stream, the stream of its options: zero(view) (the collectives
//! clear the output there before decoding), synchronize() and stream(). Written once here
//! instead of in each compressor class.

#include "gravac/cuda/detail/nvcc_flags.hpp"
// (first, and apart from the includes below: a missing compiler option is one readable error)

#include "gravac/core/memory.hpp"
#include "gravac/cuda/cuda_error.hpp"
#include "gravac/cuda/stream.hpp"

namespace gravac::detail {

//! CRTP base of the device compressors: \p Derived has `options_` with a `stream` member
//! and befriends this class.
template <class Derived>
class stream_members {
 public:
  //! Sets \p v to zero on the compressor's stream (used by the collectives before decoding).
  void zero(grad_view<cuda_space> v) const {
    if (v.size()) GRAVAC_TRY_CUDA(cudaMemsetAsync(v.data(), 0, v.size() * sizeof(float), stream().get()));
  }
  //! Waits for the compressor's queued work (decoding) to finish.
  void synchronize() const { stream().synchronize(); }
  //! The compressor's stream: every kernel and copy of the compressor is ordered on it.
  [[nodiscard]] stream_ref stream() const noexcept { return static_cast<const Derived&>(*this).options_.stream; }
};

}  // namespace gravac::detail
