#pragma once
//! \file stream.hpp
//! \brief stream_ref: a non-owning handle of a CUDA stream, and stream, an owning one.
//! Every gravac CUDA operation is ordered on a stream_ref. Part of target gravac::cuda.

#include "gravac/cuda/detail/nvcc_flags.hpp"
// (first, and apart from the includes below: a missing compiler option is one readable error)

#include "gravac/cuda/cuda_error.hpp"

namespace gravac {

//! A non-owning reference to a CUDA stream (the default is the per-thread default stream,
//! which does not serialize with other threads' work).
class stream_ref {
 public:
  //! The per-thread default stream.
  constexpr stream_ref() noexcept = default;
  //! Refers to \p s (which must outlive every use of this reference).
  constexpr stream_ref(cudaStream_t s) noexcept : stream_(s) {}  // NOLINT: implicit by design, like CUDA's APIs

  //! The native handle.
  [[nodiscard]] constexpr cudaStream_t get() const noexcept { return stream_; }
  //! Blocks the host until all work queued so far on the stream has finished.
  void synchronize() const { GRAVAC_TRY_CUDA(cudaStreamSynchronize(stream_)); }
  //! True when all queued work has finished; throws on an error of that work.
  [[nodiscard]] bool ready() const {
    const cudaError_t s = cudaStreamQuery(stream_);
    if (s == cudaErrorNotReady) {
      (void)cudaGetLastError();
      return false;
    }
    if (s != cudaSuccess) detail::throw_cuda(s, "cudaStreamQuery");
    return true;
  }
  //! Same stream.
  friend constexpr bool operator==(stream_ref a, stream_ref b) noexcept { return a.stream_ == b.stream_; }

 private:
  cudaStream_t stream_ = cudaStreamPerThread;
};

//! An owning, non-blocking CUDA stream (destroyed with the object; never throws there).
class cuda_stream {
 public:
  //! Creates a stream that does not synchronize with the legacy default stream.
  cuda_stream() { GRAVAC_TRY_CUDA(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking)); }
  cuda_stream(const cuda_stream&) = delete;
  cuda_stream& operator=(const cuda_stream&) = delete;
  //! Destroys the stream (pending work still completes, as CUDA defines).
  ~cuda_stream() {
    if (stream_) GRAVAC_TRY_CUDA_NO_THROW(cudaStreamDestroy(stream_));
  }
  //! A reference to the stream.
  [[nodiscard]] stream_ref ref() const noexcept { return stream_; }
  //! Converts to a reference.
  operator stream_ref() const noexcept { return stream_; }  // NOLINT: implicit by design

 private:
  cudaStream_t stream_ = nullptr;
};

//! Number of visible CUDA devices; 0 when there is no device or no driver (never throws),
//! so tests and examples can skip cleanly on machines without a GPU.
inline int visible_cuda_devices() noexcept {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return n;
}

}  // namespace gravac
