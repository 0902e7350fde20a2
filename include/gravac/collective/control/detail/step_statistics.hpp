#pragma once
//! \file
//! \brief detail::step_statistics: the trainer's side of the control plane. It lays out the
//! slots of a step's control values (the non-finite flag, the statistics a policy needs,
//! the previous step's times, the values a policy asked to agree on), hands the statistics
//! down to the step's last collective and reads the rank averages back into the report.
//! The statistics have one slot layout (statistics_slots.hpp), whether they ride as floats
//! in the host collective's trailer or as doubles in the device step's Allreduce of their own.

#include <cmath>
#include <cstddef>
#include <span>
#include <utility>
#include <vector>

#include "gravac/collective/control/detail/pending_times.hpp"
#include "gravac/collective/control/detail/statistics_slots.hpp"
#include "gravac/collective/control/step_control.hpp"
#include "gravac/comm/communicator_ref.hpp"
#include "gravac/core/layout.hpp"
#include "gravac/core/step.hpp"

namespace gravac::detail {

//! The control plane of one trainer: slots, this rank's values, the averages.
class step_statistics {
 public:
  static constexpr std::size_t no_slot = step_control::no_slot;

  //! This rank's statistics \p st (over \p lay, with gain candidates \p candidates) in
  //! report \p r; their rank averages replace them where a policy needs them (average()).
  static void local(const compress_stats& st, const layout& lay, std::span<const double> candidates, step_report& r) {
    r.dense_bytes = lay.numel() * sizeof(float);
    for (std::size_t i = 0; i < lay.size(); ++i) {
      const auto n = lay[i].numel;
      r.kept_fraction[i] = n ? static_cast<double>(st.layers[i].kept) / static_cast<double>(n) : 0.0;
      r.layer_grad_norm[i] = std::sqrt(st.layers[i].grad_sq);
    }
    const double in = st.input_sq();
    r.gain = gain_from_sq(st.kept_sq(), in);
    r.gain_candidates.assign(candidates.begin(), candidates.end());
    r.gain_curve.resize(candidates.size());
    for (std::size_t c = 0; c < r.gain_curve.size(); ++c)
      r.gain_curve[c] = c < st.candidate_kept_sq.size() ? gain_from_sq(st.candidate_kept_sq[c], in) : 1.0;
    r.statistics_synchronized = false;
  }

  //! Lays out the step's slots (host memory: they ride in the step's collective). \p flag:
  //! the non-finite flag (failing ranks, sum of their rank + 1); \p statistics: a policy
  //! needs them (over \p layers layers and \p candidates gain candidates); \p agree: the
  //! values a policy asked to agree on.
  void prepare(bool flag, bool statistics, std::size_t layers, std::size_t candidates, std::span<const double> agree) {
    control_.clear();
    flag_slot_ = stats_slot_ = agree_slot_ = no_slot;
    agree_count_ = 0;
    slots_ = {layers, candidates, pending_.has};
    if (flag) flag_slot_ = control_.reserve(2);
    if (statistics) stats_slot_ = control_.reserve(slots_.size());
    if (!agree.empty()) {
      agree_slot_ = control_.reserve(agree.size());
      agree_count_ = agree.size();
      for (std::size_t i = 0; i < agree.size(); ++i) control_.local(agree_slot_ + i) = static_cast<float>(agree[i]);
    }
  }
  //! No slots this step (device memory: the collectives carry no control values).
  void prepare_none() {
    control_.clear();
    flag_slot_ = stats_slot_ = agree_slot_ = no_slot;
    agree_count_ = 0;
    slots_ = {};
  }

  //! The slots the step's collective carries.
  [[nodiscard]] step_control& control() noexcept { return control_; }
  //! Whether the statistics ride in this step's collective.
  [[nodiscard]] bool carries_statistics() const noexcept { return stats_slot_ != no_slot; }
  //! Whether the non-finite flag rides in this step's collective.
  [[nodiscard]] bool carries_flag() const noexcept { return flag_slot_ != no_slot; }

  //! Raises this rank's non-finite flag.
  void flag_non_finite(int rank) {
    control_.local(flag_slot_) = 1.0f;
    control_.local(flag_slot_ + 1) = static_cast<float>(rank + 1);
  }
  //! After the collective: the failing ranks' count and the sum of their rank + 1 (0, 0: none).
  [[nodiscard]] std::pair<double, double> flagged() const {
    if (!carries_flag() || !control_.has_sums()) return {0.0, 0.0};
    return {control_.sum(flag_slot_), control_.sum(flag_slot_ + 1)};
  }

  //! Hands the statistics down with the step to its last collective, whose first layer in
  //! \p lay is \p first_layer (call only when they ride): returns where the trainer merges
  //! every earlier bucket's statistics; the collective's seal() adds its own and writes them.
  compress_stats& hand_down(const layout& lay, std::size_t first_layer) {
    statistics_seal& s = control_.seal_;
    s.slot = stats_slot_;
    s.slots = slots_;
    s.lay = &lay;
    s.first_layer = first_layer;
    s.previous = pending_.times;
    return s.merged;
  }

  //! The rank averages of the statistics into \p r: from the slots the collective summed,
  //! or, where none rode (device memory), by one allreduce of their own over \p comm. Then
  //! this step's times become the pending ones the next step sends.
  template <class Space>
  void average(const compress_stats& st, const layout& lay, communicator_ref<Space>& comm, step_report& r) {
    if (carries_statistics() && control_.has_sums()) {
      slots_.unpack([&](std::size_t i) { return static_cast<double>(control_.sum(stats_slot_ + i)); }, comm.size(), r);
    } else if constexpr (!Space::host_accessible) {
      slots_ = {lay.size(), r.gain_curve.size(), pending_.has};
      sync_.resize(slots_.size());
      slots_.pack(st, lay, pending_.times, [&](std::size_t i, double v) { sync_[i] = v; });
      comm.allreduce_sum(std::span<double>(sync_));
      slots_.unpack([&](std::size_t i) { return sync_[i]; }, comm.size(), r);
    }
    pending_.times = {r.compress_s, r.communicate_s, r.decompress_s, r.iteration_s};
    pending_.has = true;
  }

  //! The sums of the values the policy asked to agree on: from their slots (host), or by
  //! one allreduce of \p request over \p comm (device). Empty when none were asked for.
  template <class Space>
  std::span<const double> agreed(std::span<const double> request, communicator_ref<Space>& comm) {
    if constexpr (Space::host_accessible) {
      if (agree_slot_ == no_slot || !control_.has_sums()) return {};
      agreed_.resize(agree_count_);
      for (std::size_t i = 0; i < agree_count_; ++i) agreed_[i] = control_.sum(agree_slot_ + i);
    } else {
      if (request.empty()) return {};
      agreed_.assign(request.begin(), request.end());
      comm.allreduce_sum(std::span<double>(agreed_));
    }
    return agreed_;
  }

  //! This rank's times of the last step, sent with the next (checkpoint state).
  [[nodiscard]] pending_times& pending() noexcept { return pending_; }
  //! This rank's times of the last step.
  [[nodiscard]] const pending_times& pending() const noexcept { return pending_; }

 private:
  step_control control_;
  statistics_slots slots_;
  std::size_t flag_slot_ = no_slot, stats_slot_ = no_slot, agree_slot_ = no_slot, agree_count_ = 0;
  pending_times pending_;
  std::vector<double> sync_;
  std::vector<double> agreed_;
};

}  // namespace gravac::detail
