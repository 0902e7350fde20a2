#pragma once
//! \file
//! \brief detail::ar_topk_host_passes: the passes over host memory of allreduce_compatible's
//! one aggregate body (u = g + e with its statistics, the index list, its validation, the
//! gather at the indices, the Allreduce buffer, the scatter and average, the undo). The
//! device twin is detail::ar_topk_device_passes (cuda/detail/ar_topk_device_passes.hpp);
//! detail::space_ops names the one of each memory space.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "gravac/collective/control/step_control.hpp"
#include "gravac/compress/detail/fused_pass.hpp"
#include "gravac/concepts/concepts.hpp"
#include "gravac/core/detail/square_sum.hpp"
#include "gravac/core/error.hpp"
#include "gravac/core/layout.hpp"
#include "gravac/core/memory.hpp"
#include "gravac/stats/gain_curve.hpp"
#include "gravac/stats/magnitude_histogram.hpp"

namespace gravac::detail {

//! AR-Topk's passes over host memory; the collective owns one and calls them in order.
class ar_topk_host_passes {
 public:
  //! Nothing to size: the vectors grow on first use and keep their memory.
  template <class C>
  void prepare(const C&, const layout&) {}
  //! Indices are 8 bytes when \p wide (a layer of 2^32 elements or more), else 4.
  void configure(bool wide) noexcept { wide_ = wide; }

  //! u = g + e in place of e, the per-layer grad_sq and input_sq (and the gain curve from
  //! a magnitude histogram when p.gain_candidates is non-empty) into \p st, which the caller
  //! reset. Returns this rank's ||g||^2 (\p norm_needed is the device passes' hint: the
  //! host computes it either way).
  double accumulate(const layout& lay, grad_view<host_space> gv, grad_view<host_space> ev, const step_params& p,
                    compress_stats& st, bool norm_needed = true) {
    (void)norm_needed;
    auto g = gv.span();
    auto e = ev.span();
    double local_sq = 0;
    const bool want_gain = !p.gain_candidates.empty();
    for (std::size_t i = 0; i < lay.size(); ++i) {
      const auto& l = lay[i];
      // The fused pass without a guess: u = g + e, the norms in the sums' tree
      // (core/detail/square_sum.hpp), and every |u| into the histogram when a gain curve
      // is wanted.
      const histogram_sampling hs = want_gain ? histogram_sampling{&hist_, 1, 0} : histogram_sampling{};
      const fused_pass_result r = fused_pass<fused_lanes>(g.data() + l.offset, e.data() + l.offset, l.numel, 0,
                                                          no_guess, nullptr, nullptr, hs, no_guess);
      if (want_gain) {
        add_gain_curve(hist_, l.numel, p.gain_candidates, st.candidate_kept_sq);
        hist_.clear();
      }
      st.layers[i].grad_sq = r.grad_sq;
      st.layers[i].input_sq = r.input_sq;
      local_sq += r.grad_sq;
    }
    return local_sq;
  }

  //! Room for \p n indices.
  void reserve_indices(std::size_t n) {
    if (wide_)
      idx64_.resize(std::max(idx64_.size(), n));
    else
      idx32_.resize(std::max(idx32_.size(), n));
  }

  //! The hook's indices of layer \p l (index \p i) of u (held in \p e), written from entry
  //! \p at on; returns how many it selected.
  template <class Hook, class C>
  std::size_t select_layer(const C& c, grad_view<host_space> e, const layer& l, std::size_t i, const step_params& p,
                           std::size_t at) {
    Hook::select(c, std::span<const float>(e.span().subspan(l.offset, l.numel)), i, p, selected_, order_);
    reserve_indices(at + selected_.size());
    for (auto ix : selected_) {
      if (wide_)
        idx64_[at++] = ix;
      else
        idx32_[at++] = static_cast<std::uint32_t>(ix);
    }
    return selected_.size();
  }
  //! Every selection is complete when select_layer returns.
  template <class Hook, class C>
  void finish_selection(const C&) const noexcept {}

  //! The first \p n indices as the bytes the broadcast carries.
  std::span<std::byte> index_bytes(std::size_t n) {
    return wide_ ? std::as_writable_bytes(std::span<std::uint64_t>(idx64_.data(), n))
                 : std::as_writable_bytes(std::span<std::uint32_t>(idx32_.data(), n));
  }

  //! The first layer whose index list (entries offsets[i] .. offsets[i + 1]) is out of
  //! range or not strictly increasing; lay.size() when every list is valid.
  [[nodiscard]] std::size_t first_invalid_layer(const layout& lay, const std::vector<std::size_t>& offsets) const {
    for (std::size_t i = 0; i < lay.size(); ++i) {
      const auto& l = lay[i];
      for (std::size_t s = offsets[i]; s < offsets[i + 1]; ++s) {
        const std::size_t ix = index_at(s);
        if (ix >= l.numel || (s > offsets[i] && ix <= index_at(s - 1))) return i;
      }
    }
    return lay.size();
  }

  //! The \p total values sent: u at the indices (dense layers whole), in layer order; e = 0
  //! where sent; each layer's kept count and kept_sq into \p st.
  void gather(const layout& lay, const std::vector<std::size_t>& offsets, const std::vector<bool>& dense,
              grad_view<host_space> ev, std::size_t total, compress_stats& st) {
    auto e = ev.span();
    values_.resize(total);
    std::size_t v = 0;
    for (std::size_t i = 0; i < lay.size(); ++i) {
      const auto& l = lay[i];
      auto& ls = st.layers[i];
      const std::size_t v0 = v;
      if (dense[i]) {
        for (std::size_t j = l.offset; j < l.offset + l.numel; ++j) {
          values_[v++] = e[j];
          e[j] = 0.0f;
        }
      } else {
        for (std::size_t s = offsets[i]; s < offsets[i + 1]; ++s) {
          const std::size_t j = l.offset + index_at(s);
          values_[v++] = e[j];
          e[j] = 0.0f;
        }
      }
      ls.kept = v - v0;
      ls.kept_sq = square_sum(std::span<const float>(values_.data() + v0, v - v0));  // in the order sent
    }
  }

  //! The Allreduce buffer: the \p total values, then \p ctl's local values; the values
  //! are kept for undo().
  std::span<float> reduce_buffer(std::size_t total, step_control& ctl) {
    own_values_.assign(values_.begin(), values_.begin() + static_cast<std::ptrdiff_t>(total));
    values_.resize(total + ctl.size());
    ctl.write_local(std::span<float>(values_.data() + total, ctl.size()));
    return {values_.data(), values_.size()};
  }
  //! \p ctl's sums from the tail of the reduced buffer.
  void read_control(std::size_t total, step_control& ctl) const {
    ctl.set_summed(std::span<const float>(values_.data() + total, ctl.size()));
  }

  //! g = the summed values times \p inv at the indices (dense layers whole), zero elsewhere.
  void scatter_average(const layout& lay, const std::vector<std::size_t>& offsets, const std::vector<bool>& dense,
                       grad_view<host_space> gv, float inv) const {
    auto g = gv.span();
    std::fill(g.begin(), g.end(), 0.0f);
    std::size_t v = 0;
    for (std::size_t i = 0; i < lay.size(); ++i) {
      const auto& l = lay[i];
      if (dense[i]) {
        for (std::size_t j = l.offset; j < l.offset + l.numel; ++j) g[j] = values_[v++] * inv;
      } else {
        for (std::size_t s = offsets[i]; s < offsets[i + 1]; ++s) g[l.offset + index_at(s)] = values_[v++] * inv;
      }
    }
  }

  //! e = the values this rank sent in the last step, where it sent them (e is zero there),
  //! so e holds all of u again.
  void undo(const layout& lay, const std::vector<std::size_t>& offsets, const std::vector<bool>& dense,
            grad_view<host_space> ev) const {
    auto e = ev.span();
    std::size_t v = 0;
    for (std::size_t i = 0; i < lay.size() && v < own_values_.size(); ++i) {
      const auto& l = lay[i];
      if (dense[i]) {
        for (std::size_t j = l.offset; j < l.offset + l.numel; ++j) e[j] = own_values_[v++];
      } else {
        for (std::size_t s = offsets[i]; s < offsets[i + 1]; ++s) e[l.offset + index_at(s)] = own_values_[v++];
      }
    }
  }

 private:
  [[nodiscard]] std::size_t index_at(std::size_t s) const noexcept { return wide_ ? idx64_[s] : idx32_[s]; }

  bool wide_ = false;
  magnitude_histogram hist_;
  std::vector<std::uint64_t> selected_;
  std::vector<std::uint64_t> order_;
  std::vector<std::uint32_t> idx32_;
  std::vector<std::uint64_t> idx64_;
  std::vector<float> values_;
  std::vector<float> own_values_;
};

}  // namespace gravac::detail
