#pragma once
//! \file threshold.hpp
//! \brief Approximate top-k by a threshold (DGC style) with error feedback: estimate the
//! magnitude t above which about k = kept_count(numel, fraction) values lie, then send
//! every |u| >= t in one fused pass. The number sent (k_hat) is reported in
//! layer_stats::kept; it is close to k, not equal to it.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <span>
#include <vector>

#include "gravac/compress/detail/fused_topk.hpp"
#include "gravac/compress/detail/select_topk_indices.hpp"
#include "gravac/compress/detail/threshold_key.hpp"
#include "gravac/compress/index_selection.hpp"
#include "gravac/compress/layered.hpp"
#include "gravac/compress/sparse_layers.hpp"
#include "gravac/concepts/concepts.hpp"
#include "gravac/core/detail/random.hpp"
#include "gravac/core/error.hpp"
#include "gravac/packet/packet_bound.hpp"
#include "gravac/packet/sparse_packet.hpp"
#include "gravac/stats/gain_curve.hpp"
#include "gravac/stats/magnitude_histogram.hpp"

namespace gravac {

//! Options of threshold selection.
struct threshold_options {
  //! The sample is sized so that about this many sampled values lie above the threshold;
  //! the relative error of k_hat is then about 1/sqrt(expected_hits) (3% at 1024).
  std::size_t expected_hits = 1024;
  //! Sampled values come in runs of this many neighbours (one cache line of floats), so a
  //! sample costs far less than as many random reads.
  std::size_t run_length = 16;
  //! When the sample would cover this fraction of a layer or more, the threshold comes
  //! from the histogram of the whole layer instead (one more read, an exact histogram).
  double full_histogram_above = 0.25;
};

//! Threshold sparsification with error feedback (approximate top-k). Models Compressor.
//!
//! Per layer: a low threshold comes from a stratified sample of u = g + e (runs of
//! neighbours at seeded random places, one per stratum), whose magnitudes are counted in
//! a histogram and interpolated inside the boundary bin; for small layers, or when the
//! sample would be large, from the histogram of the whole layer. One fused pass then
//! forms u, writes it over e and collects every |u| at or above it. When more than k were
//! collected, the threshold t is raised to the k-th largest of them; every |u| >= t is
//! sent (ties included, so all-equal data sends everything) and zeroed in e. When the
//! sample erred high, fewer than k are sent: there is never a second read of g or e.
//! The pass already zeroes the candidates at or above the sample's central estimate, so
//! only those between it and t are written again, at scattered places (a few thousand
//! at 2^24 and 1%, against the 20-25 thousand of the low threshold's margin).
//! Infinities and NaNs are never sent (compress_stats::non_finite reports them).
class threshold : public sparse_layers {
 public:
  //! Opt-in tag for the Compressor concept.
  using compressor_tag = void;
  //! Works on host memory.
  using memory_space = host_space;
  //! Options (see threshold_options).
  using options = threshold_options;
  //! Values at shared indices can be summed elementwise.
  static constexpr bool summable_by_index = true;

  //! A compressor for \p lay; the workspace is sized here, once.
  threshold(const layout& lay, const options& opt = {}) : sparse_layers(lay), options_(opt) {
    require(opt.expected_hits >= 1, "threshold: expected_hits must be at least 1");
    require(opt.run_length >= 1, "threshold: run_length must be at least 1");
    require(opt.full_histogram_above > 0.0 && opt.full_histogram_above <= 1.0,
            "threshold: full_histogram_above must be in (0, 1]");
    std::size_t largest = 0;
    for (const auto& l : lay.layers()) {
      require(l.numel <= 0xffffffffull, "threshold: layers of 2^32 or more elements are not supported");
      largest = std::max(largest, l.numel);
    }
    work_ = detail::fused_topk_workspace(largest, 1);
    // The largest sample estimate() draws: below full_histogram_above of the layer.
    sample_keys_.resize(static_cast<std::size_t>(opt.full_histogram_above * static_cast<double>(largest)) +
                        opt.run_length);
  }

  //! Sends every |u| at or above each layer's estimated threshold; e = u - sent.
  std::size_t compress(host_view g, host_view e, const step_params& p, std::span<std::byte> out, compress_stats& st) {
    return compress_layers(
        layout_, kind, g.span(), e.span(), p, out, st, scratch_,
        [&](byte_writer& w, std::uint32_t index, std::span<const float> gl, std::span<float> el, double fraction,
            layer_stats& ls, const gain_report& gain) {
          const bool want_gain = !p.gain_candidates.empty();
          const std::uint64_t k = kept_count(gl.size(), fraction);
          const auto t = estimate(gl, el, fraction, detail::mix_seed(p.seed, p.step, layout_[index].id));
          const auto hs = want_gain ? detail::gain_sampling(hist_, gl.size(), p.step) : detail::histogram_sampling{};
          // Candidates at or above the central estimate leave the pass as zero in e (about k
          // of them, nearly all sent), so sending reads no scattered memory; keep_selected
          // then writes back the few not sent and zeroes the few sent below it.
          const auto r = work_.fuse(gl, el, 0, t.collect, hs, t.zero);
          if (r.non_finite) st.non_finite = true;
          std::size_t count = r.collected;
          const detail::candidate_run all{0, r.collected};
          // More than k at or above the (low) estimate: the threshold rises to the k-th
          // largest of them, keeping every value equal to it (|u| >= t, ties included).
          const auto kth = count > k ? work_.select(std::span<const detail::candidate_run>(&all, 1), k)
                                     : detail::kth_key{t.collect, 0};
          // The curve: the candidates hold every key at or above the sending threshold, so
          // the bins above its bin are exact, the rest the sample's (complete_sampled_gain).
          if (want_gain)
            gain.add(detail::complete_sampled_gain(work_, hs, detail::exact_gain_from(kth.key), 0, r.collected),
                     gl.size());
          hist_.clear();
          if (count <= k) {
            work_.zero_below(all, t.zero, el);  // every candidate is sent
          } else {
            std::uint64_t all_ties = r.collected;
            count = work_.keep_selected(all, kth.key, all_ties, el, t.zero);
          }
          const double ksq = work_.write_segment_from_candidates(w, index, el.size(), 0, count);
          ls = {count, r.grad_sq, r.input_sq, ksq};
        });
  }

  //! The keys of a layer's estimate (magnitude_key of |u|; detail::no_guess: none).
  struct estimate_keys {
    //! The low threshold: the fused pass collects every key >= it. From the whole layer's
    //! histogram it is the lower edge of the boundary bin (at least k lie above); from a
    //! sample it is set a few standard deviations of the sampled count low, so that at
    //! least k lie above it almost surely.
    std::uint32_t collect = detail::no_guess;
    //! The central estimate (>= collect): candidates at or above it are zeroed in e by the
    //! pass, as if sent. From the whole histogram, collect itself.
    std::uint32_t zero = detail::no_guess;
  };

  //! Estimates the keys of layer (\p g, \p e) for kept \p fraction; \p seed places the sample.
  [[nodiscard]] estimate_keys estimate(std::span<const float> g, std::span<const float> e, double fraction,
                                       std::uint64_t seed) {
    const std::size_t n = g.size();
    const double k = static_cast<double>(kept_count(n, fraction));
    if (k == 0) return {};
    const double f = k / static_cast<double>(n);
    const std::size_t run = std::min(options_.run_length, n);
    const double wanted = static_cast<double>(options_.expected_hits) / f;
    sample_hist_.clear();
    bool sampled = false;
    double scale = 1;  // layer elements per sampled element
    const std::size_t runs = std::max<std::size_t>(1, static_cast<std::size_t>(std::ceil(wanted / run)));
    const std::size_t stratum = n / runs;
    std::size_t stored = 0;  // sampled keys in sample_keys_
    if (wanted >= options_.full_histogram_above * static_cast<double>(n) || stratum < run ||
        runs * run > sample_keys_.size()) {
      add_sum_to_histogram(g, e, sample_hist_);
    } else {
      // Strata of equal size, one run of neighbours at a seeded random place in each.
      // The runs lie at random places of a layer that is not in the cache: their places are
      // drawn a batch ahead and prefetched, so the misses overlap instead of queueing.
      detail::splitmix64 rng(seed);
      const std::size_t room = stratum - run + 1;
      constexpr std::size_t batch = 16;
      std::size_t at[batch];
      for (std::size_t s0 = 0; s0 < runs; s0 += batch) {
        const std::size_t m = std::min(batch, runs - s0);
        for (std::size_t j = 0; j < m; ++j) {
          at[j] = (s0 + j) * stratum + static_cast<std::size_t>(rng.next() % room);
          for (std::size_t b = 0; b < run + 15; b += 16) {  // every 64-byte line of the run
            const std::size_t i = at[j] + std::min(b, run - 1);
            __builtin_prefetch(g.data() + i);
            __builtin_prefetch(e.data() + i);
          }
        }
        for (std::size_t j = 0; j < m; ++j) {  // the histogram and the keys themselves
          std::uint32_t kmin = 0xffffffffu, kmax = 0;
          for (std::size_t i = at[j]; i < at[j] + run; ++i) {
            const std::uint32_t key = magnitude_key(g[i] + e[i]);
            kmin = std::min(kmin, key);
            kmax = std::max(kmax, key);
            sample_hist_.add_unchecked(key);
            sample_keys_[stored++] = key;
          }
          sample_hist_.note_range(kmin, kmax);
        }
      }
      scale = static_cast<double>(n) / static_cast<double>(runs * run);
      sampled = true;
    }
    const std::uint64_t finite = sample_hist_.finite_count();
    if (finite == 0) return {};
    if (!sampled) {
      const std::uint32_t edge = magnitude_histogram::lower_key(
          find_boundary(sample_hist_, std::min(static_cast<std::uint64_t>(k), finite)).bin);
      return {edge, edge};
    }
    // Aim below the estimate by four standard deviations of the sampled count, so that the
    // pass almost always collects at least k; the exact k-th is then taken among them. Both
    // keys are order statistics of the sample itself: interpolating inside the histogram's
    // boundary bin (a sixteenth of an octave) assumes its values spread evenly, which the
    // steep tail at 0.1% kept and error feedback's pile-up below the threshold do not
    // (measured at 2^22 and 0.1% over 150 steps: half the steps sent up to 11% fewer than k).
    const double hits = k / scale;
    const auto rank_low =
        std::min<std::uint64_t>(finite, static_cast<std::uint64_t>(std::ceil(hits + 4.0 * std::sqrt(hits) + 4.0)));
    const auto rank_mid =
        std::min<std::uint64_t>(rank_low, std::max<std::uint64_t>(1, static_cast<std::uint64_t>(std::ceil(hits))));
    // Only the sampled keys from the lower rank's bin up can be either: move them to the front.
    const std::uint32_t edge = magnitude_histogram::lower_key(find_boundary(sample_hist_, rank_low).bin);
    std::size_t top = 0;
    for (std::size_t i = 0; i < stored; ++i) {
      const std::uint32_t key = sample_keys_[i];
      sample_keys_[top] = key;
      top += (key >= edge && key < non_finite_key) ? 1u : 0u;
    }
    const auto desc = sample_keys_.begin();
    std::nth_element(desc, desc + static_cast<std::ptrdiff_t>(rank_low - 1), desc + static_cast<std::ptrdiff_t>(top),
                     std::greater<>());
    const std::uint32_t low = sample_keys_[rank_low - 1];
    // rank_mid <= rank_low: its key is among the rank_low - 1 larger ones before it.
    std::nth_element(desc, desc + static_cast<std::ptrdiff_t>(rank_mid - 1),
                     desc + static_cast<std::ptrdiff_t>(rank_low - 1), std::greater<>());
    const std::uint32_t mid = rank_mid == rank_low ? low : sample_keys_[rank_mid - 1];
    return {low, std::max(low, mid)};
  }

 private:
  options options_;
  layered_scratch scratch_;
  detail::fused_topk_workspace work_;
  magnitude_histogram hist_;                // |u| of the layer, for the gain curve
  magnitude_histogram sample_hist_;         // |u| of the sample
  std::vector<std::uint32_t> sample_keys_;  // the sampled keys (sized once: the largest sample)
};
static_assert(Compressor<threshold>);
static_assert(IndexSelector<threshold>);

}  // namespace gravac
