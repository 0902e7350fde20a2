#pragma once
//! \file time_source.hpp
//! \brief Where a policy's notion of "how long a step took" comes from: the steady clock,
//! or the clock of a network model (so that throughput can be real or simulated).

#include <cmath>
#include <cstdint>
#include <string>
#include <string_view>

#include "gravac/core/error.hpp"
#include "gravac/core/step.hpp"

namespace gravac {

//! How the duration of a step is obtained from its step_report.
enum class time_source : std::uint8_t {
  //! Steady clock: the caller's compute (step_report::iteration_s) plus the measured
  //! compress, communicate and decompress times.
  measured,
  //! Measured compute, compress and decompress, with the measured communication replaced
  //! by the time the network model charged and backward did not hide
  //! (step_report::modeled_exposed_s: all of it in a synchronous step).
  modeled,
  //! A fixed compute time per step (time_options::compute_s), this rank's measured
  //! compression and decompression time, and the exposed modeled communication: how a simulated
  //! experiment charges a step. With time_options::include_codec false nothing is
  //! measured, and the clock is deterministic when the network model is (tests).
  simulated,
};

//! Short name of a time source.
constexpr std::string_view to_string(time_source s) noexcept {
  switch (s) {
    case time_source::measured:
      return "measured";
    case time_source::modeled:
      return "modeled";
    case time_source::simulated:
      return "simulated";
  }
  return "unknown";
}

//! Options of a policy's clock.
struct time_options {
  time_source source = time_source::measured;  //!< which clock
  double compute_s = 0;       //!< seconds of compute charged per step (time_source::simulated only), >= 0
  bool include_codec = true;  //!< simulated: charge the measured compress and decompress times too

  //! Throws gravac::error when an option is out of its domain; \p who names the owner.
  void validate(std::string_view who) const {
    require(source == time_source::measured || source == time_source::modeled || source == time_source::simulated,
            std::string(who) + ": unknown time source");
    require(std::isfinite(compute_s) && compute_s >= 0,
            std::string(who) + ": time.compute_s must be finite and >= 0, got " + std::to_string(compute_s));
  }
};

//! Seconds that step \p r took on this rank according to clock \p t. Measured parts differ
//! between ranks: a policy that decides on them agrees on their sums first (the trainer's
//! agreement_request / agreed hooks), once per decision.
inline double step_seconds(const step_report& r, const time_options& t) noexcept {
  switch (t.source) {
    case time_source::measured:
      return r.iteration_s + r.compress_s + r.communicate_s + r.decompress_s;
    case time_source::modeled:
      return r.iteration_s + r.compress_s + r.modeled_exposed_s + r.decompress_s;
    case time_source::simulated:
      return t.compute_s + r.modeled_exposed_s + (t.include_codec ? r.compress_s + r.decompress_s : 0.0);
  }
  return 0.0;
}

//! Of step_seconds(r, t), the communication: the measured collective time on the steady
//! clock, the exposed time the network model charged on the others.
inline double communication_seconds(const step_report& r, const time_options& t) noexcept {
  return t.source == time_source::measured ? r.communicate_s : r.modeled_exposed_s;
}

}  // namespace gravac
