#pragma once
//! \file fused_topk.hpp
//! \brief The CPU kernels of exact error-feedback top-k (and of threshold selection): the
//! workspace that runs them, and the include point of their parts.
//!
//! One pass over g and e collects the candidates, so a layer is usually read once; the pass
//! (fused_pass.hpp), its guess (fused_guess.hpp), the select (candidate_select.hpp) and the
//! residual update (candidate_segment.hpp): docs/algorithms.md, "Compressors" (Top-k).

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <thread>
#include <utility>
#include <vector>

#include "gravac/compress/detail/candidate_segment.hpp"
#include "gravac/compress/detail/candidate_select.hpp"
#include "gravac/compress/detail/fused_guess.hpp"
#include "gravac/compress/detail/fused_pass.hpp"
#include "gravac/compress/detail/gain_sampling.hpp"
#include "gravac/core/detail/isa_dispatch.hpp"
#include "gravac/core/detail/square_sum.hpp"
#include "gravac/packet/format.hpp"
#include "gravac/stats/gain_curve.hpp"
#include "gravac/stats/magnitude_histogram.hpp"

namespace gravac::detail {

//! The workspace and steps of the fused top-k: sized once for a buffer of \p capacity
//! elements, reused every step.
class fused_topk_workspace {
 public:
  //! A workspace for buffers of up to \p capacity elements, with \p threads threads for
  //! the fused pass of large layers (1: the calling thread only).
  explicit fused_topk_workspace(std::size_t capacity = 0, unsigned threads = 1)
      : idx_(capacity), bits_(capacity), digits_(std::size_t{1} << 12), threads_(std::max(1u, threads)) {
    if (threads_ > 1) {
      thread_hist_.resize(threads_);
      thread_results_.resize(threads_);
      pool_.reserve(threads_ - 1);
    }
  }

  //! Elements the workspace holds.
  [[nodiscard]] std::size_t capacity() const noexcept { return idx_.size(); }

  //! The fused pass over one layer whose candidates go to the slots at \p slot:
  //! u = g + e over e, sums, candidates with key >= \p guess, the elements \p hs selects
  //! into its histogram. Returns the measurements; candidates are contiguous. Candidates
  //! with key >= \p zero_from (no_guess: none) are left as zero in e (see
  //! fused_pass_chunk): then keep_selected or zero_below (with the residual) and
  //! write_segment_from_candidates must follow. With \p floor below \p guess (and no
  //! zero_from), the finite keys >= floor are counted too (fused_pass_result::at_floor).
  fused_pass_result fuse(std::span<const float> g, std::span<float> e, std::size_t slot, std::uint32_t guess,
                         const histogram_sampling& hs = {}, std::uint32_t zero_from = no_guess,
                         std::uint32_t floor = no_guess) {
    const std::size_t n = g.size();
    if (threads_ > 1 && n >= threads_ * min_chunk) return fuse_threaded(g, e, slot, guess, hs, zero_from, floor);
    return fuse_chunk(g.data(), e.data(), n, 0, guess, idx_.data() + slot, bits_.data() + slot, hs, zero_from, floor);
  }

  //! Adds the candidates among the \p count at \p slot whose key is \p from or more to \p h
  //! exactly (count and energy): the exact part of a sampled gain histogram.
  void add_candidates(magnitude_histogram& h, std::size_t slot, std::size_t count, std::uint32_t from) const noexcept {
    std::uint32_t kmin = 0xffffffffu, kmax = 0;
    const std::uint32_t* bp = bits_.data() + slot;
    for (std::size_t i = 0; i < count; ++i) {
      const std::uint32_t k = bp[i] & 0x7fffffffu;
      if (k < from) continue;
      kmin = std::min(kmin, k);
      kmax = std::max(kmax, k);
      h.add_unchecked(k);
    }
    h.note_range(kmin, kmax);
  }

  //! After a miss: collects every finite element of u (held in e) with key >= \p floor.
  std::size_t recollect(std::span<const float> u, std::size_t slot, std::uint32_t floor) noexcept {
    return collect_at_least(u, floor, idx_.data() + slot, bits_.data() + slot);
  }

  //! The k-th largest key over the candidate runs (k >= 1 and at most their total): see
  //! select_kth_key.
  kth_key select(std::span<const candidate_run> runs, std::uint64_t k) noexcept {
    return select_kth_key(bits_.data(), runs, k, digits_);
  }

  //! Keeps the selected candidates of \p run in place, in index order: see keep_selected
  //! (candidate_select.hpp).
  std::size_t keep_selected(candidate_run run, std::uint32_t t, std::uint64_t& ties_left,
                            std::span<float> residual = {}, std::uint32_t zero_from = 0) noexcept {
    return detail::keep_selected(slots(), run, t, ties_left, residual, zero_from);
  }

  //! Zeroes in \p residual the candidates of \p run with key below \p zero_from: see
  //! zero_below (candidate_select.hpp).
  void zero_below(candidate_run run, std::uint32_t zero_from, std::span<float> residual) noexcept {
    detail::zero_below(slots(), run, zero_from, residual);
  }

  //! Writes back the candidates of \p run that a pass with \p zero_from left as zero in
  //! \p residual: see restore_zeroed (candidate_select.hpp).
  void restore_zeroed(candidate_run run, std::uint32_t zero_from, std::span<float> residual) noexcept {
    detail::restore_zeroed(slots(), run, zero_from, residual);
  }

  //! Writes a layer's sparse segment from its candidates at \p slot, values from the
  //! candidate list: see detail::write_segment_from_candidates.
  double write_segment_from_candidates(byte_writer& w, std::uint32_t index, std::size_t numel, std::size_t slot,
                                       std::size_t count) {
    return detail::write_segment_from_candidates(w, slots(), index, numel, slot, count);
  }

  //! Writes a layer's sparse segment from its selected indices at \p slot, values from u
  //! held in \p e, zeroed there: see detail::write_segment_from.
  double write_segment_from(byte_writer& w, std::uint32_t index, std::span<float> e, std::size_t slot,
                            std::size_t count) {
    return detail::write_segment_from(w, slots(), index, e, slot, count);
  }

  //! The candidates' bit patterns (for adaptive_guess::learn).
  [[nodiscard]] const std::uint32_t* candidate_bits() const noexcept { return bits_.data(); }

  //! Selected index \p j of the layer at \p slot (after keep_selected).
  [[nodiscard]] std::uint32_t index_at(std::size_t slot, std::size_t j) const noexcept { return idx_[slot + j]; }
  //! Key of candidate \p j of the layer at \p slot.
  [[nodiscard]] std::uint32_t key_at(std::size_t slot, std::size_t j) const noexcept {
    return bits_[slot + j] & 0x7fffffffu;
  }

 private:
  candidate_slots slots() noexcept { return {idx_.data(), bits_.data()}; }

  // Below this many elements per thread a thread costs more than it saves.
  static constexpr std::size_t min_chunk = std::size_t{1} << 18;

  static fused_pass_result fuse_chunk(const float* g, float* e, std::size_t n, std::uint32_t base, std::uint32_t guess,
                                      std::uint32_t* idx, std::uint32_t* bits, const histogram_sampling& hs,
                                      std::uint32_t zero_from, std::uint32_t floor) noexcept {
#if GRAVAC_ISA_DISPATCH
    if (runs_avx2_kernels()) return fused_pass_avx2(g, e, n, base, guess, idx, bits, hs, zero_from, floor);
#endif
    return fused_pass<fused_lanes>(g, e, n, base, guess, idx, bits, hs, zero_from, floor);
  }

  // Splits the layer into one chunk per thread (whole blocks, so histogram sampling picks
  // the same blocks as one thread would); each collects into its own part of the layer's
  // region and fills its own histogram. The parts are then moved together (in index
  // order) and the histograms merged. A thread runs its chunk as granules of a power of two
  // blocks, each starting on a multiple of its size: a granule's sums are then a subtree of
  // the sums' tree (square_sum.hpp), and adding the granules' sums in that tree gives one
  // thread's bits whatever the number of threads.
  fused_pass_result fuse_threaded(std::span<const float> g, std::span<float> e, std::size_t slot, std::uint32_t guess,
                                  const histogram_sampling& hs, std::uint32_t zero_from, std::uint32_t floor) {
    const std::size_t n = g.size();
    const std::size_t blocks = (n + fused_block - 1) / fused_block;
    const std::size_t granule = std::bit_floor(std::max<std::size_t>(1, blocks / (threads_ * 4))) * fused_block;
    const std::size_t granules = (n + granule - 1) / granule;
    const std::size_t per = (granules + threads_ - 1) / threads_ * granule;
    granule_sums_.resize(granules);
    auto work = [&](unsigned t) {
      const std::size_t a = std::min(n, t * per), b = std::min(n, a + per);
      histogram_sampling ths = hs;
      if (hs.hist != nullptr) ths.hist = &thread_hist_[t];
      fused_pass_result tr;
      for (std::size_t q = a; q < b; q += granule) {
        const std::size_t m = std::min(granule, b - q);
        const fused_pass_result gr = fuse_chunk(g.data() + q, e.data() + q, m, static_cast<std::uint32_t>(q), guess,
                                                idx_.data() + slot + a + tr.collected,
                                                bits_.data() + slot + a + tr.collected, ths, zero_from, floor);
        granule_sums_[q / granule] = {gr.grad_sq, gr.input_sq};
        tr.collected += gr.collected;
        tr.at_floor += gr.at_floor;
        tr.non_finite = tr.non_finite || gr.non_finite;
      }
      thread_results_[t] = tr;
    };
    for (unsigned t = 1; t < threads_; ++t) pool_.emplace_back(work, t);
    work(0);
    pool_.clear();  // joins
    fused_pass_result r;
    std::size_t c = 0, at_floor = 0;
    for (unsigned t = 0; t < threads_; ++t) {
      const auto& tr = thread_results_[t];
      const std::size_t a = std::min(n, t * per);
      if (c != a) {
        std::memmove(idx_.data() + slot + c, idx_.data() + slot + a, tr.collected * sizeof(std::uint32_t));
        std::memmove(bits_.data() + slot + c, bits_.data() + slot + a, tr.collected * sizeof(std::uint32_t));
      }
      c += tr.collected;
      at_floor += tr.at_floor;
      r.non_finite = r.non_finite || tr.non_finite;
      if (hs.hist != nullptr) {
        hs.hist->merge(thread_hist_[t]);
        thread_hist_[t].clear();
      }
    }
    pairwise_sum grad_tree, input_tree;
    for (const auto& [gs, us] : granule_sums_) {
      grad_tree.push(gs);
      input_tree.push(us);
    }
    r.grad_sq = grad_tree.total();
    r.input_sq = input_tree.total();
    r.collected = c;
    r.at_floor = at_floor;
    return r;
  }

  std::vector<std::uint32_t> idx_;
  std::vector<std::uint32_t> bits_;
  std::vector<std::uint64_t> digits_;
  unsigned threads_ = 1;
  std::vector<magnitude_histogram> thread_hist_;
  std::vector<fused_pass_result> thread_results_;
  std::vector<std::pair<double, double>> granule_sums_;  // ||g||^2 and ||u||^2 of each granule
  std::vector<std::jthread> pool_;
};
//! Completes the gain histogram after a fused pass with sampling \p hs whose \p count
//! candidates at \p slot hold every finite value of gain bin \p exact_from and above
//! (exact_gain_from of the step's sending threshold, or of a key at or below it): a sampled
//! histogram's bins from there on are replaced by those candidates, exactly; a full one is
//! already exact. The curve itself is then gain_report::add's.
inline const magnitude_histogram& complete_sampled_gain(const fused_topk_workspace& w, const histogram_sampling& hs,
                                                        std::uint32_t exact_from, std::size_t slot,
                                                        std::size_t count) noexcept {
  constexpr unsigned per = gain_bin_shift - magnitude_histogram::shift;  // histogram bins per gain bin: 2^per
  if (hs.stride > 1 && exact_from < gain_bins) {
    hs.hist->clear_from(exact_from << per);
    w.add_candidates(*hs.hist, slot, count, exact_from << gain_bin_shift);
  }
  return *hs.hist;
}

}  // namespace gravac::detail
