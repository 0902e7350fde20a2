#pragma once
//! \file
//! \brief detail::statistics_slots: the one slot layout of a step's statistics (host
//! trailer and device Allreduce alike), and detail::statistics_seal: the statistics the
//! trainer hands down with the step, which the last collective completes with its own.

#include <cmath>
#include <cstddef>
#include <limits>
#include <span>

#include "gravac/core/layout.hpp"
#include "gravac/core/step.hpp"

namespace gravac::detail {

//! The most gain candidates a device compressor computes (the fused select pass's
//! max_gain_candidates, which the CUDA backend checks equal): a device step's statistics
//! have at most this many, which bounds what the trainer stages for them.
inline constexpr std::size_t device_gain_candidates = 32;

//! The order of the statistics slots: the gain, one gain per candidate, each layer's
//! gradient norm, each layer's kept fraction, then (when pending) the previous step's four
//! times.
struct statistics_slots {
  std::size_t layers = 0;      //!< L
  std::size_t candidates = 0;  //!< G
  bool times = false;          //!< the previous step's times ride along

  //! Number of slots: 1 + G + 2L (+ 4).
  [[nodiscard]] std::size_t size() const noexcept { return 1 + candidates + 2 * layers + (times ? 4 : 0); }

  //! Writes this rank's statistics from \p st (compressed over \p lay; \p previous: the
  //! previous step's times, read when they ride) by \p put(slot, value).
  template <class Put>
  void pack(const compress_stats& st, const layout& lay, const step_times& previous, Put&& put) const {
    std::size_t at = 0;
    const double in = st.input_sq();
    put(at++, gain_from_sq(st.kept_sq(), in));
    for (std::size_t c = 0; c < candidates; ++c)
      put(at++, c < st.candidate_kept_sq.size() ? gain_from_sq(st.candidate_kept_sq[c], in) : 1.0);
    for (std::size_t i = 0; i < layers; ++i) put(at++, std::sqrt(st.layers[i].grad_sq));
    for (std::size_t i = 0; i < layers; ++i) {
      const auto n = static_cast<double>(lay[i].numel);
      put(at++, n > 0 ? static_cast<double>(st.layers[i].kept) / n : 0.0);
    }
    if (!times) return;
    for (double v : {previous.compress_s, previous.communicate_s, previous.decompress_s, previous.iteration_s})
      put(at++, v);
  }

  //! Reads the sums \p sum(slot) into \p r as rank averages over \p ranks.
  template <class Sum>
  void unpack(Sum&& sum, int ranks, step_report& r) const {
    const double inv = 1.0 / ranks;
    std::size_t at = 0;
    r.gain = sum(at++) * inv;
    for (auto& g : r.gain_curve) g = sum(at++) * inv;
    for (auto& n : r.layer_grad_norm) n = sum(at++) * inv;
    for (auto& k : r.kept_fraction) k = sum(at++) * inv;
    r.statistics_synchronized = true;
    r.previous_times_agreed = times;
    if (times) {
      r.previous_times.compress_s = sum(at++) * inv;
      r.previous_times.communicate_s = sum(at++) * inv;
      r.previous_times.decompress_s = sum(at++) * inv;
      r.previous_times.iteration_s = sum(at++) * inv;
    }
  }
};

//! The statistics as they travel down with a step: everything but what the collective that
//! carries them computes itself. The gain is a ratio over the whole layout, so the last
//! bucket's statistics must join the others' on this rank before any value rides; only
//! that collective has them, after it compresses and before it sends.
struct statistics_seal {
  static constexpr std::size_t no_slot = std::numeric_limits<std::size_t>::max();

  std::size_t slot = no_slot;   //!< the first of their slots; no_slot: none ride this step
  statistics_slots slots;       //!< their layout
  const layout* lay = nullptr;  //!< the whole layout (the trainer's, set every step)
  std::size_t first_layer = 0;  //!< the carrying collective's first layer in *lay
  step_times previous{};        //!< the previous step's times (sent when slots.times)
  compress_stats merged;        //!< every earlier bucket's statistics, merged over *lay

  //! Joins \p last (the carrying collective's statistics, its layers from first_layer)
  //! to the earlier buckets' as the trainer joins every bucket's (the same bits), then
  //! writes this rank's values to \p out (its slots).
  void write(const compress_stats& last, std::span<float> out) {
    merged.add_bucket(last, first_layer);
    slots.pack(merged, *lay, previous, [&](std::size_t i, double v) { out[slot + i] = static_cast<float>(v); });
  }
};

}  // namespace gravac::detail
