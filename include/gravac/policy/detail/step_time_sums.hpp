#pragma once
//! \file step_time_sums.hpp
//! \brief What a policy measures of one choice over a few steps (seconds, communication
//! seconds, gain), and the rates it compares choices by. A step's time may arrive one step
//! after the step (a clock with measured parts), so a measurement counts the steps it
//! expects and the steps accounted for, and is complete when they are equal.

#include <algorithm>
#include <cstdint>

#include "gravac/policy/detail/persistent_fields.hpp"
#include "gravac/policy/detail/policy_state.hpp"

namespace gravac::detail {

//! Sums of the steps one choice was measured on.
struct step_time_sums {
  std::uint64_t expected = 0;   //!< steps whose time belongs here
  std::uint64_t accounted = 0;  //!< of them, those whose time came (timed or dropped)
  std::uint64_t timed = 0;      //!< of them, those with a time
  double seconds = 0;           //!< their seconds
  double comm_seconds = 0;      //!< of which communication
  double gain_sum = 0;          //!< their gains (1 for a dense step)

  //! One more step whose time will come.
  void expect() noexcept { ++expected; }
  //! A step's time: \p s seconds of which \p comm communication, sent at gain \p gain.
  void add(double s, double comm, double gain) noexcept {
    ++accounted;
    ++timed;
    seconds += s;
    comm_seconds += comm;
    gain_sum += gain;
  }
  //! A step whose time will never come (the ranks did not agree on it).
  void drop() noexcept { ++accounted; }
  //! Every expected step has been accounted for, and at least one has a time.
  [[nodiscard]] bool complete() const noexcept { return accounted >= expected && timed > 0; }
  //! Mean seconds per step (0 without a timed step).
  [[nodiscard]] double mean_s() const noexcept { return timed ? seconds / static_cast<double>(timed) : 0.0; }
  //! Mean communication seconds per step.
  [[nodiscard]] double mean_comm_s() const noexcept { return timed ? comm_seconds / static_cast<double>(timed) : 0.0; }
  //! Mean gain per step.
  [[nodiscard]] double mean_gain() const noexcept { return timed ? gain_sum / static_cast<double>(timed) : 0.0; }

  //! Refuses sums whose counts are out of order (corrupt bytes); runs after a load.
  void check_loaded(const state_reader& r) const {
    if (accounted > expected || timed > accounted) r.fail("step time sums out of order");
  }
  //! What a checkpoint holds, in this order.
  using persistent_fields = field_list<field<&step_time_sums::expected>, field<&step_time_sums::accounted>,
                                       field<&step_time_sums::timed>, field<&step_time_sums::seconds>,
                                       field<&step_time_sums::comm_seconds>, field<&step_time_sums::gain_sum>>;
};

//! Progress per second of a choice, per sample of the batch: its gain over its seconds per
//! step (GraVAC's CT without the batch size, which is the same for every choice). 0 for a
//! step time that is not positive.
[[nodiscard]] inline double progress_rate(double gain, double seconds_per_step) noexcept {
  return seconds_per_step > 0 ? gain / seconds_per_step : 0.0;
}

//! True when dense (gain 1) makes progress at least as fast as a compressed choice would even
//! with free communication. No more aggressive ratio can win then either: a ratio's gain only
//! falls as it grows, and its codec time hardly changes (the selection reads all of u).
[[nodiscard]] inline bool dense_dominates(const step_time_sums& dense, double c_seconds, double c_comm_seconds,
                                          double c_gain) noexcept {
  const double without_comm = std::max(c_seconds - c_comm_seconds, 1e-12);
  return progress_rate(1.0, dense.mean_s()) >= progress_rate(c_gain, without_comm);
}

}  // namespace gravac::detail
