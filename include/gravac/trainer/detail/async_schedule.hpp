#pragma once
//! \file
//! \brief detail::async_schedule: the asynchronous step's bookkeeping. Which layers
//! backward has produced, which buckets are complete and may start (in order from bucket
//! 0), when each bucket's last layer was ready and when backward ended, on the wall clock
//! or on the timeline the caller gave.

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <string>
#include <vector>

#include "gravac/core/bucket_plan.hpp"
#include "gravac/core/error.hpp"
#include "gravac/core/layout.hpp"

namespace gravac::detail {

//! The ready layers and releasable buckets of the step in flight.
class async_schedule {
 public:
  //! Starts a step over \p plan: no layer ready, no bucket released.
  void begin(const bucket_plan& plan, std::size_t layers) {
    layer_ready_.assign(layers, false);
    pending_.resize(plan.size());
    ready_s_.assign(plan.size(), 0.0);
    for (std::size_t b = 0; b < plan.size(); ++b) pending_[b] = plan[b].last_layer - plan[b].first_layer;
    released_ = 0;
    backward_end_s_ = 0;
    given_times_ = false;
    began_ = std::chrono::steady_clock::now();
  }

  //! Restarts the wall clock of ready() (when the step's thread and events are ready).
  void start_clock() noexcept { began_ = std::chrono::steady_clock::now(); }
  //! Backward ended at \p s seconds (finish()).
  void end_backward(double s) noexcept { backward_end_s_ = std::max(backward_end_s_, s); }

  //! Refuses (changing nothing) a ready() for a layer outside \p lay or already ready.
  void check_ready(const layout& lay, std::size_t layer) const {
    require(layer < lay.size(), "trainer::ready: layer " + std::to_string(layer) + " is outside the layout (" +
                                    std::to_string(lay.size()) + " layers)");
    require(!layer_ready_[layer], "trainer::ready: layer '" + lay[layer].name + "' was already marked ready this step");
  }

  //! Marks layer \p i of bucket \p b ready at \p ready_s seconds since the step began
  //! (\p given: a time the caller gave, not the wall clock); returns how many buckets,
  //! from bucket 0, may start.
  std::size_t mark_ready(std::size_t i, std::size_t b, double ready_s, bool given = false) {
    given_times_ = given_times_ || given;
    layer_ready_[i] = true;
    if (--pending_[b] == 0) ready_s_[b] = ready_s;
    backward_end_s_ = std::max(backward_end_s_, ready_s);
    while (released_ < pending_.size() && pending_[released_] == 0) ++released_;
    return released_;
  }

  //! Whether layer \p i is ready.
  [[nodiscard]] bool is_ready(std::size_t i) const { return layer_ready_[i]; }
  //! When backward ended: the last ready time the caller gave, or the wall time since begin().
  [[nodiscard]] double backward_end_now() const {
    return given_times_ ? backward_end_s_
                        : std::chrono::duration<double>(std::chrono::steady_clock::now() - began_).count();
  }
  //! Seconds on the wall clock since begin().
  [[nodiscard]] double since_begin() const {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - began_).count();
  }
  //! The last ready time: when backward ended.
  [[nodiscard]] double backward_end_s() const noexcept { return backward_end_s_; }
  //! When bucket \p b's last layer was ready (0 in the synchronous step).
  [[nodiscard]] double ready_s(std::size_t b) const { return b < ready_s_.size() ? ready_s_[b] : 0.0; }

 private:
  std::vector<bool> layer_ready_;
  std::vector<std::size_t> pending_;  // layers of each bucket not yet ready
  std::vector<double> ready_s_;       // when each bucket's last layer was ready
  std::size_t released_ = 0;
  double backward_end_s_ = 0;
  bool given_times_ = false;  // the caller gave ready times (a modeled timeline), not the wall clock
  std::chrono::steady_clock::time_point began_{};
};

}  // namespace gravac::detail
