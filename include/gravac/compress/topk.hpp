#pragma once
//! \file topk.hpp
//! \brief Exact top-k with error feedback: the k entries of largest |u|, ties to the lower
//! index, per layer or over the whole buffer. Runs the fused kernel of
//! detail/fused_topk.hpp (the tests check it against tests/support/topk_reference.hpp).

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "gravac/compress/detail/fused_topk.hpp"
#include "gravac/compress/detail/select_topk_indices.hpp"
#include "gravac/compress/index_selection.hpp"
#include "gravac/compress/layered.hpp"
#include "gravac/compress/sparse_layers.hpp"
#include "gravac/concepts/concepts.hpp"
#include "gravac/core/error.hpp"
#include "gravac/packet/packet_bound.hpp"
#include "gravac/packet/sparse_packet.hpp"
#include "gravac/stats/gain_curve.hpp"
#include "gravac/stats/magnitude_histogram.hpp"

namespace gravac {

//! Options of top-k.
struct topk_options {
  bool whole_buffer = false;  //!< select over the whole buffer (global k) instead of per layer
  unsigned threads = 1;       //!< threads for the fused pass of large layers (1: none started)
  //! The fused pass counts the elements down to this fraction of the last threshold (its
  //! floor) and collects those above a guess learnt from the last steps' candidates
  //! (detail::adaptive_guess): when the guess was too high, one read of e collects from
  //! the floor; only when the floor was too high as well does a histogram of the layer
  //! come first. A smaller margin makes the histogram rarer; it does not lengthen the
  //! candidate list.
  float guess_margin = 0.875f;
};

//! Exact top-k sparsification with error feedback. Models Compressor.
//!
//! Per layer (or over the concatenation of the compressed layers with whole_buffer), the
//! k = kept_count(numel, fraction) values of largest |u| are sent, ties to the lower
//! index. Infinities and NaNs are never selected: they stay in the residual and
//! compress_stats::non_finite is set (k is then at most the number of finite values).
class topk : public sparse_layers {
 public:
  //! Opt-in tag for the Compressor concept.
  using compressor_tag = void;
  //! Works on host memory.
  using memory_space = host_space;
  //! Options (see topk_options).
  using options = topk_options;
  //! Values at shared indices can be summed elementwise.
  static constexpr bool summable_by_index = true;

  //! A compressor for \p lay; the workspace is sized here, once.
  topk(const layout& lay, const options& opt = {})
      : sparse_layers(lay), options_(opt), work_(opt.whole_buffer ? lay.numel() : largest_layer(lay), opt.threads) {
    require(opt.threads >= 1 && opt.threads <= 256, "topk: threads must be in [1, 256]");
    require(opt.guess_margin > 0.0f && opt.guess_margin <= 1.0f, "topk: guess_margin must be in (0, 1]");
    for (const auto& l : lay.layers())
      require(l.numel <= 0xffffffffull, "topk: layers of 2^32 or more elements are not supported");
    guess_.assign(lay.size(), detail::adaptive_guess(opt.guess_margin));
    whole_guess_ = detail::adaptive_guess(opt.guess_margin);
    sampled_ = detail::gain_sample_slots_of(lay);
    layer_sums_.resize(lay.size());
    count_.assign(lay.size(), 0);
    runs_.reserve(lay.size());
  }

  //! Keeps the top kept_fraction of each layer (or of the whole buffer); e = u - sent.
  std::size_t compress(host_view g, host_view e, const step_params& p, std::span<std::byte> out, compress_stats& st) {
    if (options_.whole_buffer) return compress_whole(g.span(), e.span(), p, out, st);
    return compress_layers(
        layout_, kind, g.span(), e.span(), p, out, st, scratch_,
        [&](byte_writer& w, std::uint32_t index, std::span<const float> gl, std::span<float> el, double fraction,
            layer_stats& ls, const gain_report& gain) {
          const std::size_t slot = 0;  // one layer at a time: the workspace is reused
          const bool want_gain = !p.gain_candidates.empty();
          const auto hs = want_gain ? detail::gain_sampling(hist_, gl.size(), p.step) : detail::histogram_sampling{};
          std::uint64_t k = kept_count(gl.size(), fraction);
          const auto keys = guess_[index].next(k);
          // The pass leaves its candidates at or above the central estimate as zero in e
          // (their values live in the list), so sending reads no scattered memory;
          // keep_selected writes back the few of them not sent and zeroes the few sent below.
          const auto r = work_.fuse(gl, el, slot, keys.guess, hs, keys.zero, keys.floor);
          bool zeroed = keys.guess != detail::no_guess;
          const auto unzero = [&] {  // before anything reads u from e again
            if (zeroed) work_.restore_zeroed({slot, r.collected}, keys.zero, el);
            zeroed = false;
          };
          // hist_ holds every element only when the gain histogram took every element; a
          // sampled one stays for the curve, and a second read counts into counts_.
          const bool sampled = want_gain && hs.stride > 1;
          magnitude_histogram& whole = sampled ? counts_ : hist_;
          bool counted = want_gain && hs.stride == 1;
          const bool miss = k > 0 && r.collected < k;
          if ((r.non_finite || (miss && r.at_floor < k)) && !counted) {
            unzero();
            // A second read of u: the whole histogram (with energies when it is the gain
            // curve's too). A miss whose floor holds k or more needs none: it collects from
            // the floor.
            whole.clear();
            detail::histogram_of_layer(el, whole, want_gain && !sampled);
            counted = true;
          }
          if (r.non_finite) {
            st.non_finite = true;
            k = std::min(k, whole.finite_count());
          }
          std::size_t collected = r.collected;
          std::uint32_t complete_from = keys.guess;  // every finite key at or above it is a candidate
          if (k > 0 && collected < k) {  // miss: collect again, from the histogram's boundary bin or the floor
            unzero();
            complete_from = counted ? magnitude_histogram::lower_key(find_boundary(whole, k).bin) : keys.floor;
            collected = work_.recollect(el, slot, complete_from);
          }
          if (k == 0) unzero();
          std::size_t count = 0;
          if (k > 0) {
            const detail::candidate_run run{slot, collected};
            const std::span<const detail::candidate_run> runs(&run, 1);
            const auto t = work_.select(runs, k);
            guess_[index].learn(t.key, work_.candidate_bits(), runs, r.collected,
                                complete_from);  // before keep_selected compacts
            // The curve: the candidates hold every key at or above t's, so the bins above
            // t's are exact, the rest the sample's (complete_sampled_gain); before the
            // candidates are compacted.
            if (want_gain)
              gain.add(detail::complete_sampled_gain(work_, hs, detail::exact_gain_from(t.key), slot, collected),
                       gl.size());
            std::uint64_t ties = t.ties;
            count =
                zeroed ? work_.keep_selected(run, t.key, ties, el, keys.zero) : work_.keep_selected(run, t.key, ties);
          } else if (want_gain) {
            gain.add(hist_, gl.size());  // nothing sent: every bin from the sample (exact for small layers)
          }
          const double ksq = zeroed ? work_.write_segment_from_candidates(w, index, el.size(), slot, count)
                                    : work_.write_segment_from(w, index, el, slot, count);
          hist_.clear();
          counts_.clear();
          ls = {count, r.grad_sq, r.input_sq, ksq};
        });
  }

 private:
  static std::size_t largest_layer(const layout& lay) noexcept {
    std::size_t m = 0;
    for (const auto& l : lay.layers()) m = std::max(m, l.numel);
    return m;
  }

  struct sums {
    double grad_sq = 0, input_sq = 0;
  };

  // Global top-k over the compressed layers: the fused pass runs over every compressed
  // layer (candidates in each layer's own region), one selection over all regions, then
  // the skeleton writes each layer's segment from its region.
  std::size_t compress_whole(std::span<const float> g, std::span<float> e, const step_params& p,
                             std::span<std::byte> out, compress_stats& st) {
    require(g.size() == layout_.numel() && e.size() == layout_.numel(),
            "compress: buffer size does not match the layout");
    require(p.kept_fraction.size() == layout_.size(), "compress: one kept fraction per layer is required");
    const bool want_gain = !p.gain_candidates.empty();
    const std::size_t cands = p.gain_candidates.size();
    // Each compressed layer's part of the curve, added in layer order at the end; a sampled
    // layer's waits for the selection's threshold (its sample kept in samples_).
    layer_gain_.assign(layout_.size() * cands, 0.0);
    const auto gain_row = [&](std::size_t i) { return std::span<double>(layer_gain_).subspan(i * cands, cands); };
    if (want_gain && samples_.size() < sampled_.count) samples_.resize(sampled_.count);  // first use: 64 KiB each
    unit_hist_.clear();
    std::size_t total = 0, collected = 0, at_floor = 0;
    for (std::size_t i = 0; i < layout_.size(); ++i)
      if (layout_[i].numel > 0 && p.kept_fraction[i] < dense_fraction) total += layout_[i].numel;
    std::uint64_t k = kept_count(total, p.global_fraction);
    const auto keys = whole_guess_.next(k);
    bool non_finite = false, all_counted = true;
    runs_.clear();
    for (std::size_t i = 0; i < layout_.size(); ++i) {
      const auto& l = layout_[i];
      count_[i] = 0;
      if (l.numel == 0 || p.kept_fraction[i] >= dense_fraction) continue;
      const auto hs = want_gain ? detail::gain_sampling(hist_, l.numel, p.step) : detail::histogram_sampling{};
      // Candidates left as zero in e, as in the per-layer path.
      const auto r = work_.fuse(g.subspan(l.offset, l.numel), e.subspan(l.offset, l.numel), l.offset, keys.guess, hs,
                                keys.zero, keys.floor);
      layer_sums_[i] = {r.grad_sq, r.input_sq};
      count_[i] = r.collected;
      collected += r.collected;
      at_floor += r.at_floor;
      non_finite = non_finite || r.non_finite;
      if (want_gain && hs.stride == 1) {  // exact: the curve now
        add_gain_curve(hist_, l.numel, p.gain_candidates, gain_row(i));
        unit_hist_.merge(hist_);
        hist_.clear();
      } else if (want_gain) {
        std::swap(hist_, samples_[sampled_.slot[i]]);  // the sample waits for the threshold; hist_ is empty
        all_counted = false;                           // a sample: a miss must read the layers again
      }
    }
    bool counted = want_gain && all_counted;
    bool zeroed = keys.guess != detail::no_guess;
    const auto unzero = [&] {  // before anything reads u from e again
      if (zeroed)
        for (std::size_t i = 0; i < layout_.size(); ++i)
          if (count_[i] > 0)
            work_.restore_zeroed({layout_[i].offset, count_[i]}, keys.zero,
                                 e.subspan(layout_[i].offset, layout_[i].numel));
      zeroed = false;
    };
    // A second read of every compressed layer: their whole histogram (counts).
    auto count_all = [&] {
      if (counted) return;
      unzero();
      unit_hist_.clear();
      for (std::size_t i = 0; i < layout_.size(); ++i) {
        const auto& l = layout_[i];
        if (l.numel == 0 || p.kept_fraction[i] >= dense_fraction) continue;
        detail::histogram_of_layer(e.subspan(l.offset, l.numel), hist_, false);
        unit_hist_.merge(hist_);
        hist_.clear();
      }
      counted = true;
    };
    // The sampled layers' curves, once the threshold is known (key: none when nothing is
    // sent): their candidates hold every key above its bin (complete_sampled_gain).
    const auto sampled_curves = [&](std::uint32_t key) {
      if (!want_gain) return;
      for (std::size_t i = 0; i < layout_.size(); ++i) {
        const auto& l = layout_[i];
        if (l.numel == 0 || p.kept_fraction[i] >= dense_fraction || sampled_.slot[i] == detail::no_gain_sample)
          continue;
        magnitude_histogram& h = samples_[sampled_.slot[i]];
        const auto hs = detail::gain_sampling(h, l.numel, p.step);
        add_gain_curve(detail::complete_sampled_gain(work_, hs, detail::exact_gain_from(key), l.offset, count_[i]),
                       l.numel, p.gain_candidates, gain_row(i));
        h.clear();
      }
    };
    const std::size_t collected_at_guess = collected;
    std::uint32_t complete_from = keys.guess;
    if (non_finite) {
      count_all();
      k = std::min(k, unit_hist_.finite_count());
    }
    if (k > 0 && collected < k) {  // miss: collect again, from the floor when it holds k, else from the histogram
      const bool from_floor = !counted && at_floor >= k;
      unzero();
      if (!from_floor) count_all();
      const auto floor = from_floor ? keys.floor : magnitude_histogram::lower_key(find_boundary(unit_hist_, k).bin);
      complete_from = floor;
      for (std::size_t i = 0; i < layout_.size(); ++i)
        if (layout_[i].numel > 0 && p.kept_fraction[i] < dense_fraction)
          count_[i] = work_.recollect(e.subspan(layout_[i].offset, layout_[i].numel), layout_[i].offset, floor);
    }
    if (k > 0) {
      for (std::size_t i = 0; i < layout_.size(); ++i)
        if (count_[i] > 0) runs_.push_back({layout_[i].offset, count_[i]});
      const auto t = work_.select(runs_, k);
      whole_guess_.learn(t.key, work_.candidate_bits(), runs_, collected_at_guess,
                         complete_from);  // before keep_selected
      sampled_curves(t.key);
      std::uint64_t ties = t.ties;
      // Layers in layout order, each in index order: the global index order.
      for (std::size_t i = 0; i < layout_.size(); ++i)
        if (count_[i] > 0)
          count_[i] = zeroed ? work_.keep_selected({layout_[i].offset, count_[i]}, t.key, ties,
                                                   e.subspan(layout_[i].offset, layout_[i].numel), keys.zero)
                             : work_.keep_selected({layout_[i].offset, count_[i]}, t.key, ties);
    } else {
      sampled_curves(detail::no_guess);
      unzero();
      std::fill(count_.begin(), count_.end(), 0);
    }
    whole_gain_.assign(cands, 0.0);
    for (std::size_t i = 0; i < layout_.size(); ++i)
      for (std::size_t c = 0; c < cands; ++c) whole_gain_[c] += layer_gain_[i * cands + c];
    const std::size_t bytes = compress_layers(
        layout_, kind, g, e, p, out, st, scratch_,
        // The curve of the compressed layers is whole_gain_, from the selection's own pass.
        [&](byte_writer& w, std::uint32_t index, std::span<const float>, std::span<float> el, double, layer_stats& ls,
            const gain_report&) {
          const double ksq =
              zeroed ? work_.write_segment_from_candidates(w, index, el.size(), layout_[index].offset, count_[index])
                     : work_.write_segment_from(w, index, el, layout_[index].offset, count_[index]);
          ls = {count_[index], layer_sums_[index].grad_sq, layer_sums_[index].input_sq, ksq};
        });
    for (std::size_t c = 0; c < whole_gain_.size(); ++c) st.candidate_kept_sq[c] += whole_gain_[c];
    st.non_finite = st.non_finite || non_finite;
    return bytes;
  }

  options options_;
  layered_scratch scratch_;
  detail::fused_topk_workspace work_;
  magnitude_histogram hist_;                   // one layer's |u| (a sample of a large layer's, for the gain curve)
  magnitude_histogram counts_;                 // a large layer's |u| read again after a miss (counts only)
  magnitude_histogram unit_hist_;              // all compressed layers' |u| (whole-buffer mode)
  std::vector<detail::adaptive_guess> guess_;  // per layer: where the fused pass collects from
  detail::adaptive_guess whole_guess_;
  std::vector<sums> layer_sums_;
  std::vector<std::size_t> count_;
  std::vector<detail::candidate_run> runs_;
  std::vector<double> whole_gain_;
  std::vector<double> layer_gain_;            // whole-buffer mode: each layer's part of the curve
  detail::gain_sample_slots sampled_;         // whole-buffer mode: a sampled layer's place in samples_
  std::vector<magnitude_histogram> samples_;  // their samples, made on the first step with a gain curve
};
static_assert(Compressor<topk>);
static_assert(IndexSelector<topk>);

}  // namespace gravac
