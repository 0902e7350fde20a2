#pragma once
//! \file
//! \brief Elapsed seconds on the steady clock, for the step's timings.

#include <chrono>

namespace gravac::detail {

//! Seconds elapsed since \p t0 on the steady clock.
inline double seconds_since(std::chrono::steady_clock::time_point t0) noexcept {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace gravac::detail
