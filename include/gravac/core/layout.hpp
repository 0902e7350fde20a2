#pragma once
//! \file
//! \brief The model's gradient tensors inside one flat buffer.

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "gravac/core/detail/fnv1a.hpp"
#include "gravac/core/error.hpp"

namespace gravac {

//! What a tensor is, so that policies and compressors can treat layers differently
//! (AdaComp's bin length, Accordion's rule that 1-D tensors travel dense).
enum class layer_kind : std::uint8_t { conv, dense, recurrent, bias_or_norm };

//! Short name of a layer kind.
constexpr std::string_view to_string(layer_kind k) noexcept {
  switch (k) {
    case layer_kind::conv:
      return "conv";
    case layer_kind::dense:
      return "dense";
    case layer_kind::recurrent:
      return "recurrent";
    case layer_kind::bias_or_norm:
      return "bias_or_norm";
  }
  return "unknown";
}

//! One tensor of the model: where it lives in the flat buffer and what it is.
struct layer {
  std::string name;                     //!< unique name, e.g. "conv1.weight"
  std::size_t offset = 0;               //!< first element in the flat buffer
  std::size_t numel = 0;                //!< number of elements (product of shape)
  std::vector<std::size_t> shape;       //!< tensor shape, outermost first
  layer_kind kind = layer_kind::dense;  //!< what the tensor is
  std::uint64_t id = 0;                 //!< stable id: a hash of the name, equal on every rank and run

  //! Number of dimensions of the tensor.
  [[nodiscard]] std::size_t rank() const noexcept { return shape.size(); }
  //! Rows when the tensor is viewed as a matrix (first dimension); numel for 1-D.
  [[nodiscard]] std::size_t rows() const noexcept { return shape.empty() ? numel : shape.front(); }
  //! Columns when viewed as a matrix (product of the other dimensions); 1 for 1-D.
  [[nodiscard]] std::size_t cols() const noexcept { return rows() == 0 ? 0 : numel / rows(); }
};

//! The table of the model's tensors inside one flat gradient buffer.
//!
//! Tensors are packed back to back in the order they are added. The table hash
//! covers names, shapes, kinds and offsets, so two ranks (or a checkpoint and a
//! trainer) agree on the hash exactly when they agree on the layout.
class layout {
 public:
  layout() = default;

  //! Appends a tensor; returns its index. Names must be unique and shapes non-empty
  //! with no zero dimension, except that an explicitly empty layer (numel 0) is allowed.
  std::size_t add(std::string name, std::vector<std::size_t> shape, layer_kind kind) {
    require(!name.empty(), "layout::add: a layer needs a name");
    require(!shape.empty(), "layout::add: layer '" + name + "' needs a shape");
    for (const auto& l : layers_) require(l.name != name, "layout::add: duplicate layer name '" + name + "'");
    std::size_t numel = 1;
    for (auto s : shape) numel *= s;
    layer l;
    l.id = detail::fnv1a(name.data(), name.size());
    for (const auto& other : layers_) require(other.id != l.id, "layout::add: layer id collision for '" + name + "'");
    l.name = std::move(name);
    l.offset = total_;
    l.numel = numel;
    l.shape = std::move(shape);
    l.kind = kind;
    total_ += numel;
    layers_.push_back(std::move(l));
    return layers_.size() - 1;
  }

  //! All tensors, in buffer order.
  [[nodiscard]] const std::vector<layer>& layers() const noexcept { return layers_; }
  //! Number of tensors.
  [[nodiscard]] std::size_t size() const noexcept { return layers_.size(); }
  //! Tensor \p i.
  [[nodiscard]] const layer& operator[](std::size_t i) const { return layers_.at(i); }
  //! Total number of elements of the flat buffer.
  [[nodiscard]] std::size_t numel() const noexcept { return total_; }
  //! Largest layer, in elements.
  [[nodiscard]] std::size_t max_layer_numel() const noexcept {
    std::size_t m = 0;
    for (const auto& l : layers_) m = l.numel > m ? l.numel : m;
    return m;
  }

  //! Index of the layer with stable id \p id, or size() when absent.
  [[nodiscard]] std::size_t find(std::uint64_t id) const noexcept {
    for (std::size_t i = 0; i < layers_.size(); ++i)
      if (layers_[i].id == id) return i;
    return layers_.size();
  }

  //! Hash of the whole table (names, shapes, kinds, offsets).
  [[nodiscard]] std::uint64_t hash() const noexcept {
    std::uint64_t h = detail::fnv1a_u64(layers_.size(), 0xcbf29ce484222325ull);
    for (const auto& l : layers_) {
      h = detail::fnv1a(l.name.data(), l.name.size(), h);
      h = detail::fnv1a_u64(l.offset, h);
      h = detail::fnv1a_u64(static_cast<std::uint64_t>(l.kind), h);
      h = detail::fnv1a_u64(l.shape.size(), h);
      for (auto s : l.shape) h = detail::fnv1a_u64(s, h);
    }
    return h;
  }

  //! A layout with one dense layer of \p n elements: handy for tests and flat buffers.
  static layout flat(std::size_t n, std::string name = "flat") {
    layout l;
    l.add(std::move(name), {n}, layer_kind::dense);
    return l;
  }

 private:
  std::vector<layer> layers_;
  std::size_t total_ = 0;
};

}  // namespace gravac
