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

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <span>
#include <vector>

#include "gravac/error.hpp"
#include "gravac/step.hpp"

namespace gravac {

//! Slots of float values summed over the ranks by a step's own collective.
class step_control {
 public:
  //! An index that names no slot (a slot not reserved this step).
  static constexpr std::size_t no_slot = static_cast<std::size_t>(-1);
  //! What seal() runs: it writes the statistics of the compressed step into their slots.
  class sealer {
   public:
    //! Writes the slots once the step's last collective has compressed (\p stats: its own).
    virtual void seal(const compress_stats& stats) = 0;

   protected:
    ~sealer() = default;
  };

  //! Forgets every slot (start of a step); keeps the memory.
  void clear() noexcept {
    local_.clear();
    summed_.clear();
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

  //! Called by a collective after compression, before it communicates: runs the sealer
  //! the trainer installed (it writes the statistics of the compressed step into its slots).
  void seal(const compress_stats& st) {
    if (sealer_ && !sealed_) sealer_->seal(st);
    sealed_ = true;
  }
  //! Installs the sealer seal() runs (it must outlive the step).
  void on_seal(sealer& s) noexcept { sealer_ = &s; }

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
  sealer* sealer_ = nullptr;
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
