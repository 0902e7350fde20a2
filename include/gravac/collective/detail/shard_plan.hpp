#pragma once
//! \file
//! \brief detail::shard_plan: every layer split into N contiguous shards, one per rank, and
//! the layout of each shard (one piece per layer, in layer order), so that a compressor can
//! run on one shard of every layer at once.

#include <cstddef>
#include <cstring>
#include <string>
#include <vector>

#include "gravac/core/error.hpp"
#include "gravac/core/layout.hpp"

namespace gravac::detail {

//! First element of shard \p j of a layer of \p numel elements split into \p n shards: the
//! shards differ in size by at most one, the larger first (a layer smaller than n has empty
//! shards at the end).
constexpr std::size_t shard_begin(std::size_t numel, std::size_t j, std::size_t n) noexcept {
  const std::size_t base = numel / n, extra = numel % n;
  return j * base + (j < extra ? j : extra);
}

//! The split of a layout into \p n shards (one per rank).
class shard_plan {
 public:
  shard_plan() = default;
  //! Splits every layer of \p lay into \p n shards.
  shard_plan(const layout& lay, std::size_t n) : ranks_(n), shards_(n) {
    require(n >= 1, "shard_plan: at least one rank");
    std::size_t at = 0;
    for (std::size_t j = 0; j < n; ++j) {
      shard& s = shards_[j];
      s.start = at;
      for (const auto& l : lay.layers()) {
        const std::size_t b = shard_begin(l.numel, j, n), e = shard_begin(l.numel, j + 1, n);
        // Own names (so own ids): a shard's random streams and packets never pass for the layer's.
        s.lay.add(l.name + "@shard" + std::to_string(j) + "/" + std::to_string(n), {e - b}, l.kind);
        s.source.push_back(l.offset + b);
      }
      at += s.lay.numel();
    }
  }

  //! Number of shards (ranks).
  [[nodiscard]] std::size_t size() const noexcept { return ranks_; }
  //! The layout of shard \p j: layer i's piece is layer i of the original's.
  [[nodiscard]] const layout& shard_layout(std::size_t j) const { return shards_.at(j).lay; }
  //! Where shard \p j starts in the shard-major buffer (shards back to back).
  [[nodiscard]] std::size_t start(std::size_t j) const { return shards_.at(j).start; }
  //! Elements in shard \p j.
  [[nodiscard]] std::size_t numel(std::size_t j) const { return shards_.at(j).lay.numel(); }

  //! Where piece \p i (layer i) of shard \p j starts in the flat buffer.
  [[nodiscard]] std::size_t source(std::size_t j, std::size_t i) const { return shards_.at(j).source.at(i); }

  //! Copies shard \p j of the flat buffer \p from into the contiguous \p to (shard order).
  void gather(std::size_t j, const float* from, float* to) const {
    const shard& s = shards_[j];
    for (std::size_t i = 0; i < s.source.size(); ++i) {
      const auto& piece = s.lay[i];
      for (std::size_t k = 0; k < piece.numel; ++k) to[piece.offset + k] = from[s.source[i] + k];
    }
  }
  //! Copies the contiguous shard \p j in \p from back to its places in the flat buffer \p to.
  void scatter(std::size_t j, const float* from, float* to) const {
    const shard& s = shards_[j];
    for (std::size_t i = 0; i < s.source.size(); ++i) {
      const auto& piece = s.lay[i];
      for (std::size_t k = 0; k < piece.numel; ++k) to[s.source[i] + k] = from[piece.offset + k];
    }
  }

 private:
  struct shard {
    layout lay;                       // one piece per layer
    std::vector<std::size_t> source;  // where each piece starts in the flat buffer
    std::size_t start = 0;            // where the shard starts in the shard-major buffer
  };
  std::size_t ranks_ = 0;
  std::vector<shard> shards_;
};

//! compressed_allreduce's shard staging in host memory (space_ops<host>::shard_staging):
//! plain loops and copies. The device form (cuda/detail/shard_staging.hpp) has the same
//! members, so the collective's one body runs in both spaces.
struct shard_host_staging {
  //! Sizes the float buffer \p b to \p n elements (contents are rewritten before use).
  template <class C, class B>
  static void resize(const C&, B& b, std::size_t n) {
    b.resize(n);
  }
  //! Copies shard \p j of the flat \p from into the contiguous \p to (shard_plan::gather).
  template <class C>
  static void gather(const C&, const shard_plan& plan, std::size_t j, const float* from, float* to) {
    plan.gather(j, from, to);
  }
  //! Copies the contiguous shard \p j in \p from back into the flat \p to (shard_plan::scatter).
  template <class C>
  static void scatter(const C&, const shard_plan& plan, std::size_t j, const float* from, float* to) {
    plan.scatter(j, from, to);
  }
  //! Copies \p n floats.
  template <class C>
  static void copy(const C&, const float* from, float* to, std::size_t n) {
    if (n) std::memcpy(to, from, n * sizeof(float));
  }
  //! Copies \p n floats of this space's \p from to the host's \p to (the checkpoint).
  static void to_host(const float* from, float* to, std::size_t n) {
    if (n) std::memcpy(to, from, n * sizeof(float));
  }
  //! Copies \p n host floats into this space's \p to (a loaded checkpoint).
  template <class C>
  static void from_host(const C&, const float* from, float* to, std::size_t n) {
    if (n) std::memcpy(to, from, n * sizeof(float));
  }
};

}  // namespace gravac::detail
