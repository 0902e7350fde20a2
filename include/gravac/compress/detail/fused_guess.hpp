#pragma once
//! \file fused_guess.hpp
//! \brief The keys the next step's fused top-k pass collects from (its guess) and counts
//! from (its floor), learnt from this step's candidates.
//!
//! In the steady state of error feedback many residual entries pile up just below the
//! threshold (they grow until they cross it): a fixed margin of 1/8 below the last
//! threshold then collects about 11 times k candidates at 1% kept (measured at 2^20), and
//! collecting and selecting them costs more than the pass itself. adaptive_guess instead
//! keeps, after each selection, how many candidates lay in thin bands just below the
//! threshold, and puts the next guess where the last step had (1 + m) k of them; m follows
//! how far below its prediction the count fell in the last steps. The floor stays at the
//! fixed margin: the pass counts the elements between floor and guess without collecting
//! them, so a guess that was too high costs one read of u collecting from the floor, and
//! only when even the floor holds fewer than k a histogram of the layer. The guess changes
//! where the selection starts, never what it selects.

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>

#include "gravac/compress/detail/candidate_select.hpp"
#include "gravac/compress/detail/fused_pass.hpp"
#include "gravac/stats/magnitude_histogram.hpp"

namespace gravac::detail {

//! The next step's guess: the threshold key lowered by a margin of \p margin in magnitude
//! (magnitudes drift slowly from step to step, so the next top-k is almost surely above it).
[[nodiscard]] inline std::uint32_t widened_guess(std::uint32_t threshold_key, float margin) noexcept {
  return magnitude_key(key_magnitude(threshold_key) * margin);
}

//! The guess and floor of one selection unit (a layer, or the whole buffer), learnt from
//! its previous steps (see the file's description).
class adaptive_guess {
 public:
  //! Bands counted below the threshold. Their width (relative to the threshold) is what puts
  //! the range the last step collected in full into about 32 of them, at most 1/512:
  //! at 0.1% kept the guess lies within a fraction of a percent of the threshold.
  static constexpr std::size_t bands = 128;
  //! The widest band (relative to the threshold).
  static constexpr double max_band_width = 1.0 / 512;

  //! A guess whose floor lies \p floor_margin (in (0, 1]) times the threshold.
  explicit adaptive_guess(float floor_margin = 0.875f) noexcept : floor_margin_(floor_margin) {}

  //! The keys of the next pass for \p k values: collect from guess, count from floor.
  //! Before any step: no_guess for both (the pass collects nothing; the step misses).
  struct keys {
    std::uint32_t guess = no_guess;  //!< collect keys at or above
    std::uint32_t floor = no_guess;  //!< count keys at or above (<= guess)
    //! The central estimate of the k-th key (>= guess): the pass leaves the candidates at or
    //! above it as zero in e, as if sent, so that only those between it and the k-th key
    //! cost a scattered write afterwards (keep_selected).
    std::uint32_t zero = no_guess;
  };

  //! The keys for a step that selects \p k values: the guess sits where the last step had
  //! (1 + margin) k candidates, or at the floor when its candidates did not reach that far.
  [[nodiscard]] keys next(std::uint64_t k) noexcept {
    predicted_ = 0;
    if (threshold_ == no_guess) return {};
    const std::uint32_t floor = widened_guess(threshold_, floor_margin_);
    const double target = (1.0 + margin()) * static_cast<double>(k);
    std::size_t b = 0;
    while (b < complete_ && static_cast<double>(cumulative_[b]) < target) ++b;
    double predicted = b < complete_ ? static_cast<double>(cumulative_[b]) : 0.0;
    if (b == complete_) {
      if (complete_ == 0) return {floor, floor, floor};
      // The last step's candidates end above the target: extend by the density of its
      // lowest complete bands (the pile-up below the threshold is smooth on this scale).
      const std::size_t last = complete_ - 1, span = std::min<std::size_t>(16, last);
      const double have = static_cast<double>(cumulative_[last]);
      const double per_band =
          span == 0 ? 0.0
                    : static_cast<double>(cumulative_[last] - cumulative_[last - span]) / static_cast<double>(span);
      if (!(per_band > 0.0)) return {floor, floor, floor};
      b = last + 1 + static_cast<std::size_t>(std::ceil((target - have) / per_band));
      predicted = have + static_cast<double>(b - last) * per_band;
    }
    if (b >= bands) return {floor, floor, floor};
    const std::uint32_t g = band_key(b);
    if (g <= floor) return {floor, floor, floor};
    predicted_ = static_cast<std::uint64_t>(predicted);
    std::size_t c = 0;  // the first band that held k last step
    while (c < b && cumulative_[c] < k) ++c;
    return {g, floor, std::max(g, band_key(c))};
  }

  //! Learns from this step: \p t is the k-th largest key, \p runs the candidates of \p bits
  //! (all the step collected: every finite element with key >= \p complete_from, the guess
  //! of next() or the floor a miss collected from) and \p collected_at_guess what the pass
  //! collected at the guess of next().
  void learn(std::uint32_t t, const std::uint32_t* bits, std::span<const candidate_run> runs,
             std::size_t collected_at_guess, std::uint32_t complete_from) noexcept {
    if (predicted_ > 0) {
      ratios_[ratio_at_ % ratios_.size()] = static_cast<double>(collected_at_guess) / static_cast<double>(predicted_);
      ++ratio_at_;
    }
    threshold_ = t;
    const float tm = key_magnitude(t);
    std::fill(cumulative_.begin(), cumulative_.end(), 0);
    if (!(tm > 0.0f) || !std::isfinite(tm)) {
      threshold_ = no_guess;
      return;
    }
    // Band b holds |u| in (t (1 - (b + 1) w), t (1 - b w)]; those above t go to band 0.
    const double depth = (static_cast<double>(tm) - key_magnitude(std::min(complete_from, t))) / tm;
    width_ = std::clamp(depth / 32.0, 1e-7, max_band_width);
    const float scale = static_cast<float>(1.0 / (width_ * static_cast<double>(tm)));
    // Four sets of counters, one per candidate modulo 4: neighbours in the same band would
    // otherwise wait on each other's increment.
    std::array<std::array<std::uint32_t, bands + 1>, 4> part{};
    for (const auto& r : runs) {
      const std::uint32_t* bp = bits + r.first;
      for (std::size_t i = 0; i < r.count; ++i) {
        const float below = (tm - key_magnitude(bp[i] & 0x7fffffffu)) * scale;
        const float b = std::clamp(below, 0.0f, static_cast<float>(bands));
        ++part[i & 3][static_cast<std::size_t>(b)];
      }
    }
    for (std::size_t b = 0; b <= bands; ++b)
      cumulative_[b] = std::uint64_t{part[0][b]} + part[1][b] + part[2][b] + part[3][b];
    for (std::size_t b = 1; b < bands; ++b) cumulative_[b] += cumulative_[b - 1];
    // Bands whose whole range lies at or above complete_from hold every element there.
    const float below = (tm - key_magnitude(std::min(complete_from, t))) * scale;
    complete_ = static_cast<std::size_t>(std::clamp(below, 0.0f, static_cast<float>(bands)));
  }

  //! The margin above k the next guess aims at: what the counts of the last steps fell
  //! short of their predictions by, plus 10% (0.5 before any such step), in [0.15, 3].
  [[nodiscard]] double margin() const noexcept {
    const std::size_t n = std::min<std::size_t>(ratio_at_, ratios_.size());
    if (n == 0) return 0.5;
    double low = ratios_[0];
    for (std::size_t i = 1; i < n; ++i) low = std::min(low, ratios_[i]);
    if (!(low > 0.0)) return 3.0;
    return std::clamp(1.1 / low - 1.0, 0.15, 3.0);
  }

  //! Forgets everything learnt (a layer whose residual was reset).
  void reset() noexcept { *this = adaptive_guess(floor_margin_); }

 private:
  // The lower edge of band b.
  [[nodiscard]] std::uint32_t band_key(std::size_t b) const noexcept {
    const double m = static_cast<double>(key_magnitude(threshold_)) * (1.0 - static_cast<double>(b + 1) * width_);
    return magnitude_key(static_cast<float>(m));
  }

  float floor_margin_;
  std::uint32_t threshold_ = no_guess;                 // the last step's k-th key
  std::array<std::uint64_t, bands + 1> cumulative_{};  // candidates at or above each band's lower edge
  std::size_t complete_ = 0;                           // bands [0, complete_) were collected in full
  double width_ = max_band_width;                      // of a band, relative to threshold_
  std::uint64_t predicted_ = 0;                        // cumulative_ at the guess handed out (0: none)
  std::array<double, 16> ratios_{};                    // collected / predicted of the last steps
  std::size_t ratio_at_ = 0;
};

}  // namespace gravac::detail
