#pragma once
//! \file step_control.hpp
//! \brief The control plane of a step: small values (the non-finite flag, gains, norms,
//! kept counts, a policy's values to agree on, a collective's own bookkeeping) that ride
//! in the step's own gradient collective instead of in collectives of their own.
//!
//! Every collective pays the network latency, however small its message: three tiny
//! allreduces per step cost three latencies, which at 32 ms is more than a compressed
//! gradient saves. So the trainer and the collective reserve slots in a step_control
//! before the step, each rank writes its local values, and the collective carries them:
//! appended to the Allreduce buffer (summed by the reduction itself) or appended as a
//! trailer to every rank's packet of an Allgather (summed on arrival, in rank order, so
//! every rank gets the same bits). After the collective every slot holds its sum over
//! the ranks. The layout of the slots is decided from state every rank shares, so every
//! rank's trailer has the same length.
//!
//! Data flows one way: what the trainer knows travels down in the step_control (the
//! statistics of every earlier bucket among them), the collective completes it with what
//! only it knows (seal(): its own compression's statistics) and the sums come back up in
//! it. Nothing here calls the trainer.

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <span>
#include <vector>

#include "gravac/collective/control/detail/statistics_slots.hpp"
#include "gravac/core/error.hpp"
#include "gravac/core/step.hpp"

namespace gravac {

namespace detail {
class step_statistics;
}  // namespace detail

//! Slots of float values summed over the ranks by a step's own collective.
class step_control {
 public:
  //! An index that names no slot (a slot not reserved this step).
  static constexpr std::size_t no_slot = detail::statistics_seal::no_slot;

  //! Forgets every slot (start of a step); keeps the memory.
  void clear() noexcept {
    local_.clear();
    summed_.clear();
    seal_.slot = no_slot;
    sealed_ = false;
  }
  //! Reserves \p n slots (initialised to 0) and returns the index of the first.
  std::size_t reserve(std::size_t n) {
    const std::size_t at = local_.size();
    local_.resize(at + n, 0.0f);
    return at;
  }
  //! Number of slots.
  [[nodiscard]] std::size_t size() const noexcept { return local_.size(); }
  //! True when nothing rides along.
  [[nodiscard]] bool empty() const noexcept { return local_.empty(); }
  //! Bytes of the trailer an Allgather appends to each packet.
  [[nodiscard]] std::size_t trailer_bytes() const noexcept { return local_.size() * sizeof(float); }

  //! This rank's values, written before the collective.
  [[nodiscard]] std::span<float> local() noexcept { return local_; }
  //! This rank's values.
  [[nodiscard]] std::span<const float> local() const noexcept { return local_; }
  //! Slot \p i of this rank.
  float& local(std::size_t i) { return local_.at(i); }

  //! Called by a collective after compression, before it communicates, with its own
  //! statistics \p st: where the trainer handed the step's statistics down, joins \p st to
  //! them and writes this rank's values into their slots (the first call of the step only).
  void seal(const compress_stats& st) {
    if (seal_.slot != no_slot && !sealed_) seal_.write(st, local_);
    sealed_ = true;
  }

  //! Allreduce path: copies the local values to \p out (the tail of the reduction buffer).
  void write_local(std::span<float> out) const noexcept { std::copy(local_.begin(), local_.end(), out.begin()); }
  //! Allreduce path: takes the reduced tail of the buffer as the sums.
  void set_summed(std::span<const float> reduced) { summed_.assign(reduced.begin(), reduced.end()); }

  //! Allgather path: appends this rank's values as raw bytes after a packet.
  void write_trailer(std::span<std::byte> out) const noexcept {
    if (!local_.empty()) std::memcpy(out.data(), local_.data(), trailer_bytes());
  }
  //! Allgather path: starts the sums.
  void begin_sums() { summed_.assign(local_.size(), 0.0f); }
  //! Allgather path: adds one rank's trailer (call in rank order: the same bits on every
  //! rank). The caller has checked its length.
  void add_trailer(std::span<const std::byte> trailer) noexcept {
    for (std::size_t i = 0; i < summed_.size(); ++i) {
      float v;
      std::memcpy(&v, trailer.data() + i * sizeof(float), sizeof v);
      summed_[i] += v;
    }
  }

  //! True once the sums are in (the collective carried the slots).
  [[nodiscard]] bool has_sums() const noexcept { return summed_.size() == local_.size() && !local_.empty(); }
  //! Slot \p i summed over the ranks.
  [[nodiscard]] float sum(std::size_t i) const { return summed_.at(i); }
  //! All sums.
  [[nodiscard]] std::span<const float> sums() const noexcept { return summed_; }

 private:
  std::vector<float> local_;
  std::vector<float> summed_;
  // The statistics the trainer's control plane hands down for seal() (it alone fills them).
  friend class detail::step_statistics;
  detail::statistics_seal seal_;
  bool sealed_ = false;
};

//! The step_control a collective carries: the caller's \p given one, or (when it passed none)
//! the collective's \p own, cleared for this step, so the collective's own slots (AR-Topk's
//! norms, flexible's timings) ride along either way.
inline step_control& control_or_own(step_control* given, step_control& own) {
  if (given) return *given;
  own.clear();
  return own;
}

}  // namespace gravac
