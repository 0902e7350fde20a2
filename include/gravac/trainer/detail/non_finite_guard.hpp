#pragma once
//! \file
//! \brief detail::non_finite_guard<Space>: the trainer's non-finite protocol
//! (options::on_non_finite). It screens u = g + e, zeroes what must be zeroed, decides with
//! the other ranks (a flag in the step's collective on the host; one small Allreduce where
//! the ranks must know before sending, or where no control value rides) and throws the
//! same error on every rank. Buckets that already sent give what they sent back through
//! the trainer's \p give_back callback, so no residual loses a value.

#include <cstddef>
#include <span>
#include <string>
#include <utility>

#include "gravac/collective/control/detail/step_statistics.hpp"
#include "gravac/comm/communicator_ref.hpp"
#include "gravac/concepts/detail/non_finite_ops.hpp"
#include "gravac/core/bucket_plan.hpp"
#include "gravac/core/error.hpp"
#include "gravac/core/layout.hpp"
#include "gravac/core/memory.hpp"
#include "gravac/core/non_finite_action.hpp"
#include "gravac/core/step.hpp"

namespace gravac::detail {

//! The gradient and residual of the step in flight, as the screening reads them.
template <class Space>
struct screened_step {
  const layout* lay = nullptr;  //!< the trainer's layout
  grad_view<Space> g{};         //!< the whole gradient
  float* e = nullptr;           //!< the whole residual
  bool residual_zero = true;    //!< e is known to be zero (not read: u = g)
};

//! The non-finite protocol of one trainer over memory space \p Space.
template <class Space>
class non_finite_guard {
 public:
  //! Follows \p action.
  explicit non_finite_guard(non_finite_action action) noexcept : action_(action) {}

  //! The action.
  [[nodiscard]] non_finite_action action() const noexcept { return action_; }
  //! Sizes the screening's buffers for \p lay on compressor \p c's stream, before any step
  //! (device memory: the first screening would otherwise allocate pinned memory in a step,
  //! which synchronizes the device). Nothing to do on the host, or when nothing is screened.
  template <class C>
  void prepare(const C& c, const layout& lay) {
    if constexpr (requires(non_finite_ops<Space> & o, const C& cc, const layout& l) { o.prepare(cc, l); })
      if (action_ != non_finite_action::ignore) ops_.prepare(c, lay);
  }
  //! Forgets the last step's bad layer.
  void begin_step() noexcept {
    bad_layer_ = -1;
    overflow_ = false;
  }
  //! Whether an asynchronous step may send buckets before finish(): not when every rank
  //! must agree on the whole gradient first (skip_step).
  [[nodiscard]] bool sends_before_finish() const noexcept { return action_ != non_finite_action::skip_step; }
  //! Whether the host collective carries the flag (throw_error on host memory).
  [[nodiscard]] static constexpr bool flag_rides(non_finite_action a) noexcept {
    return Space::host_accessible && a == non_finite_action::throw_error;
  }

  //! Before anything is sent (whole gradient there): skip_step screens and agrees by one
  //! allreduce, returning true when every rank skips (g zeroed, \p r says so); on device
  //! memory throw_error screens and agrees here too (the synchronous step only: the
  //! asynchronous one agrees per bucket, before_bucket).
  template <class C>
  bool before_sending(C& c, const screened_step<Space>& s, communicator_ref<Space>& comm, bool async, step_report& r) {
    if constexpr (!Space::host_accessible) {
      if (action_ == non_finite_action::throw_error) {
        if (!async) agree(c, s, 0, s.lay->size(), comm, 0, [](std::size_t) {});
        return false;
      }
    }
    if (action_ != non_finite_action::skip_step) return false;
    bad_layer_ = scan(c, s, 0, s.lay->size());
    double flag = bad_layer_ >= 0 ? comm.rank() + 1.0 : 0.0;
    comm.allreduce_max(std::span<double>(&flag, 1));
    if (flag == 0) return false;
    ops_.zero_all(c, s.g.data(), s.g.size());
    r.skipped = true;
    r.bytes_sent = 0;
    r.wire_bytes_sent = r.wire_bytes_received = 0;
    return true;
  }

  //! Device memory, throw_error, asynchronous step: bucket \p b over layers [first, last)
  //! is screened and one allreduce of two host doubles decides just before it is sent;
  //! when any rank failed, the \p b buckets sent before give back what they sent and
  //! every rank throws (the bucket and the later ones are left as they were).
  template <class C, class GiveBack>
  void before_bucket(C& c, const screened_step<Space>& s, std::size_t b, const bucket& bk,
                     communicator_ref<Space>& comm, GiveBack&& give_back) {
    if constexpr (!Space::host_accessible) {
      if (action_ == non_finite_action::throw_error)
        agree(c, s, bk.first_layer, bk.last_layer, comm, b, std::forward<GiveBack>(give_back));
    } else {
      (void)c, (void)s, (void)b, (void)bk, (void)comm, (void)give_back;
    }
  }

  //! Bucket \p bk's u = g + e on the host, handled by the action (skip_step was decided
  //! before anything was sent). The first bad layer is remembered; under throw_error this
  //! rank raises its flag in \p plane and leaves that bucket and every later one out
  //! (zeroed). On device memory zero_values zeroes without a scan (its kernel leaves
  //! finite values as they are; a scan would cost a wait for the stream per bucket).
  template <class C>
  void screen_bucket(C& c, const screened_step<Space>& s, const bucket& bk, grad_view<Space> g, step_statistics& plane,
                     int rank) {
    if (action_ == non_finite_action::ignore || action_ == non_finite_action::skip_step) return;
    if constexpr (!Space::host_accessible) {
      if (action_ == non_finite_action::zero_values) zero_bucket(c, s, bk);
      return;
    }
    if (bad_layer_ < 0) {
      const long bad = scan(c, s, bk.first_layer, bk.last_layer);
      if (bad < 0) return;
      bad_layer_ = bad;
      if (action_ == non_finite_action::throw_error && plane.carries_flag()) plane.flag_non_finite(rank);
    } else if (action_ == non_finite_action::zero_values && scan(c, s, bk.first_layer, bk.last_layer) < 0) {
      return;
    }
    if (action_ == non_finite_action::zero_values) zero_bucket(c, s, bk);
    if (action_ == non_finite_action::throw_error) ops_.zero_all(c, g.data(), g.size());
  }

  //! After the collectives: when any rank raised the flag, every bucket gives back what it
  //! sent (\p give_back(count)) and every rank throws.
  template <class GiveBack>
  void after_collectives(const step_statistics& plane, const layout& lay, int rank, std::size_t buckets,
                         GiveBack&& give_back) {
    const auto [failing, rank_sum] = plane.flagged();
    if (failing == 0.0) return;
    give_back(buckets);
    throw_non_finite(failing, rank_sum, lay, rank);
  }

 private:
  // The first layer in [first, last) where u = g + e holds NaN or infinity, or -1 (also
  // when the check is off), found on compressor c's stream. A finite g whose sum with the
  // residual leaves the float range is caught too; overflow_ then says g was finite there.
  template <class C>
  long scan(const C& c, const screened_step<Space>& s, std::size_t first, std::size_t last) {
    if (action_ == non_finite_action::ignore) return -1;
    const non_finite_scan found =
        ops_.first_non_finite(c, *s.lay, first, last, s.g.data(), s.e, s.residual_zero, bad_layer_ < 0);
    if (found.layer >= 0 && bad_layer_ < 0) overflow_ = found.overflow;
    return found.layer;
  }
  // zero_values: g is zeroed wherever u = g + e is not finite, so u there is the residual.
  template <class C>
  void zero_bucket(C& c, const screened_step<Space>& s, const bucket& bk) {
    ops_.zero_non_finite(c, s.g.data() + bk.offset, s.e + bk.offset, bk.numel, s.residual_zero);
  }

  // Device memory: one allreduce of (failing ranks, sum of their rank + 1) over layers
  // [first, last) of this rank; if any failed, the first \p sent buckets give back what
  // they sent and every rank throws.
  template <class C, class GiveBack>
  void agree(C& c, const screened_step<Space>& s, std::size_t first, std::size_t last, communicator_ref<Space>& comm,
             std::size_t sent, GiveBack&& give_back) {
    const long bad = scan(c, s, first, last);
    if (bad >= 0 && bad_layer_ < 0) bad_layer_ = bad;
    double flag[2] = {bad >= 0 ? 1.0 : 0.0, bad >= 0 ? comm.rank() + 1.0 : 0.0};
    comm.allreduce_sum(std::span<double>(flag, 2));
    if (flag[0] == 0) return;
    give_back(sent);
    throw_non_finite(flag[0], flag[1], *s.lay, comm.rank());
  }

  // Every rank's error: a failing rank names its first bad layer (and says when g + e
  // overflowed from finite values), the others the failing rank or their count.
  [[noreturn]] void throw_non_finite(double failing, double rank_sum, const layout& lay, int rank) const {
    std::string where;
    if (bad_layer_ >= 0) {
      where = "layer '" + lay[static_cast<std::size_t>(bad_layer_)].name + "'";
      if (overflow_)
        throw error(status::non_finite,
                    "gradient + residual overflows the float range in " + where +
                        " (the gradient itself is finite; u = g + e is not)",
                    rank);
    } else if (failing == 1.0) {
      where = "rank " + std::to_string(static_cast<int>(rank_sum) - 1) + "'s gradient";
    } else {
      where = "the gradients of " + std::to_string(static_cast<int>(failing)) + " ranks";
    }
    throw error(status::non_finite, "non-finite gradient in " + where, rank);
  }

  non_finite_action action_;
  long bad_layer_ = -1;
  bool overflow_ = false;
  [[no_unique_address]] non_finite_ops<Space> ops_;  // the screening kernels on a device
};

}  // namespace gravac::detail
