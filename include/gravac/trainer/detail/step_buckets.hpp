#pragma once
//! \file
//! \brief detail::step_buckets<C, K>: the trainer's buckets. Each owns a compressor and a
//! collective over its own layers, its slice of the step's parameters (and of the
//! compressor's step settings) and what it reports; together they merge into the step's
//! statistics and report, and give back what they sent when a step is abandoned.

#include <algorithm>
#include <cstddef>
#include <memory>
#include <vector>

#include "gravac/collective/collective_for.hpp"
#include "gravac/collective/step_buffers.hpp"
#include "gravac/core/bucket_plan.hpp"
#include "gravac/core/layout.hpp"
#include "gravac/core/step.hpp"
#include "gravac/trainer/detail/async_schedule.hpp"
#include "gravac/trainer/detail/step_settings_of.hpp"

namespace gravac::detail {

//! One bucket: its compressor and collective, the parameters they see, what they report.
template <class C, class K>
struct bucket_state {
  //! The parts over layout \p lay with the trainer's options \p opt.
  template <class Options>
  bucket_state(const layout& lay, const Options& opt)
      : compressor(lay, opt.compressor), collective(lay, opt.collective) {}
  C compressor;                                         //!< over the bucket's layers
  K collective;                                         //!< over the bucket's layers
  step_params params;                                   //!< the step's decisions for its layers
  [[no_unique_address]] step_settings_for<C> settings;  //!< its compressor's step settings (its layers)
  compress_stats stats;                                 //!< what its compressor reported
  step_report report;                                   //!< what its collective reported
  step_buffers<typename C::memory_space> buffers{};     //!< the views its collective ran on
  double modeled_s = 0;                                 //!< seconds the network model charged
};

//! The buckets of a bucket_plan (stable addresses: the trainer moves, its buckets do not).
template <class C, class K>
class step_buckets {
 public:
  //! One bucket per entry of \p plan, each collective prepared for its compressor.
  template <class Options>
  step_buckets(const bucket_plan& plan, const Options& opt) {
    for (std::size_t b = 0; b < plan.size(); ++b) {
      all_.push_back(std::make_unique<bucket_state<C, K>>(plan[b].layers, opt));
      all_.back()->collective.prepare(all_.back()->compressor);
    }
  }

  //! Number of buckets.
  [[nodiscard]] std::size_t size() const noexcept { return all_.size(); }
  //! Bucket \p b.
  [[nodiscard]] bucket_state<C, K>& operator[](std::size_t b) { return *all_[b]; }
  //! Bucket \p b.
  [[nodiscard]] const bucket_state<C, K>& operator[](std::size_t b) const { return *all_[b]; }
  //! Bucket \p b, checked.
  [[nodiscard]] bucket_state<C, K>& at(std::size_t b) { return *all_.at(b); }
  //! Bucket \p b, checked.
  [[nodiscard]] const bucket_state<C, K>& at(std::size_t b) const { return *all_.at(b); }

  //! Each bucket's view of the step's parameters \p all: the per-layer decisions of its
  //! layers (a layout of \p layers layers).
  void slice(const step_params& all, const bucket_plan& plan, std::size_t layers) {
    for (std::size_t b = 0; b < all_.size(); ++b) {
      step_params& q = all_[b]->params;
      q = all;  // reuses q's memory after the first step
      if (all_.size() == 1) continue;
      const auto first = static_cast<std::ptrdiff_t>(plan[b].first_layer);
      const auto last = static_cast<std::ptrdiff_t>(plan[b].last_layer);
      const auto part = [&](const auto& whole, auto& mine) {
        if (whole.size() == layers) mine.assign(whole.begin() + first, whole.begin() + last);
      };
      part(all.kept_fraction, q.kept_fraction);
    }
  }

  //! Gives each bucket's compressor its part of the step settings \p all (for a layout of
  //! \p layers layers): the whole with one bucket, else its layers' slice.
  template <class S>
  void give_settings(const S& all, const bucket_plan& plan, std::size_t layers) {
    for (std::size_t b = 0; b < all_.size(); ++b) {
      bucket_state<C, K>& s = *all_[b];
      if (all_.size() == 1) {
        s.compressor.set_step_settings(all);
        continue;
      }
      slice_step_settings(all, plan[b].first_layer, plan[b].last_layer, layers, s.settings);
      s.compressor.set_step_settings(s.settings);
    }
  }

  //! The step's statistics from the first \p count buckets' (all by default): per-layer
  //! statistics in layout order, gain-curve energies summed in bucket order.
  void merge_stats(const bucket_plan& plan, std::size_t layers, compress_stats& out,
                   std::size_t count = static_cast<std::size_t>(-1)) const {
    count = std::min(count, all_.size());
    out.reset(layers, 0);
    for (std::size_t b = 0; b < count; ++b) out.add_bucket(all_[b]->stats, plan[b].first_layer);
  }

  //! The step's report from the buckets': bytes and times summed, the collective of the
  //! largest bucket, and the modeled timeline (each bucket starts when its layers are
  //! ready and the one before it is done).
  void merge_report(const bucket_plan& plan, const async_schedule& schedule, step_report& r) const {
    r.compress_s = r.communicate_s = r.decompress_s = 0;
    r.bytes_sent = 0;
    r.wire_bytes_sent = r.wire_bytes_received = 0;
    std::size_t largest = 0;
    double timeline = 0;
    for (std::size_t b = 0; b < all_.size(); ++b) {
      const bucket_state<C, K>& s = *all_[b];
      r.compress_s += s.report.compress_s;
      r.communicate_s += s.report.communicate_s;
      r.decompress_s += s.report.decompress_s;
      r.bytes_sent += s.report.bytes_sent;
      r.wire_bytes_sent += s.report.wire_bytes_sent;
      r.wire_bytes_received += s.report.wire_bytes_received;
      r.modeled_communicate_s += s.modeled_s;
      timeline = std::max(timeline, schedule.ready_s(b)) + s.modeled_s;
      if (plan[b].numel > plan[largest].numel) largest = b;
    }
    r.collective = all_[largest]->report.collective;
    r.modeled_exposed_s = std::max(0.0, timeline - schedule.backward_end_s());
    r.buckets = all_.size();
  }

  //! The first \p count buckets give what they sent back to their residuals (collectives
  //! with return_sent; the others had nothing to give back).
  void return_sent(std::size_t count) {
    if constexpr (ReturnsSent<K, C>) {
      for (std::size_t b = 0; b < count; ++b) all_[b]->collective.return_sent(all_[b]->compressor, all_[b]->buffers);
    } else {
      (void)count;
    }
  }

 private:
  std::vector<std::unique_ptr<bucket_state<C, K>>> all_;
};

}  // namespace gravac::detail
