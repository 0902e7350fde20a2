#pragma once
//! \file fused_topk.hpp
//! \brief The CPU kernels of exact error-feedback top-k (and of threshold selection).
//!
//! One fused pass forms u = g + e, writes u over e, sums ||g||^2 and ||u||^2, optionally
//! fills a magnitude histogram, and collects (index, key) of every element whose |u| is at
//! or above a guessed key (the previous step's threshold widened by a margin, or an
//! estimate from a sample). When at least k elements were collected, the exact top-k is
//! among them and is resolved from the short list by a radix select on the keys; the
//! residual update is then k scattered writes of zero. Only a miss (too few collected)
//! costs a second read of e, guided by the histogram. Ties go to the lower index, which
//! makes the result identical to the sort-based reference.
//!
//! Candidates live in a workspace as long as the gradient buffer, in the region of each
//! layer (at the layer's offset), so no list can overflow and nothing is allocated per step.

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <thread>
#include <vector>

#include "gravac/compress/magnitude_histogram.hpp"
#include "gravac/compress/sparse_packet.hpp"
#include "gravac/packet.hpp"

namespace gravac::detail {

//! A guess that collects nothing.
inline constexpr std::uint32_t no_guess = 0xffffffffu;

//! What one fused pass over a layer measured.
struct fused_pass_result {
  double grad_sq = 0;          //!< ||g||^2
  double input_sq = 0;         //!< ||u||^2
  std::size_t collected = 0;   //!< elements at or above the guess (finite only)
  bool non_finite = false;     //!< a NaN or infinity was seen in u
};

//! The k-th largest key among candidates and how many of the candidates equal to it are
//! selected (the ones of lowest index).
struct kth_key {
  std::uint32_t key = 0;   //!< the k-th largest key
  std::uint64_t ties = 0;  //!< candidates with this key to take, lowest index first
};

//! A run of candidates: the first slot in the workspace and their number.
struct candidate_run {
  std::size_t first = 0;  //!< slot of the first candidate
  std::size_t count = 0;  //!< candidates in the run
};

//! The fused pass over one chunk: u = g + e stored in e; keys >= guess (and finite) collected
//! into idx/key in index order (idx relative to \p base). Histogram when \p h is not null.
template <bool Collect, bool Hist, bool Energy>
fused_pass_result fused_pass_chunk(const float* g, float* e, std::size_t n, std::uint32_t base, std::uint32_t guess,
                                   std::uint32_t* idx, std::uint32_t* key, magnitude_histogram* h) noexcept {
  constexpr std::size_t block = 512;
  constexpr std::size_t lanes = 16;
  alignas(64) std::uint32_t keys[block];
  double gs[lanes] = {}, us[lanes] = {};
  std::uint32_t kmin = 0xffffffffu, kmax = 0;
  std::size_t c = 0;
  // Collect keys in [guess, non_finite_key): one unsigned compare.
  const std::uint32_t span_keys = guess <= non_finite_key ? non_finite_key - guess : 0;
  for (std::size_t b0 = 0; b0 < n; b0 += block) {
    const std::size_t m = std::min(block, n - b0);
    const float* gb = g + b0;
    float* eb = e + b0;
    // Simple loops over a block that stays in L1, each one the compiler vectorizes:
    // u and its key; the sums (lane-wise, so no reassociation is needed); the key range.
    for (std::size_t j = 0; j < m; ++j) {
      const float u = gb[j] + eb[j];
      eb[j] = u;
      keys[j] = std::bit_cast<std::uint32_t>(u) & 0x7fffffffu;
    }
    // Squares summed in float lanes within the block (64 terms per lane: relative error
    // below 1e-5, typically 1e-7) and in double across blocks; double lanes would not
    // vectorize on baseline x86-64.
    float fg[lanes] = {}, fu[lanes] = {};
    std::size_t j = 0;
    for (; j + lanes <= m; j += lanes) {
      for (std::size_t l = 0; l < lanes; ++l) {
        fg[l] += gb[j + l] * gb[j + l];
        fu[l] += eb[j + l] * eb[j + l];
      }
    }
    for (; j < m; ++j) {
      fg[0] += gb[j] * gb[j];
      fu[0] += eb[j] * eb[j];
    }
    for (std::size_t l = 0; l < lanes; ++l) {
      gs[l] += fg[l];
      us[l] += fu[l];
    }
    for (std::size_t i = 0; i < m; ++i) {
      kmin = std::min(kmin, keys[i]);
      kmax = std::max(kmax, keys[i]);
    }
    if constexpr (Hist) {
      for (std::size_t i = 0; i < m; ++i) {
        if constexpr (Energy)
          h->add_unchecked(keys[i]);
        else
          h->count_unchecked(keys[i]);
      }
    }
    if constexpr (Collect) {
      // A bit mask per group of 16 (vectorized compares); candidates are rare, so the
      // loop over set bits runs seldom.
      const auto at = static_cast<std::uint32_t>(base + b0);
      std::size_t i = 0;
      for (; i + 16 <= m; i += 16) {
        std::uint32_t mask = 0;
        for (std::uint32_t l = 0; l < 16; ++l) mask |= static_cast<std::uint32_t>((keys[i + l] - guess) < span_keys) << l;
        while (mask != 0) {
          const auto l = static_cast<std::uint32_t>(std::countr_zero(mask));
          idx[c] = at + static_cast<std::uint32_t>(i) + l;
          key[c] = keys[i + l];
          ++c;
          mask &= mask - 1;
        }
      }
      for (; i < m; ++i) {
        idx[c] = at + static_cast<std::uint32_t>(i);
        key[c] = keys[i];
        c += (keys[i] - guess) < span_keys ? 1u : 0u;
      }
    }
  }
  if constexpr (Hist) h->note_range(kmin, kmax);
  fused_pass_result r;
  for (std::size_t l = 0; l < lanes; ++l) {
    r.grad_sq += gs[l];
    r.input_sq += us[l];
  }
  r.collected = c;
  r.non_finite = n > 0 && kmax >= non_finite_key;
  return r;
}

//! Collects (index, key) of the finite elements of \p u with key >= \p floor, in index order.
inline std::size_t collect_at_least(std::span<const float> u, std::uint32_t floor, std::uint32_t* idx,
                                    std::uint32_t* key) noexcept {
  const std::uint32_t span_keys = floor <= non_finite_key ? non_finite_key - floor : 0;
  std::size_t c = 0;
  for (std::size_t i = 0; i < u.size(); ++i) {
    const std::uint32_t k = magnitude_key(u[i]);
    idx[c] = static_cast<std::uint32_t>(i);
    key[c] = k;
    c += (k - floor) < span_keys ? 1u : 0u;
  }
  return c;
}

//! Counts |u| into \p h (no energy): the histogram a miss needs.
inline void count_into_histogram(std::span<const float> u, magnitude_histogram& h) noexcept {
  std::uint32_t kmin = 0xffffffffu, kmax = 0;
  for (float x : u) {
    const std::uint32_t k = magnitude_key(x);
    kmin = std::min(kmin, k);
    kmax = std::max(kmax, k);
    h.count_unchecked(k);
  }
  h.note_range(kmin, kmax);
}

//! The workspace and steps of the fused top-k: sized once for a buffer of \p capacity
//! elements, reused every step.
class fused_topk_workspace {
 public:
  //! A workspace for buffers of up to \p capacity elements, with \p threads threads for
  //! the fused pass of large layers (1: the calling thread only).
  explicit fused_topk_workspace(std::size_t capacity = 0, unsigned threads = 1)
      : idx_(capacity), key_(capacity), digits_(std::size_t{1} << 12), threads_(std::max(1u, threads)) {
    if (threads_ > 1) {
      thread_hist_.resize(threads_);
      thread_results_.resize(threads_);
      pool_.reserve(threads_ - 1);
    }
  }

  //! Elements the workspace holds.
  [[nodiscard]] std::size_t capacity() const noexcept { return idx_.size(); }

  //! The fused pass over one layer whose candidates go to the slots at \p slot:
  //! u = g + e over e, sums, candidates with key >= \p guess, histogram into \p h if given
  //! (with energies when \p energy). Returns the measurements; candidates are contiguous.
  fused_pass_result fuse(std::span<const float> g, std::span<float> e, std::size_t slot, std::uint32_t guess,
                         magnitude_histogram* h, bool energy) {
    const std::size_t n = g.size();
    if (threads_ > 1 && n >= threads_ * min_chunk) return fuse_threaded(g, e, slot, guess, h, energy);
    return fuse_chunk(g.data(), e.data(), n, 0, guess, idx_.data() + slot, key_.data() + slot, h, energy);
  }

  //! After a miss: collects every finite element of u (held in e) with key >= \p floor.
  std::size_t recollect(std::span<const float> u, std::size_t slot, std::uint32_t floor) noexcept {
    return collect_at_least(u, floor, idx_.data() + slot, key_.data() + slot);
  }

  //! The k-th largest key over the candidate runs (k >= 1 and at most their total), by a
  //! three-level radix select on 12, 12 and 7 key bits.
  kth_key select(std::span<const candidate_run> runs, std::uint64_t k) noexcept {
    struct level {
      unsigned shift, bits;
    };
    constexpr level levels[] = {{19, 12}, {7, 12}, {0, 7}};
    std::uint32_t prefix = 0;
    for (const level lv : levels) {
      const unsigned above = lv.shift + lv.bits;  // bits above this level's digit form the prefix
      const std::uint32_t mask = (1u << lv.bits) - 1u;
      std::fill_n(digits_.begin(), std::size_t{1} << lv.bits, 0);
      for (const auto& r : runs) {
        const std::uint32_t* kp = key_.data() + r.first;
        for (std::size_t i = 0; i < r.count; ++i)
          if ((kp[i] >> above) == prefix) ++digits_[(kp[i] >> lv.shift) & mask];
      }
      std::uint64_t cum = 0;
      std::uint32_t d = mask;
      for (;; --d) {
        if (cum + digits_[d] >= k || d == 0) break;
        cum += digits_[d];
      }
      k -= cum;
      prefix = (prefix << lv.bits) | d;
    }
    return {prefix, k};
  }

  //! Keeps, in place and in index order, the candidates of \p run that beat \p t: a larger
  //! key, or the key of t while \p ties_left lasts (lowest index first). Returns the count.
  std::size_t keep_selected(candidate_run run, std::uint32_t t, std::uint64_t& ties_left) noexcept {
    std::uint32_t* ip = idx_.data() + run.first;
    const std::uint32_t* kp = key_.data() + run.first;
    std::size_t w = 0;
    for (std::size_t i = 0; i < run.count; ++i) {
      const std::uint32_t k = kp[i];
      bool take = k > t;
      if (k == t && ties_left > 0) {
        take = true;
        --ties_left;
      }
      ip[w] = ip[i];
      w += take ? 1u : 0u;
    }
    return w;
  }

  //! Writes the sparse segment of layer \p index from the \p count selected indices at
  //! \p slot, taking each value from u (held in e) and leaving zero in the residual.
  //! Returns the energy sent.
  double write_segment_from(byte_writer& w, std::uint32_t index, std::span<float> e, std::size_t slot,
                            std::size_t count) {
    segment_header sh;
    sh.layer = index;
    sh.index_width = index_width_for(e.size());
    sh.numel = e.size();
    sh.count = count;
    double ksq = 0;
    const std::uint32_t* ip = idx_.data() + slot;
    write_segment(w, sh, [&](byte_writer& bw) {
      std::byte* id = bw.reserve(count * sizeof(std::uint32_t));
      std::byte* vd = bw.reserve(count * sizeof(float));
      for (std::size_t j = 0; j < count; ++j) {
        const std::uint32_t ix = ip[j];
        const float v = e[ix];
        e[ix] = 0.0f;
        ksq += static_cast<double>(v) * v;
        std::memcpy(id + j * sizeof(std::uint32_t), &ix, sizeof ix);
        std::memcpy(vd + j * sizeof(float), &v, sizeof v);
      }
    });
    return ksq;
  }

  //! Selected index \p j of the layer at \p slot (after keep_selected).
  [[nodiscard]] std::uint32_t index_at(std::size_t slot, std::size_t j) const noexcept { return idx_[slot + j]; }
  //! Key of candidate \p j of the layer at \p slot.
  [[nodiscard]] std::uint32_t key_at(std::size_t slot, std::size_t j) const noexcept { return key_[slot + j]; }

 private:
  // Below this many elements per thread a thread costs more than it saves.
  static constexpr std::size_t min_chunk = std::size_t{1} << 18;

  static fused_pass_result fuse_chunk(const float* g, float* e, std::size_t n, std::uint32_t base,
                                      std::uint32_t guess, std::uint32_t* idx, std::uint32_t* key,
                                      magnitude_histogram* h, bool energy) noexcept {
    const bool collect = guess != no_guess;
    if (h == nullptr)
      return collect ? fused_pass_chunk<true, false, false>(g, e, n, base, guess, idx, key, nullptr)
                     : fused_pass_chunk<false, false, false>(g, e, n, base, guess, idx, key, nullptr);
    if (energy)
      return collect ? fused_pass_chunk<true, true, true>(g, e, n, base, guess, idx, key, h)
                     : fused_pass_chunk<false, true, true>(g, e, n, base, guess, idx, key, h);
    return collect ? fused_pass_chunk<true, true, false>(g, e, n, base, guess, idx, key, h)
                   : fused_pass_chunk<false, true, false>(g, e, n, base, guess, idx, key, h);
  }

  // Splits the layer into one chunk per thread; each collects into its own part of the
  // layer's region and fills its own histogram. The parts are then moved together (in
  // index order) and the histograms merged.
  fused_pass_result fuse_threaded(std::span<const float> g, std::span<float> e, std::size_t slot,
                                  std::uint32_t guess, magnitude_histogram* h, bool energy) {
    const std::size_t n = g.size();
    const std::size_t per = (n + threads_ - 1) / threads_;
    auto work = [&](unsigned t) {
      const std::size_t a = std::min(n, t * per), b = std::min(n, a + per);
      magnitude_histogram* th = h ? &thread_hist_[t] : nullptr;
      thread_results_[t] = fuse_chunk(g.data() + a, e.data() + a, b - a, static_cast<std::uint32_t>(a), guess,
                                      idx_.data() + slot + a, key_.data() + slot + a, th, energy);
    };
    for (unsigned t = 1; t < threads_; ++t) pool_.emplace_back(work, t);
    work(0);
    pool_.clear();  // joins
    fused_pass_result r;
    std::size_t c = 0;
    for (unsigned t = 0; t < threads_; ++t) {
      const auto& tr = thread_results_[t];
      const std::size_t a = std::min(n, t * per);
      if (c != a) {
        std::memmove(idx_.data() + slot + c, idx_.data() + slot + a, tr.collected * sizeof(std::uint32_t));
        std::memmove(key_.data() + slot + c, key_.data() + slot + a, tr.collected * sizeof(std::uint32_t));
      }
      c += tr.collected;
      r.grad_sq += tr.grad_sq;
      r.input_sq += tr.input_sq;
      r.non_finite = r.non_finite || tr.non_finite;
      if (h) {
        h->merge(thread_hist_[t]);
        thread_hist_[t].clear();
      }
    }
    r.collected = c;
    return r;
  }

  std::vector<std::uint32_t> idx_;
  std::vector<std::uint32_t> key_;
  std::vector<std::uint64_t> digits_;
  unsigned threads_ = 1;
  std::vector<magnitude_histogram> thread_hist_;
  std::vector<fused_pass_result> thread_results_;
  std::vector<std::jthread> pool_;
};

//! The next step's guess: the threshold key lowered by a margin of \p margin in magnitude
//! (magnitudes drift slowly from step to step, so the next top-k is almost surely above it).
[[nodiscard]] inline std::uint32_t widened_guess(std::uint32_t threshold_key, float margin) noexcept {
  return magnitude_key(key_magnitude(threshold_key) * margin);
}

}  // namespace gravac::detail
