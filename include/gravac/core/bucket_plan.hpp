#pragma once
//! \file
//! \brief The split of a layout into gradient buckets, in the order backward produces them.
//!
//! Backward computes the last layers' gradients first, so buckets are formed from the last
//! layer towards the first: bucket 0 holds the last layers, the last bucket holds layer 0.
//! Each bucket is a run of consecutive layers, hence one contiguous slice of the flat
//! buffer, and is compressed and aggregated on its own as soon as its last layer is ready.
//! A bucket is closed once it holds at least `bucket_bytes` of float gradients, so a layer
//! larger than the target is a bucket by itself and no layer is ever split. Empty layers
//! ride in a neighbouring bucket, so every bucket has elements.

#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "gravac/core/error.hpp"
#include "gravac/core/layout.hpp"

namespace gravac {

//! Default bucket size: 25 MiB of float gradients, the size PyTorch DDP starts from.
inline constexpr std::size_t default_bucket_bytes = std::size_t{25} << 20;
//! bucket_bytes for one bucket holding every layer (the step of a release without buckets).
inline constexpr std::size_t one_bucket = std::numeric_limits<std::size_t>::max();
//! bucket_bytes for one bucket per layer.
inline constexpr std::size_t bucket_per_layer = 1;

//! One bucket: layers [first_layer, last_layer) of the layout, elements [offset, offset + numel).
struct bucket {
  std::size_t first_layer = 0;  //!< first layer (layout order)
  std::size_t last_layer = 0;   //!< one past the last layer
  std::size_t offset = 0;       //!< first element in the flat buffer
  std::size_t numel = 0;        //!< elements of the bucket
  layout layers;                //!< the bucket's layers as a layout of their own (offsets from 0, same names and ids)
};

//! The buckets of a layout. Bucket 0 is the first to be ready in backward (it holds the last
//! layers); buckets are processed in index order on every rank, so every rank runs the same
//! collectives in the same order.
class bucket_plan {
 public:
  //! A plan without buckets.
  bucket_plan() = default;
  //! Splits \p lay into buckets of at least \p bucket_bytes (float gradients), from its last
  //! layer to its first. \p bucket_bytes must be positive (bucket_per_layer, one_bucket).
  bucket_plan(const layout& lay, std::size_t bucket_bytes) {
    require(bucket_bytes > 0, "bucket_plan: bucket_bytes must be positive (use bucket_per_layer for one per layer)");
    require(lay.numel() > 0, "bucket_plan: the layout has no elements");
    layer_bucket_.assign(lay.size(), 0);
    // Ranges from the last layer down; a bucket without elements (empty layers) is never
    // formed: empty layers join the bucket below them, or the last one formed.
    std::vector<std::pair<std::size_t, std::size_t>> ranges;
    std::size_t last = lay.size();
    std::size_t bytes = 0;
    for (std::size_t i = lay.size(); i-- > 0;) {
      bytes += lay[i].numel * sizeof(float);
      if (bytes > 0 && (bytes >= bucket_bytes || i == 0)) {
        ranges.emplace_back(i, last);
        last = i;
        bytes = 0;
      }
    }
    if (last > 0) ranges.back().first = 0;  // layers 0..last are empty
    for (const auto& [first, end] : ranges) add(lay, first, end);
  }

  //! Number of buckets.
  [[nodiscard]] std::size_t size() const noexcept { return buckets_.size(); }
  //! Bucket \p b.
  [[nodiscard]] const bucket& operator[](std::size_t b) const { return buckets_.at(b); }
  //! The bucket that holds layer \p layer_index.
  [[nodiscard]] std::size_t bucket_of(std::size_t layer_index) const { return layer_bucket_.at(layer_index); }

 private:
  void add(const layout& lay, std::size_t first, std::size_t last) {
    bucket b;
    b.first_layer = first;
    b.last_layer = last;
    b.offset = lay[first].offset;
    for (std::size_t i = first; i < last; ++i) {
      b.layers.add(lay[i].name, lay[i].shape, lay[i].kind);
      b.numel += lay[i].numel;
      layer_bucket_[i] = buckets_.size();
    }
    buckets_.push_back(std::move(b));
  }

  std::vector<bucket> buckets_;
  std::vector<std::size_t> layer_bucket_;
};

}  // namespace gravac
