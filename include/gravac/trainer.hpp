#pragma once
//! \file trainer.hpp
//! \brief trainer<C, K, P>: composes a Compressor, a Collective and a Policy, owns the
//! residuals and workspaces, and runs one data-parallel step.

#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "gravac/collective/step_buffers.hpp"
#include "gravac/collective/step_control.hpp"
#include "gravac/comm/communicator_ref.hpp"
#include "gravac/concepts.hpp"
#include "gravac/detail/composition_checks.hpp"
#include "gravac/detail/consistency.hpp"
#include "gravac/error.hpp"

namespace gravac {

//! What the trainer does when u = g + e (the gradient plus the error-feedback residual, as
//! every compressor computes it) holds NaN or infinity: a non-finite gradient, or a finite
//! one whose sum with the residual overflows the float range.
enum class non_finite_action : std::uint8_t {
  //! throw gravac::error on every rank, naming the layer (the failing rank) or the failing
  //! rank (the others). The flag rides in the step's collective, so the others learn of it
  //! after sending: each gives what it sent back to its residual (it then holds u = g + e);
  //! the failing rank's residual is unchanged. The step counter does not advance.
  throw_error,
  //! skip the step on every rank: gradient zeroed, residuals untouched. The ranks must know
  //! before anything is sent, which costs one small Allreduce per step.
  skip_step,
  zero_values,  //!< zero g wherever g + e is not finite (u is then the residual there) and go on
  ignore,       //!< do not check (fastest; the caller guarantees finite gradients)
};

//! Composes compressor \p C, collective \p K and policy \p P.
//!
//! \code
//! gravac::trainer<gravac::topk, gravac::allgather, gravac::fixed_policy> t{comm, lay, {}};
//! for (...) { backward(grads); t.step(grads); optimizer.step(grads); }
//! \endcode
//!
//! A composition that cannot work is a compile error whose first line says why
//! (detail/composition_checks.hpp): a type that does not model its concept (the
//! requirement it misses), a collective that cannot aggregate the compressor's packets (and
//! the collectives that can), a policy whose decisions the compressor ignores
//! (composition.hpp), a communicator of another memory space.
template <class C, class K, class P>
class trainer {
  static_assert(detail::check_composition<C, K, P>());

 public:
  //! The compressor type.
  using compressor_type = C;
  //! The collective type.
  using collective_type = K;
  //! The policy type.
  using policy_type = P;
  //! Memory space of gradients and residuals.
  using memory_space = typename C::memory_space;

  //! Options of the trainer and of its three parts.
  struct options {
    typename C::options compressor{};  //!< the compressor's options
    typename K::options collective{};  //!< the collective's options
    typename P::options policy{};      //!< the policy's options
    std::uint64_t seed = 0;            //!< seed shared by all ranks (random-k, stochastic rounding)
    non_finite_action on_non_finite = non_finite_action::throw_error;  //!< what to do with NaN / infinity
    bool verify_layout = true;  //!< check at construction that every rank has the same layout
    //! Debug: check every step that all ranks planned identical step_params (one allreduce
    //! of a 64-bit hash); a divergence throws gravac::error(diverged) on every rank, naming
    //! the ranks that differ from rank 0.
    bool check_consistency = false;
  };

  //! A trainer over communicator \p comm (which must outlive it) for the tensors of \p lay.
  //! Rejects invalid options (each part validates its own) and, when verify_layout is set,
  //! fails on every rank if any rank's layout differs.
  template <class M, bool = detail::check_communicator<M, C>()>
  trainer(M& comm, const layout& lay, const options& opt = {})
      : comm_(comm),
        layout_(lay),
        options_(opt),
        compressor_(lay, opt.compressor),
        collective_(lay, opt.collective),
        policy_(lay, opt.policy) {
    require(lay.numel() > 0, "trainer: the layout has no elements");
    if (opt.verify_layout) verify_layout_across_ranks();
    residual_ = typename storage_for<memory_space>::type(lay.numel());
    collective_.prepare(compressor_);
    params_.kept_fraction.assign(lay.size(), dense_fraction);
    params_.bin_length.assign(lay.size(), 0);
    params_.ranks = comm_.size();
    params_.seed = opt.seed;
    report_.kept_fraction.assign(lay.size(), 0.0);
    report_.layer_grad_norm.assign(lay.size(), 0.0);
    stats_.reset(lay.size(), 0);
  }

  // clang-format 14 would join the requires-clause onto the line, which Doxygen misreads.
  // clang-format off
  //! Runs one step on host gradients \p grads (the flat buffer of the layout): leaves the
  //! rank-averaged (compressed) gradient in place and returns the step's report.
  const step_report& step(std::span<float> grads)
    requires memory_space::host_accessible
  {
    return step(grad_view<memory_space>(grads));
  }
  // clang-format on

  //! Runs one step on the flat gradient buffer \p grads.
  //!
  //! On host memory the step makes no collective besides the gradient's own: the
  //! non-finite flag, the statistics a policy needs and the values it asked to agree on
  //! ride in that collective (step_control.hpp). Exceptions: `on_non_finite = skip_step`
  //! agrees on the flag by one small allreduce before anything is sent (a skipped step
  //! must leave every residual untouched, so the ranks must know before compressing), and
  //! the `check_consistency` debug option adds its own check.
  const step_report& step(grad_view<memory_space> grads) {
    begin_report(grads);                            // 1. validate; the policy fixes the step's parameters
    const long bad_layer = screen_gradient(grads);  // 2. non-finite values, by on_non_finite
    if (report_.skipped) return finish_step();
    prepare_control(bad_layer);                              // 3. the control values that ride in the collective
    aggregate(grads);                                        // 4. compress, exchange, decompress
    if (flag_slot_ != no_slot) throw_if_flagged(bad_layer);  // 5. a rank's non-finite gradient
    observe_step();                                          // 6. the report, rank-averaged statistics, the policy
    return finish_step();
  }

  //! Marks the end of an interval (an epoch, or every F steps) for the policy.
  void end_interval(const interval_info& info) { policy_.on_interval(info); }

  //! The error-feedback residual (flat, in layout order, in the compressor's memory space).
  //! The caller may write through it, so the residual is no longer assumed zero.
  [[nodiscard]] grad_view<memory_space> residual_view() noexcept {
    residual_zero_ = false;
    return {residual_.data(), residual_.size()};
  }
  // clang-format 14 would join the requires-clause onto the line, which Doxygen misreads.
  // clang-format off
  //! The error-feedback residual (host memory spaces).
  [[nodiscard]] std::span<const float> residual() const noexcept
    requires memory_space::host_accessible
  {
    return {residual_.data(), residual_.size()};
  }
  // clang-format on
  // clang-format 14 would join the requires-clause onto the line, which Doxygen misreads.
  // clang-format off
  //! Mutable residual, for checkpoint restore (host memory spaces).
  [[nodiscard]] std::span<float> residual() noexcept
    requires memory_space::host_accessible
  {
    residual_zero_ = false;  // the caller may write through it (checkpoint restore)
    return {residual_.data(), residual_.size()};
  }
  // clang-format on
  //! Steps run so far.
  [[nodiscard]] std::uint64_t steps() const noexcept { return step_; }
  //! Sets the step counter (checkpoint restore).
  void set_steps(std::uint64_t s) noexcept { step_ = s; }
  //! Sets the seed shared by all ranks (checkpoint restore).
  void set_seed(std::uint64_t s) noexcept { options_.seed = params_.seed = s; }
  //! The layout.
  [[nodiscard]] const layout& get_layout() const noexcept { return layout_; }
  //! The options.
  [[nodiscard]] const options& get_options() const noexcept { return options_; }
  //! The compressor.
  [[nodiscard]] C& compressor() noexcept { return compressor_; }
  //! The collective.
  [[nodiscard]] K& collective() noexcept { return collective_; }
  //! The policy.
  [[nodiscard]] P& policy() noexcept { return policy_; }
  //! The last step's report.
  [[nodiscard]] const step_report& last_report() const noexcept { return report_; }
  //! The parameters the policy chose for the last step.
  [[nodiscard]] const step_params& last_params() const noexcept { return params_; }
  //! The communicator.
  [[nodiscard]] communicator_ref<memory_space>& communicator() noexcept { return comm_; }

 private:
  // Every rank compares its layout hash; a mismatch fails on all ranks, naming the odd ones.
  void verify_layout_across_ranks() {
    const std::string odd = detail::ranks_differing_from_rank0(comm_, layout_.hash());
    if (!odd.empty())
      throw error(status::layout_mismatch, "the layout differs between ranks (ranks " + odd + " differ from rank 0)",
                  comm_.rank());
  }

  static constexpr std::size_t no_slot = step_control::no_slot;

  // Stage 1: checks the buffer, lets the policy plan the step (its decisions are fixed from
  // here on) and starts the report.
  void begin_report(grad_view<memory_space> grads) {
    // The message is built only on failure: the hot path allocates nothing.
    if (grads.size() != layout_.numel())
      throw error(status::invalid_argument, "trainer::step: gradient buffer has " + std::to_string(grads.size()) +
                                                " elements, the layout " + std::to_string(layout_.numel()));
    params_.step = step_;
    policy_.plan(params_);
    if (options_.check_consistency) consistency_.check(comm_, detail::hash_step_params(params_), step_);
    params_.collect_norms = P::needs_statistics;
    report_.step = step_;
    const auto now = std::chrono::steady_clock::now();
    // No previous return yet (first step, or first after a checkpoint restore): 0, not "since boot".
    report_.iteration_s =
        last_return_ != decltype(last_return_){} ? std::chrono::duration<double>(now - last_return_).count() : 0.0;
    report_.skipped = false;
    report_.previous_times_agreed = false;
    report_.modeled_communicate_s = 0;
  }

  // Stage 2: the first layer holding NaN or infinity (-1 if none), handled by on_non_finite;
  // report_.skipped says when every rank skips the step. throw_error leaves this rank's
  // gradient out (zeroed) and lets the flag ride in the collective; every rank throws after
  // it, with its residual holding what it did not send. Policies that accumulate the
  // gradient (Accordion) see it here, after the screening.
  long screen_gradient(grad_view<memory_space> grads) {
    const long bad_layer = scan_non_finite(grads);
    if (bad_layer >= 0 && options_.on_non_finite == non_finite_action::zero_values) zero_non_finite(grads);
    if (options_.on_non_finite == non_finite_action::skip_step && skip_agreed(grads, bad_layer)) return bad_layer;
    if (bad_layer >= 0 && options_.on_non_finite == non_finite_action::throw_error) zero_all(grads);
    if constexpr (requires(P & p, std::span<const float> g) { p.accumulate(g); }) {
      if constexpr (memory_space::host_accessible) policy_.accumulate(std::span<const float>(grads.span()));
    }
    return bad_layer;
  }

  // Stage 4: the collective compresses, exchanges and decompresses, carrying the control
  // values; the averaged gradient is left in \p grads.
  void aggregate(grad_view<memory_space> grads) {
    buffers_ = step_buffers<memory_space>{grads, grad_view<memory_space>(residual_.data(), residual_.size()),
                                          residual_zero_, control_.empty() ? nullptr : &control_};
    const double modeled_before = comm_.modeled_seconds();
    collective_.aggregate(compressor_, comm_, buffers_, params_, stats_, report_);
    report_.modeled_communicate_s = comm_.modeled_seconds() - modeled_before;
    // A collective that dropped the control values would leave the ranks deciding on
    // local numbers (and a failing rank alone): refuse rather than diverge.
    if (buffers_.control && !control_.has_sums())
      throw error(status::invalid_argument,
                  "trainer::step: the collective did not carry the step's control values (see step_control.hpp)",
                  comm_.rank());
  }

  // Stage 6: the report from the compressor's statistics, their rank averages where the
  // policy needs them, the values the policy asked to agree on, then the policy observes.
  void observe_step() {
    residual_zero_ = params_.all_dense();
    fill_report();
    report_.fallback = params_.fallback;
    if constexpr (P::needs_statistics) read_statistics();
    deliver_agreement();
    policy_.observe(report_);
  }

  // Ends a step that ran (or was skipped by every rank): the counter advances.
  const step_report& finish_step() {
    ++step_;
    last_return_ = std::chrono::steady_clock::now();
    return report_;
  }

  // The first layer where this rank's u = g + e holds NaN or infinity, or -1 (also when the
  // check is off, or on device memory, where the compressors check on the device). u is
  // what every compressor computes, in float and in the same order, so a gradient finite by
  // itself whose sum with the residual leaves the float range is caught too;
  // bad_is_overflow_ then says g itself was finite in that layer. A residual known to be
  // zero is not read (u = g).
  long scan_non_finite(grad_view<memory_space> grads) {
    bad_is_overflow_ = false;
    if (options_.on_non_finite == non_finite_action::ignore) return -1;
    if constexpr (!memory_space::host_accessible) {
      return -1;
    } else {
      const float* g = grads.span().data();
      const float* e = residual_.data();
      for (std::size_t i = 0; i < layout_.size(); ++i) {
        const auto& l = layout_[i];
        bool bad = false;
        if (residual_zero_) {
          for (std::size_t j = l.offset; j < l.offset + l.numel; ++j) bad |= !std::isfinite(g[j]);
        } else {
          for (std::size_t j = l.offset; j < l.offset + l.numel; ++j) bad |= !std::isfinite(g[j] + e[j]);
        }
        if (!bad) continue;
        bad_is_overflow_ = true;
        for (std::size_t j = l.offset; j < l.offset + l.numel; ++j)
          bad_is_overflow_ = bad_is_overflow_ && std::isfinite(g[j]) && std::isfinite(e[j]);
        return static_cast<long>(i);
      }
      return -1;
    }
  }
  // zero_values: g is zeroed wherever u = g + e is not finite (a non-finite g, or a sum that
  // overflows), so u there is the residual alone and the step goes on.
  void zero_non_finite(grad_view<memory_space> grads) const {
    if constexpr (memory_space::host_accessible) {
      auto g = grads.span();
      const float* e = residual_.data();
      for (std::size_t j = 0; j < g.size(); ++j)
        if (!std::isfinite(residual_zero_ ? g[j] : g[j] + e[j])) g[j] = 0.0f;
    }
  }
  void zero_all(grad_view<memory_space> grads) const {
    if constexpr (memory_space::host_accessible) std::fill(grads.span().begin(), grads.span().end(), 0.0f);
  }

  // skip_step: one allreduce of a flag, so that every rank skips together before anything
  // touches a residual. Returns true when the step is skipped.
  bool skip_agreed(grad_view<memory_space> grads, long bad_layer) {
    if constexpr (!memory_space::host_accessible) {
      return false;
    } else {
      double flag = bad_layer >= 0 ? comm_.rank() + 1.0 : 0.0;
      comm_.allreduce_max(std::span<double>(&flag, 1));
      if (flag == 0) return false;
      zero_all(grads);
      report_.skipped = true;
      report_.bytes_sent = 0;
      return true;
    }
  }

  // Slots of this step's control plane (host memory only): the non-finite flag (count of
  // failing ranks, sum of their rank + 1), the statistics a policy needs, and the values
  // the policy asked to agree on. The collective may add slots of its own.
  void prepare_control(long bad_layer) {
    control_.clear();
    flag_slot_ = stats_slot_ = agree_slot_ = times_slot_ = no_slot;
    agree_count_ = 0;
    if constexpr (memory_space::host_accessible) {
      if (options_.on_non_finite == non_finite_action::throw_error) {
        flag_slot_ = control_.reserve(2);
        if (bad_layer >= 0) {
          control_.local(flag_slot_) = 1.0f;
          control_.local(flag_slot_ + 1) = static_cast<float>(comm_.rank() + 1);
        }
      }
      if constexpr (P::needs_statistics) {
        stats_slot_ = control_.reserve(1 + params_.gain_candidates.size() + 2 * layout_.size());
        control_.on_seal(&trainer::seal_statistics, this);
        if (has_pending_times_) {  // the previous step's times, known only now
          times_slot_ = control_.reserve(4);
          control_.local(times_slot_) = static_cast<float>(pending_times_.compress_s);
          control_.local(times_slot_ + 1) = static_cast<float>(pending_times_.communicate_s);
          control_.local(times_slot_ + 2) = static_cast<float>(pending_times_.decompress_s);
          control_.local(times_slot_ + 3) = static_cast<float>(pending_times_.iteration_s);
        }
      }
      if constexpr (requires(const P& p) { p.agreement_request(); }) {
        const std::span<const double> req = policy_.agreement_request();
        if (!req.empty()) {
          agree_slot_ = control_.reserve(req.size());
          agree_count_ = req.size();
          for (std::size_t i = 0; i < req.size(); ++i) control_.local(agree_slot_ + i) = static_cast<float>(req[i]);
        }
      }
    }
  }

  // Runs when the collective has compressed: this rank's gain, gain curve, layer norms and
  // kept fractions go into the statistics slots.
  static void seal_statistics(void* self, const compress_stats& st) {
    auto& t = *static_cast<trainer*>(self);
    std::size_t at = t.stats_slot_;
    const double in = st.input_sq();
    t.control_.local(at++) = static_cast<float>(gain_from_sq(st.kept_sq(), in));
    for (std::size_t c = 0; c < t.params_.gain_candidates.size(); ++c)
      t.control_.local(at++) =
          static_cast<float>(c < st.candidate_kept_sq.size() ? gain_from_sq(st.candidate_kept_sq[c], in) : 1.0);
    for (std::size_t i = 0; i < t.layout_.size(); ++i)
      t.control_.local(at++) = static_cast<float>(std::sqrt(st.layers[i].grad_sq));
    for (std::size_t i = 0; i < t.layout_.size(); ++i) {
      const auto n = static_cast<double>(t.layout_[i].numel);
      t.control_.local(at++) = n > 0 ? static_cast<float>(static_cast<double>(st.layers[i].kept) / n) : 0.0f;
    }
  }

  // After the collective: when any rank flagged a non-finite gradient, every rank gives
  // back what it sent to its residual (so nothing is lost: the finite ranks' residuals hold
  // u = g + e, the failing rank's its old residual) and throws, naming its own layer or a
  // failing rank. The step counter does not advance.
  void throw_if_flagged(long bad_layer) {
    if (!control_.has_sums()) return;
    const float failing = control_.sum(flag_slot_);
    if (failing == 0.0f) return;
    if constexpr (requires { collective_.return_sent(compressor_, buffers_); })
      collective_.return_sent(compressor_, buffers_);
    residual_zero_ = false;
    std::string where;
    if (bad_layer >= 0) {
      where = "layer '" + layout_[static_cast<std::size_t>(bad_layer)].name + "'";
      if (bad_is_overflow_)
        throw error(status::non_finite,
                    "gradient + residual overflows the float range in " + where +
                        " (the gradient itself is finite; u = g + e is not)",
                    comm_.rank());
    } else if (failing == 1.0f) {
      where = "rank " + std::to_string(static_cast<int>(control_.sum(flag_slot_ + 1)) - 1) + "'s gradient";
    } else {
      where = "the gradients of " + std::to_string(static_cast<int>(failing)) + " ranks";
    }
    throw error(status::non_finite, "non-finite gradient in " + where, comm_.rank());
  }

  void fill_report() {
    report_.dense_bytes = layout_.numel() * sizeof(float);
    for (std::size_t i = 0; i < layout_.size(); ++i) {
      const auto& l = layout_[i];
      const auto& s = stats_.layers[i];
      report_.kept_fraction[i] = l.numel ? static_cast<double>(s.kept) / static_cast<double>(l.numel) : 0.0;
      report_.layer_grad_norm[i] = std::sqrt(s.grad_sq);
    }
    report_.gain = gain_from_sq(stats_.kept_sq(), stats_.input_sq());
    report_.gain_candidates.assign(params_.gain_candidates.begin(), params_.gain_candidates.end());
    report_.gain_curve.resize(params_.gain_candidates.size());
    const double in = stats_.input_sq();
    for (std::size_t c = 0; c < report_.gain_curve.size(); ++c)
      report_.gain_curve[c] = c < stats_.candidate_kept_sq.size() ? gain_from_sq(stats_.candidate_kept_sq[c], in) : 1.0;
    report_.statistics_synchronized = false;
  }

  // The rank averages of the statistics slots replace the local values in the report. On
  // device memory (no control plane yet) one allreduce of the statistics does it instead.
  void read_statistics() {
    if (stats_slot_ == no_slot || !control_.has_sums()) {
      if constexpr (!memory_space::host_accessible) synchronize_statistics();
    } else {
      const double inv = 1.0 / comm_.size();
      std::size_t at = stats_slot_;
      report_.gain = control_.sum(at++) * inv;
      for (auto& g : report_.gain_curve) g = control_.sum(at++) * inv;
      for (auto& n : report_.layer_grad_norm) n = control_.sum(at++) * inv;
      for (auto& k : report_.kept_fraction) k = control_.sum(at++) * inv;
      report_.statistics_synchronized = true;
      report_.previous_times_agreed = times_slot_ != no_slot;
      if (report_.previous_times_agreed)
        report_.previous_times = {control_.sum(times_slot_) * inv, control_.sum(times_slot_ + 1) * inv,
                                  control_.sum(times_slot_ + 2) * inv, control_.sum(times_slot_ + 3) * inv};
    }
    pending_times_ = {report_.compress_s, report_.communicate_s, report_.decompress_s, report_.iteration_s};
    has_pending_times_ = true;
  }

  // Hands the policy the sums of the values it asked to agree on (they rode in this step's
  // collective; on device memory they take one allreduce of their own).
  void deliver_agreement() {
    if constexpr (requires(P & p, std::span<const double> s) { p.agreed(s); }) {
      if constexpr (memory_space::host_accessible) {
        if (agree_slot_ == no_slot || !control_.has_sums()) return;
        agreed_.resize(agree_count_);
        for (std::size_t i = 0; i < agree_count_; ++i) agreed_[i] = control_.sum(agree_slot_ + i);
      } else {
        const std::span<const double> req = policy_.agreement_request();
        if (req.empty()) return;
        agreed_.assign(req.begin(), req.end());
        comm_.allreduce_sum(std::span<double>(agreed_));
      }
      policy_.agreed(std::span<const double>(agreed_));
    }
  }

  // Device memory: the statistics in one allreduce of their own (the control plane rides
  // only in host collectives so far).
  void synchronize_statistics() {
    // Layout of sync_: L norms, L kept fractions, the gain, G gain-curve points.
    const std::size_t L = layout_.size(), G = report_.gain_curve.size(), T = has_pending_times_ ? 4 : 0;
    sync_.resize(2 * L + 1 + G + T);
    if (T) {
      sync_[2 * L + 1 + G] = pending_times_.compress_s;
      sync_[2 * L + 2 + G] = pending_times_.communicate_s;
      sync_[2 * L + 3 + G] = pending_times_.decompress_s;
      sync_[2 * L + 4 + G] = pending_times_.iteration_s;
    }
    std::copy(report_.layer_grad_norm.begin(), report_.layer_grad_norm.end(), sync_.begin());
    std::copy(report_.kept_fraction.begin(), report_.kept_fraction.end(),
              sync_.begin() + static_cast<std::ptrdiff_t>(L));
    sync_[2 * L] = report_.gain;
    std::copy(report_.gain_curve.begin(), report_.gain_curve.end(),
              sync_.begin() + static_cast<std::ptrdiff_t>(2 * L + 1));
    comm_.allreduce_sum(std::span<double>(sync_));
    const double inv = 1.0 / comm_.size();
    for (std::size_t i = 0; i < L; ++i) report_.layer_grad_norm[i] = sync_[i] * inv;
    for (std::size_t i = 0; i < L; ++i) report_.kept_fraction[i] = sync_[L + i] * inv;
    report_.gain = sync_[2 * L] * inv;
    for (std::size_t c = 0; c < G; ++c) report_.gain_curve[c] = sync_[2 * L + 1 + c] * inv;
    report_.statistics_synchronized = true;
    report_.previous_times_agreed = T != 0;
    if (T)
      report_.previous_times = {sync_[2 * L + 1 + G] * inv, sync_[2 * L + 2 + G] * inv, sync_[2 * L + 3 + G] * inv,
                                sync_[2 * L + 4 + G] * inv};
  }

  communicator_ref<memory_space> comm_;
  layout layout_;
  options options_;
  C compressor_;
  K collective_;
  P policy_;
  typename storage_for<memory_space>::type residual_;
  bool residual_zero_ = true;
  bool bad_is_overflow_ = false;  // the last screened bad layer had finite g and e, and g + e overflowed
  step_params params_;
  compress_stats stats_;
  step_report report_;
  step_buffers<memory_space> buffers_{};  // the buffers of the step in flight
  std::vector<double> sync_;
  std::vector<double> agreed_;
  step_control control_;
  std::size_t flag_slot_ = no_slot, stats_slot_ = no_slot, agree_slot_ = no_slot, agree_count_ = 0;
  std::size_t times_slot_ = no_slot;
  step_times pending_times_{};  // this rank's times of the last step, sent with the next
  bool has_pending_times_ = false;
  detail::consistency_checker consistency_;
  std::uint64_t step_ = 0;
  std::chrono::steady_clock::time_point last_return_{};
};

}  // namespace gravac
