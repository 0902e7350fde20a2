#pragma once
//! \file
//! \brief Memory spaces and grad_view, a view of the flat gradient buffer.

#include <cstddef>
#include <span>
#include <vector>

#include "gravac/core/error.hpp"
#include "gravac/core/layout.hpp"

namespace gravac {

//! Memory space tag: ordinary host memory.
struct host_space {
  //! Whether code on the host may dereference pointers of this space.
  static constexpr bool host_accessible = true;
};

//! Memory space tag: CUDA device memory (the kernels live in the gravac::cuda target).
struct cuda_space {
  //! Whether code on the host may dereference pointers of this space.
  static constexpr bool host_accessible = false;
};

//! A view of a flat float buffer in memory space \p Space, with per-layer slices.
//!
//! grad_view does not own memory. It is what the trainer, compressors and
//! collectives pass around; for host memory it converts to std::span.
template <class Space = host_space>
class grad_view {
 public:
  //! The memory space of the data.
  using memory_space = Space;

  grad_view() = default;
  //! A view of \p size floats at \p data.
  grad_view(float* data, std::size_t size) noexcept : data_(data), size_(size) {}
  // clang-format off
  //! A view of a host span.
  grad_view(std::span<float> s) noexcept
    requires Space::host_accessible
      : data_(s.data()), size_(s.size()) {}
  // clang-format on

  //! Pointer to the first element.
  [[nodiscard]] float* data() const noexcept { return data_; }
  //! Number of elements.
  [[nodiscard]] std::size_t size() const noexcept { return size_; }

  //! The slice of layer \p l (bounds-checked against the view).
  [[nodiscard]] grad_view slice(const layer& l) const {
    require(l.offset + l.numel <= size_, "grad_view: layer '" + l.name + "' lies outside the buffer");
    return {data_ + l.offset, l.numel};
  }

  // clang-format off
  //! Host access as a span (host spaces only).
  [[nodiscard]] std::span<float> span() const noexcept
    requires Space::host_accessible
  {
    return {data_, size_};
  }
  // clang-format on

 private:
  float* data_ = nullptr;
  std::size_t size_ = 0;
};

//! A view of host memory.
using host_view = grad_view<host_space>;

//! The owning float buffer of memory space \p Space (the trainer's residual). The type
//! must be constructible from an element count (zero-filled) and have data() and size().
//! Host memory uses std::vector; the CUDA backend specializes this for cuda_space.
template <class Space>
struct storage_for {
  //! Owning buffer type.
  using type = std::vector<float>;
};

//! The growable byte buffer of memory space \p Space: what a host engine's allgatherv fills
//! and what the collectives keep packets in (a backend specializes it for its own space).
template <class Space>
struct default_byte_buffer {
  //! Host memory: a std::vector.
  using type = std::vector<std::byte>;
};

}  // namespace gravac
