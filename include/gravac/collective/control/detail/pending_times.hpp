#pragma once
//! \file
//! \brief detail::pending_times: the trainer's state between steps that a checkpoint
//! saves: this rank's times of the last step, which ride in the next step's collective for
//! a policy that needs statistics, so that a resumed run sends and decides what an
//! uninterrupted one does.

#include <cmath>
#include <cstddef>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "gravac/core/error.hpp"
#include "gravac/core/step.hpp"

namespace gravac::detail {

//! This rank's times of the last step, not yet sent.
struct pending_times {
  step_times times{};  //!< the last step's times
  bool has = false;    //!< a step ran since the start (or the restore) and its times wait

  //! Appends the state to \p out: five doubles (has, then the four times).
  void save(std::vector<std::byte>& out) const {
    const double v[5] = {has ? 1.0 : 0.0, times.compress_s, times.communicate_s, times.decompress_s, times.iteration_s};
    // Grown, then copied into: GCC 12 at -O2 misread insert(end, first, last) of this
    // 40-byte range (a false -Wstringop-overflow in the relocation of the old elements).
    const std::size_t at = out.size();
    out.resize(at + sizeof v);
    std::memcpy(out.data() + at, v, sizeof v);
  }
  //! Restores what save() wrote; an empty \p in (a checkpoint without it) means no times
  //! are pending. Throws gravac::error for any other length or a non-finite time.
  void load(std::span<const std::byte> in) {
    if (in.empty()) {
      has = false;
      return;
    }
    double v[5];
    require(in.size() == sizeof v, "trainer::load_step_state: the step state has " + std::to_string(in.size()) +
                                       " bytes, not " + std::to_string(sizeof v));
    std::memcpy(v, in.data(), sizeof v);
    for (double x : v) require(std::isfinite(x), "trainer::load_step_state: a time is not finite");
    has = v[0] != 0.0;
    times = {v[1], v[2], v[3], v[4]};
  }
};

}  // namespace gravac::detail
