#pragma once
//! \file device_buffer.hpp
//! \brief device_buffer<T>: an owning, stream-ordered buffer of device memory
//! (cudaMallocAsync / cudaFreeAsync), and the cuda_space specializations of the core's
//! storage traits, so the trainer's residual and the collectives' packet buffers live on
//! the device. Part of target gravac::cuda.

#include "gravac/cuda/detail/nvcc_flags.hpp"
// (first, and apart from the includes below: a missing compiler option is one readable error)

#include <algorithm>
#include <cstddef>
#include <span>
#include <type_traits>
#include <utility>
#include <vector>

#include "gravac/core/memory.hpp"
#include "gravac/cuda/detail/host_transfer_cuda.hpp"
#include "gravac/cuda/stream.hpp"

namespace gravac {

//! Owning buffer of \p T in device memory, allocated and freed in stream order.
//!
//! Growing (resize beyond the capacity) reallocates and does not keep the old contents:
//! gravac's buffers are workspaces that are rewritten before they are read. Not copyable;
//! movable. Never throws from its destructor.
template <class T>
class device_buffer {
  static_assert(std::is_trivially_copyable_v<T>, "device_buffer holds trivially copyable values only");

 public:
  //! Element type.
  using value_type = T;

  //! An empty buffer on the per-thread default stream.
  device_buffer() noexcept = default;
  //! \p n zero-filled elements, ready for use from any stream when the constructor returns.
  explicit device_buffer(std::size_t n, stream_ref s = {}) : stream_(s) {
    reserve(n);
    size_ = n;
    if (n) GRAVAC_TRY_CUDA(cudaMemsetAsync(data_, 0, n * sizeof(T), stream_.get()));
    stream_.synchronize();
  }
  device_buffer(const device_buffer&) = delete;
  device_buffer& operator=(const device_buffer&) = delete;
  //! Takes \p o's memory.
  device_buffer(device_buffer&& o) noexcept
      : data_(std::exchange(o.data_, nullptr)),
        size_(std::exchange(o.size_, 0)),
        capacity_(std::exchange(o.capacity_, 0)),
        stream_(o.stream_) {}
  //! Frees this buffer's memory and takes \p o's.
  device_buffer& operator=(device_buffer&& o) noexcept {
    if (this != &o) {
      release();
      data_ = std::exchange(o.data_, nullptr);
      size_ = std::exchange(o.size_, 0);
      capacity_ = std::exchange(o.capacity_, 0);
      stream_ = o.stream_;
    }
    return *this;
  }
  //! Frees the memory in stream order.
  ~device_buffer() { release(); }

  //! Makes room for \p n elements (contents are not kept when it reallocates).
  void reserve(std::size_t n) {
    if (n <= capacity_) return;
    release();
    void* p = nullptr;
    GRAVAC_TRY_CUDA(cudaMallocAsync(&p, n * sizeof(T), stream_.get()));
    data_ = static_cast<T*>(p);
    capacity_ = n;
  }
  //! Sets the size to \p n, reallocating when it exceeds the capacity (contents then lost).
  void resize(std::size_t n) {
    reserve(n);
    size_ = n;
  }
  //! Sets the stream that orders allocation and release (work on other streams must be
  //! ordered by the caller).
  void set_stream(stream_ref s) noexcept { stream_ = s; }

  //! Device pointer to the first element.
  [[nodiscard]] T* data() noexcept { return data_; }
  //! Device pointer to the first element.
  [[nodiscard]] const T* data() const noexcept { return data_; }
  //! Number of elements.
  [[nodiscard]] std::size_t size() const noexcept { return size_; }
  //! Elements that fit without reallocation.
  [[nodiscard]] std::size_t capacity() const noexcept { return capacity_; }
  //! True when empty.
  [[nodiscard]] bool empty() const noexcept { return size_ == 0; }
  //! The stream of allocation and release.
  [[nodiscard]] stream_ref stream() const noexcept { return stream_; }
  //! A span over the device memory (not dereferenceable on the host).
  [[nodiscard]] std::span<T> span() noexcept { return {data_, size_}; }
  //! A span over the device memory (not dereferenceable on the host).
  [[nodiscard]] std::span<const T> span() const noexcept { return {data_, size_}; }

 private:
  void release() noexcept {
    if (data_) GRAVAC_TRY_CUDA_NO_THROW(cudaFreeAsync(data_, stream_.get()));
    data_ = nullptr;
    size_ = capacity_ = 0;
  }

  T* data_ = nullptr;
  std::size_t size_ = 0;
  std::size_t capacity_ = 0;
  stream_ref stream_{};
};

//! Device bytes: the packet and allgatherv buffers of device engines.
using device_byte_buffer = device_buffer<std::byte>;

//! The trainer's residual in device memory.
template <>
struct storage_for<cuda_space> {
  //! Owning buffer type (zero-filled at construction).
  using type = device_buffer<float>;
};

//! Device engines gather into device memory.
template <>
struct default_byte_buffer<cuda_space> {
  //! allgatherv's output type of cuda_space engines.
  using type = device_byte_buffer;
};

//! A device view of \p b.
inline grad_view<cuda_space> device_view(device_buffer<float>& b) noexcept { return {b.data(), b.size()}; }

//! Owning pinned host memory (cudaMallocHost): staging for small host<->device copies
//! that must be asynchronous. Never throws from its destructor.
template <class T>
class pinned_buffer {
  static_assert(std::is_trivially_copyable_v<T>);

 public:
  pinned_buffer() noexcept = default;
  //! \p n value-initialized elements.
  explicit pinned_buffer(std::size_t n) { resize(n); }
  pinned_buffer(const pinned_buffer&) = delete;
  pinned_buffer& operator=(const pinned_buffer&) = delete;
  //! Takes \p o's memory.
  pinned_buffer(pinned_buffer&& o) noexcept
      : data_(std::exchange(o.data_, nullptr)), size_(std::exchange(o.size_, 0)) {}
  //! Frees this and takes \p o's memory.
  pinned_buffer& operator=(pinned_buffer&& o) noexcept {
    if (this != &o) {
      free_();
      data_ = std::exchange(o.data_, nullptr);
      size_ = std::exchange(o.size_, 0);
    }
    return *this;
  }
  ~pinned_buffer() { free_(); }
  //! Reallocates to \p n value-initialized elements when the size changes.
  void resize(std::size_t n) {
    if (n == size_) return;
    free_();
    if (n) {
      void* p = nullptr;
      GRAVAC_TRY_CUDA(cudaMallocHost(&p, n * sizeof(T)));
      data_ = static_cast<T*>(p);
      for (std::size_t i = 0; i < n; ++i) data_[i] = T{};
    }
    size_ = n;
  }
  //! Host pointer.
  [[nodiscard]] T* data() noexcept { return data_; }
  //! Host pointer.
  [[nodiscard]] const T* data() const noexcept { return data_; }
  //! Elements.
  [[nodiscard]] std::size_t size() const noexcept { return size_; }
  //! Element \p i.
  T& operator[](std::size_t i) noexcept { return data_[i]; }
  //! Element \p i.
  const T& operator[](std::size_t i) const noexcept { return data_[i]; }

 private:
  void free_() noexcept {
    if (data_) GRAVAC_TRY_CUDA_NO_THROW(cudaFreeHost(data_));
    data_ = nullptr;
    size_ = 0;
  }
  T* data_ = nullptr;
  std::size_t size_ = 0;
};

namespace detail {

//! Grows pinned staging \p b to at least \p n elements (at least doubling) without freeing
//! its memory: the old buffer moves to \p retired and is freed with it. cudaFreeHost
//! synchronizes the whole device, which in the middle of a step would wait for every
//! stream's work (backward's, the other buckets'); a grow path reachable during a step
//! uses this. The contents are not kept. Does nothing when \p b holds \p n already.
template <class T>
void grow_pinned_keeping(pinned_buffer<T>& b, std::size_t n, std::vector<pinned_buffer<T>>& retired) {
  if (b.size() >= n) return;
  pinned_buffer<T> bigger(std::max(n, 2 * b.size()));
  if (b.size()) retired.push_back(std::move(b));  // moves only: nothing is freed
  b = std::move(bigger);                          // b is empty here: nothing is freed
}

}  // namespace detail

}  // namespace gravac
