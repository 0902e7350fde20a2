#pragma once
//! \file gain_sampling.hpp
//! \brief Which elements of the fused selection pass go into the gain curve's magnitude
//! histogram: all of them for layers up to 2^19 elements, a rotating sample of blocks above.

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "gravac/core/layout.hpp"
#include "gravac/stats/gain_curve.hpp"
#include "gravac/stats/magnitude_histogram.hpp"

namespace gravac::detail {

//! Elements per block of the fused pass (the unit of sums and of histogram sampling).
inline constexpr std::size_t fused_block = 256;

//! Which elements of a fused pass also go into a magnitude histogram (count and energy).
//! With a stride of 1, every element: the exact histogram. With a larger stride (large
//! layers, where a scatter per element would cost more than the whole selection), one block
//! of fused_block in `stride` is added, each element with weight `stride`: a uniform sample
//! of the layer, chosen by the blocks' index in the layer (those equal to `phase` modulo
//! `stride`). The gain curve then takes the bins above the step's boundary exactly from the
//! candidates and the sample below it (complete_sampled_gain, fused_topk.hpp): the values
//! that carry the energy of small kept fractions and of heavy tails are exact. The device
//! samples the same blocks with the same weight (select_fused_pass.hpp), so both curves agree.
struct histogram_sampling {
  magnitude_histogram* hist = nullptr;  //!< where the elements go; null: no histogram
  std::uint32_t stride = 1;             //!< one block in this many (1: every element)
  std::uint32_t phase = 0;              //!< which one (below stride)
};

//! The gain histogram's sampling stride for a layer of \p n elements: every element of
//! layers up to 2^19 elements (the exact curve); above, a sample of about 2^18 elements
//! (one block in at most 64), where a full histogram would cost more than the selection
//! itself (a scatter per element against a memory-bound pass). Constant, for the device too.
[[nodiscard]] constexpr std::uint32_t gain_sample_stride(std::size_t n) noexcept {
  constexpr std::size_t exact_up_to = std::size_t{1} << 19, sample = std::size_t{1} << 18;
  if (n <= exact_up_to) return 1;
  std::size_t stride = 1;
  while (stride < 64 && stride * 2 <= n / sample) stride *= 2;
  return static_cast<std::uint32_t>(stride);
}

//! A layer whose gain curve is exact (gain_sample_slots::slot).
inline constexpr std::size_t no_gain_sample = ~std::size_t{0};

//! Where the curves that wait for the selection keep their samples: the layers whose gain
//! curve is sampled (a stride above 1), numbered.
struct gain_sample_slots {
  std::vector<std::size_t> slot;  //!< per layer: its place among them, or no_gain_sample
  std::size_t count = 0;          //!< how many there are
};

//! The gain_sample_slots of \p lay.
[[nodiscard]] inline gain_sample_slots gain_sample_slots_of(const layout& lay) {
  gain_sample_slots s{std::vector<std::size_t>(lay.size(), no_gain_sample), 0};
  for (std::size_t i = 0; i < lay.size(); ++i)
    if (gain_sample_stride(lay[i].numel) > 1) s.slot[i] = s.count++;
  return s;
}

//! The first gain bin a sampled gain curve takes exactly when the step's sending threshold
//! key is \p key: the bins above key's bin, whose values every selection has among its
//! candidates (no_guess: none, every bin from the sample).
[[nodiscard]] constexpr std::uint32_t exact_gain_from(std::uint32_t key) noexcept {
  return key >= non_finite_key ? gain_bins : (key >> gain_bin_shift) + 1;
}

//! The sampling of a layer's gain histogram at step \p step: the phase rotates with the
//! step, so every block is seen over stride steps.
[[nodiscard]] inline histogram_sampling gain_sampling(magnitude_histogram& h, std::size_t n,
                                                      std::uint64_t step) noexcept {
  const std::uint32_t stride = gain_sample_stride(n);
  return {&h, stride, static_cast<std::uint32_t>(step % stride)};
}

}  // namespace gravac::detail
