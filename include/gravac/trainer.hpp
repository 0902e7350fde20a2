#pragma once
//! \file trainer.hpp
//! \brief trainer<C, K, P>: composes a Compressor, a Collective and a Policy, owns the
//! residuals and workspaces, and runs one data-parallel step.

#include <algorithm>
#include <chrono>
#include <cmath>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "gravac/collective/collective_for.hpp"
#include "gravac/collective/control/detail/statistics_slots.hpp"
#include "gravac/collective/control/detail/step_statistics.hpp"
#include "gravac/collective/control/step_control.hpp"
#include "gravac/collective/step_buffers.hpp"
#include "gravac/comm/communicator_ref.hpp"
#include "gravac/concepts/concepts.hpp"
#include "gravac/concepts/detail/host_transfer.hpp"
#include "gravac/concepts/detail/layer_events.hpp"
#include "gravac/core/bucket_plan.hpp"
#include "gravac/core/detail/seconds_since.hpp"
#include "gravac/core/error.hpp"
#include "gravac/core/non_finite_action.hpp"
#include "gravac/trainer/detail/async_schedule.hpp"
#include "gravac/trainer/detail/bucket_worker.hpp"
#include "gravac/trainer/detail/composition_checks.hpp"
#include "gravac/trainer/detail/consistency.hpp"
#include "gravac/trainer/detail/non_finite_guard.hpp"
#include "gravac/trainer/detail/step_buckets.hpp"
#include "gravac/trainer/detail/step_settings_of.hpp"

namespace gravac {

//! Composes compressor \p C, collective \p K and policy \p P.
//!
//! \code
//! gravac::trainer<gravac::topk, gravac::allgather, gravac::fixed_policy> t{comm, lay, {}};
//! for (...) { backward(grads); t.step(grads); optimizer.step(grads); }
//! \endcode
//!
//! The layout is split into buckets (options::bucket_bytes, bucket_plan.hpp), each with a
//! compressor and a collective of its own over its layers. `step(grads)` runs them one
//! after the other once the whole gradient is there; the asynchronous step overlaps them
//! with backward on a communication thread (host and device memory; on a device each
//! bucket's work waits for CUDA events of its layers, docs/overlap.md):
//!
//! \code
//! t.begin_step(grads);                // the policy fixes the step's decisions here
//! for (layer from last to first) { backward_layer(); t.ready(layer); }  // buckets start as they fill
//! const auto& report = t.finish();    // waits for the buckets' collectives
//! \endcode
//!
//! Both run the same code on the same buckets in the same order, so they give the same
//! bits (averaged gradient, residuals, reports but the measured times).
//!
//! A composition that cannot work is a compile error whose first line says why
//! (trainer/detail/composition_checks.hpp): a type that does not model its concept (the
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
  //! Whether ready(layer, stream) takes \p Stream as the stream a layer was produced on
  //! (device memory: cudaStream_t and gravac::stream_ref; host memory: none).
  template <class Stream>
  static constexpr bool accepts_stream = detail::layer_events<memory_space>::template accepts_stream<Stream>;

  //! Options of the trainer and of its three parts.
  struct options {
    typename C::options compressor{};  //!< the compressor's options
    typename K::options collective{};  //!< the collective's options
    typename P::options policy{};      //!< the policy's options
    std::uint64_t seed = 0;            //!< seed shared by all ranks (random-k, stochastic rounding)
    non_finite_action on_non_finite = non_finite_action::throw_error;  //!< what to do with NaN / infinity
    bool verify_layout = true;  //!< check at construction that every rank has the same layout
    //! Debug: check every step that all ranks planned identical step_params and compressor
    //! step settings (one allreduce of a 64-bit hash); a divergence throws
    //! gravac::error(diverged) on every rank, naming the ranks that differ from rank 0.
    bool check_consistency = false;
    //! Target bucket size in bytes of float gradient (bucket_plan.hpp): one_bucket for a
    //! single bucket, bucket_per_layer for one per layer. A compressor that selects over
    //! the whole buffer selects per bucket.
    std::size_t bucket_bytes = default_bucket_bytes;
  };

  //! A trainer over communicator \p comm (which must outlive it) for the tensors of \p lay.
  //! Rejects invalid options (each part validates its own) and, when verify_layout is set,
  //! fails on every rank if any rank's layout differs.
  template <class M, bool = detail::check_communicator<M, C>()>
  trainer(M& comm, const layout& lay, const options& opt = {})
      : comm_(comm),
        layout_(lay),
        options_(opt),
        plan_(checked_plan(lay, opt)),
        policy_(lay, opt.policy),
        guard_(opt.on_non_finite),
        buckets_(plan_, opt) {
    if (opt.verify_layout) verify_layout_across_ranks();
    reserve_host_staging();
    residual_ = typename storage_for<memory_space>::type(lay.numel());
    params_.kept_fraction.assign(lay.size(), dense_fraction);
    params_.ranks = comm_.size();
    params_.seed = opt.seed;
    report_.kept_fraction.assign(lay.size(), 0.0);
    report_.layer_grad_norm.assign(lay.size(), 0.0);
    report_.buckets = plan_.size();
    stats_.reset(lay.size(), 0);
  }

  // clang-format off
  //! Runs one step on host gradients \p grads (the flat buffer of the layout): leaves the
  //! rank-averaged (compressed) gradient in place and returns the step's report.
  const step_report& step(std::span<float> grads)
    requires memory_space::host_accessible
  {
    return step(grad_view<memory_space>(grads));
  }
  // clang-format on

  //! Runs one step on the flat gradient buffer \p grads: its buckets one after the other,
  //! in the calling thread. On host memory the non-finite flag, the policy's statistics and
  //! its values to agree on ride in the gradient's own collective (step_control.hpp);
  //! `skip_step`, and `throw_error` on device memory, add one small Allreduce before
  //! anything is sent. On a device \p grads must be produced on the calling thread's
  //! default stream or be complete (docs/overlap.md, "On a GPU").
  const step_report& step(grad_view<memory_space> grads) {
    start_step(grads, false);
    const auto t0 = std::chrono::steady_clock::now();
    try {
      events_.record_step();  // device: the compressors' one stream waits for the caller's
      events_.wait_step(first_compressor());
      if (guard_.before_sending(first_compressor(), screened(), comm_, false, report_)) {
        in_step_ = false;
        return finish_step();
      }
      for (std::size_t b = 0; b < buckets_.size(); ++b) run_bucket(b);
    } catch (...) {
      in_step_ = false;
      throw;
    }
    report_.exposed_communicate_s = detail::seconds_since(t0);
    return complete_step();
  }

  // clang-format off
  //! Starts an asynchronous step on host gradients \p grads (begin_step(grad_view)).
  void begin_step(std::span<float> grads)
    requires memory_space::host_accessible
  {
    begin_step(grad_view<memory_space>(grads));
  }
  // clang-format on

  //! Starts an asynchronous step on \p grads, which backward is about to fill: the policy
  //! plans the step (its decisions are fixed from here on) and the communication thread
  //! waits for buckets. Until finish() the caller must not touch a layer after ready(), and
  //! \p grads must outlive the step. During the step only the communication thread calls
  //! the communicator: an MPI engine needs MPI_THREAD_SERIALIZED or more (checked here).
  //! docs/overlap.md has the rules in full.
  void begin_step(grad_view<memory_space> grads) {
    if (!comm_.accepts_calls_from_other_threads())
      throw error(status::invalid_argument,
                  "trainer::begin_step: the communicator may not be called from the communication thread (an MPI "
                  "engine needs MPI_Init_thread with MPI_THREAD_SERIALIZED or MPI_THREAD_MULTIPLE); use step() or "
                  "initialise MPI with a thread level",
                  comm_.rank());
    if (!worker_) worker_ = std::make_unique<detail::bucket_worker<trainer>>(&trainer::run_bucket_on_worker);
    start_step(grads, true);
    try {
      // After start_step's check: a refused begin_step must not touch the events (nor the
      // device the communication thread may be reading for the step in progress).
      events_.begin(layout_.size());          // device: the layers' events, created on the first step only
      worker_->begin(buckets_.size(), this);  // starts the thread on the first step
    } catch (...) {
      in_step_ = false;
      throw;
    }
    schedule_.start_clock();
  }

  //! Marks layer \p layer_index final; a bucket starts once all its layers are ready and
  //! the buckets before it have started. Its time on the modeled timeline is the wall time
  //! since begin_step(). On a device the layer is final once the work queued so far on the
  //! calling thread's per-thread default stream is; pass another stream to ready(layer, stream).
  void ready(std::size_t layer_index) {
    check_ready(layer_index);
    events_.record_default(layer_index);
    mark_ready(layer_index, schedule_.since_begin(), false);
  }

  // clang-format off
  //! Device memory: layer \p layer_index is final once the work queued so far on
  //! \p stream is. Records the layer's CUDA event there and returns at once.
  template <class Stream>
    requires(accepts_stream<Stream>)
  void ready(std::size_t layer_index, Stream stream) {
    check_ready(layer_index);
    events_.record(layer_index, stream);
    mark_ready(layer_index, schedule_.since_begin(), false);
  }
  // clang-format on

  //! ready() with the layer's time on the modeled timeline given: \p ready_s seconds of
  //! backward since begin_step(); backward ends at the last time given.
  void ready(std::size_t layer_index, double ready_s) {
    check_ready(layer_index);
    events_.record_default(layer_index);
    mark_ready(layer_index, ready_s, true);
  }

  //! Ends the asynchronous step: marks every layer not yet ready, waits for every bucket's
  //! collective and returns the step's report (on a device, every bucket's work has
  //! completed). A failure in a bucket is thrown here and abandons the step (the step
  //! counter does not advance). With `skip_step` nothing is sent before finish().
  const step_report& finish() {
    require(in_step_ && async_, "trainer::finish: no asynchronous step in progress (call begin_step first)");
    const double backward_s = schedule_.backward_end_now();
    for (std::size_t i = layout_.size(); i-- > 0;) {
      if (schedule_.is_ready(i)) continue;
      events_.record_default(i);
      schedule_.mark_ready(i, plan_.bucket_of(i), backward_s);
    }
    schedule_.end_backward(backward_s);
    const auto t0 = std::chrono::steady_clock::now();
    try {
      // A whole-gradient screening runs on this thread's compressor stream: after every
      // layer's event (only when nothing was sent yet, so no bucket runs beside it).
      if (!guard_.sends_before_finish()) events_.wait(first_compressor(), 0, layout_.size());
      if (guard_.before_sending(first_compressor(), screened(), comm_, true, report_)) {
        report_.exposed_communicate_s = detail::seconds_since(t0);
        in_step_ = false;
        return finish_step();
      }
      worker_->release(buckets_.size());
      worker_->wait();
    } catch (...) {
      in_step_ = false;
      throw;
    }
    report_.exposed_communicate_s = detail::seconds_since(t0);
    return complete_step();
  }

  trainer(const trainer&) = delete;
  trainer& operator=(const trainer&) = delete;
  //! Moves a trainer between steps.
  trainer(trainer&&) noexcept = default;
  //! Moves a trainer between steps.
  trainer& operator=(trainer&&) noexcept = default;
  //! Destroying a trainer between begin_step() and finish() abandons the step: the
  //! communicator is told (communicator_ref::abandon), so no other rank waits forever.
  ~trainer() {
    if (!(in_step_ && async_)) return;
    try {
      comm_.abandon("rank " + std::to_string(comm_.rank()) +
                    " abandoned an asynchronous step (its trainer was destroyed between begin_step and finish)");
    } catch (...) {  // building the message failed: abandon without it
      comm_.abandon("a rank abandoned an asynchronous step");
    }
  }

  //! True between begin_step() and finish().
  [[nodiscard]] bool step_in_progress() const noexcept { return in_step_; }

  //! Marks the end of an interval (an epoch, or every F steps) for the policy.
  void end_interval(const interval_info& info) { policy_.on_interval(info); }

  //! The error-feedback residual (flat, in layout order, in the compressor's memory space).
  //! The caller may write through it, so the residual is no longer assumed zero.
  [[nodiscard]] grad_view<memory_space> residual_view() noexcept {
    residual_zero_ = false;
    return {residual_.data(), residual_.size()};
  }
  // clang-format off
  //! The error-feedback residual (host memory spaces).
  [[nodiscard]] std::span<const float> residual() const noexcept
    requires memory_space::host_accessible
  {
    return {residual_.data(), residual_.size()};
  }
  //! Mutable residual, for checkpoint restore (host memory spaces).
  [[nodiscard]] std::span<float> residual() noexcept
    requires memory_space::host_accessible
  {
    residual_zero_ = false;  // the caller may write through it (checkpoint restore)
    return {residual_.data(), residual_.size()};
  }
  // clang-format on

  //! Copies the residual into host memory \p out (resized to the layout's element count),
  //! between steps: in any memory space (on a device, after the queued work of the step
  //! that wrote it, and waited for). What the checkpoint saves.
  void residual_to_host(std::vector<float>& out) const {
    out.resize(residual_.size());
    if (!out.empty())
      detail::host_transfer<memory_space>::to_host(buckets_[0].compressor, residual_.data(), out.data(), out.size());
  }
  //! Replaces the residual with the host values \p in (the layout's element count), between
  //! steps, in any memory space: what the checkpoint restores. Throws gravac::error
  //! (invalid_argument) for another length, before anything changes.
  void residual_from_host(std::span<const float> in) {
    require(in.size() == residual_.size(), "trainer::residual_from_host: " + std::to_string(in.size()) +
                                               " values for a residual of " + std::to_string(residual_.size()));
    residual_zero_ = false;
    if (!in.empty())
      detail::host_transfer<memory_space>::from_host(buckets_[0].compressor, in.data(), residual_.data(), in.size());
  }

  //! Appends the trainer's own state between steps to \p out (checkpoint.hpp): this
  //! rank's times of the last step, which ride in the next step's collective for a policy
  //! that needs statistics. Restored by load_step_state, so that a resumed run sends and
  //! decides what an uninterrupted one does.
  void save_step_state(std::vector<std::byte>& out) const { plane_.pending().save(out); }
  //! Restores what save_step_state wrote; an empty \p in (a checkpoint without it) means
  //! no times are pending. Throws gravac::error for any other length.
  void load_step_state(std::span<const std::byte> in) { plane_.pending().load(in); }
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
  //! The buckets.
  [[nodiscard]] const bucket_plan& buckets() const noexcept { return plan_; }
  //! Number of buckets.
  [[nodiscard]] std::size_t bucket_count() const noexcept { return plan_.size(); }
  //! The compressor of bucket \p b (over the bucket's layers; with one bucket, the whole layout).
  [[nodiscard]] C& compressor(std::size_t b = 0) { return buckets_.at(b).compressor; }
  //! The compressor of bucket \p b.
  [[nodiscard]] const C& compressor(std::size_t b = 0) const { return buckets_.at(b).compressor; }
  //! The collective of bucket \p b.
  [[nodiscard]] K& collective(std::size_t b = 0) { return buckets_.at(b).collective; }
  //! The collective of bucket \p b.
  [[nodiscard]] const K& collective(std::size_t b = 0) const { return buckets_.at(b).collective; }
  //! The policy.
  [[nodiscard]] P& policy() noexcept { return policy_; }
  //! The policy.
  [[nodiscard]] const P& policy() const noexcept { return policy_; }
  //! The last step's report.
  [[nodiscard]] const step_report& last_report() const noexcept { return report_; }
  //! The parameters the policy chose for the last step.
  [[nodiscard]] const step_params& last_params() const noexcept { return params_; }
  //! The compressor's step settings of the last step, for the whole layout (what the
  //! policy's plan_settings() filled; the compressor's defaults when it has none).
  [[nodiscard]] const auto& last_settings() const noexcept requires detail::HasStepSettings<C> { return settings_; }
  //! The communicator.
  [[nodiscard]] communicator_ref<memory_space>& communicator() noexcept { return comm_; }
  //! The communicator.
  [[nodiscard]] const communicator_ref<memory_space>& communicator() const noexcept { return comm_; }

 private:
  static bucket_plan checked_plan(const layout& lay, const options& opt) {
    require(lay.numel() > 0, "trainer: the layout has no elements");
    require(opt.bucket_bytes > 0, "trainer: bucket_bytes must be positive (bucket_per_layer: one bucket per layer)");
    return bucket_plan(lay, opt.bucket_bytes);
  }

  // Every rank compares its layout hash; a mismatch fails on all ranks, naming the odd ones.
  void verify_layout_across_ranks() {
    const std::string odd = detail::ranks_differing_from_rank0(comm_, layout_.hash());
    if (!odd.empty())
      throw error(status::layout_mismatch, "the layout differs between ranks (ranks " + odd + " differ from rank 0)",
                  comm_.rank());
  }

  // Device memory: the host values of a step go through pinned staging, the
  // communicator's (the flags, the statistics, the values to agree on: host doubles it
  // reduces), each collective's (its control plane) and the non-finite screening's (its
  // per-layer flags), and pinned memory cannot be allocated in a step without
  // synchronizing the whole device (cudaMallocHost). All are sized here, before any step,
  // by the engine's reserve_host_staging and the collective's reserve_control where they
  // have one. The device trainer hands its collectives no control values (they carry only
  // their own). Host memory stages nothing.
  void reserve_host_staging() {
    if constexpr (!memory_space::host_accessible) {
      guard_.prepare(first_compressor(), layout_);
      comm_.reserve_host_staging(device_host_values());
      if constexpr (requires(K & k, const C& c) { k.reserve_control(c, std::size_t{}, int{}); })
        for (std::size_t b = 0; b < buckets_.size(); ++b)
          buckets_[b].collective.reserve_control(buckets_[b].compressor, 0, comm_.size());
    }
  }
  // The most host doubles one reduction of a device step carries: the non-finite flag (2),
  // the layout and consistency checks (8, then one per rank to name those that differ),
  // the statistics a policy needs (statistics_slots, with a device compressor's most gain
  // candidates and the previous step's times) and the values a policy asks to agree on
  // (one per layer at most, or a few).
  [[nodiscard]] std::size_t device_host_values() const {
    const std::size_t layers = layout_.size();
    std::size_t n = 8;
    if (options_.check_consistency) n = std::max(n, static_cast<std::size_t>(comm_.size()));
    if constexpr (P::needs_statistics)
      n = std::max(n, detail::statistics_slots{layers, detail::device_gain_candidates, true}.size());
    if constexpr (requires(const P& p) { p.agreement_request(); }) n = std::max(n, layers);
    return n;
  }

  // The start of every step: the buffer is checked, the policy plans the step (its
  // decisions are fixed from here on), the buckets get their slices of the parameters and
  // the control slots are laid out.
  void start_step(grad_view<memory_space> grads, bool async) {
    require(!in_step_, "trainer: a step is already in progress (call finish() first)");
    begin_report(grads);
    buckets_.slice(params_, plan_, layout_.size());
    if constexpr (detail::HasStepSettings<C>) buckets_.give_settings(settings_, plan_, layout_.size());
    guard_.begin_step();
    prepare_control();
    grads_ = grads;
    for (std::size_t b = 0; b < buckets_.size(); ++b) buckets_[b].modeled_s = 0;
    schedule_.begin(plan_, layout_.size());
    async_ = async;
    in_step_ = true;
  }

  // The end of a step whose buckets all ran: the control values' check, a rank's
  // non-finite gradient, then the report and the policy.
  const step_report& complete_step() {
    in_step_ = false;
    merge_stats();
    buckets_.merge_report(plan_, schedule_, report_);
    // A collective that dropped the control values would leave the ranks deciding on
    // local numbers (and a failing rank alone): refuse rather than diverge.
    if (!plane_.control().empty() && !plane_.control().has_sums())
      throw error(status::invalid_argument,
                  "trainer::step: the collective did not carry the step's control values (see step_control.hpp)",
                  comm_.rank());
    guard_.after_collectives(plane_, layout_, comm_.rank(), buckets_.size(),
                             [this](std::size_t n) { return_sent_buckets(n); });
    observe_step();
    return finish_step();
  }

  // Checks the buffer, lets the policy plan the step and starts the report.
  void begin_report(grad_view<memory_space> grads) {
    // The message is built only on failure: the hot path allocates nothing.
    if (grads.size() != layout_.numel())
      throw error(status::invalid_argument, "trainer::step: gradient buffer has " + std::to_string(grads.size()) +
                                                " elements, the layout " + std::to_string(layout_.numel()));
    params_.step = step_;
    params_.collect_norms = P::needs_statistics;  // before plan(): a policy that reads no norms may clear it
    policy_.plan(params_);
    if constexpr (detail::PlansSettings<P, decltype(settings_)>) policy_.plan_settings(settings_);
    if (options_.check_consistency) {
      std::uint64_t h = detail::hash_step_params(params_);
      if constexpr (detail::HasStepSettings<C>) h = detail::hash_step_settings(settings_, h);
      consistency_.check(comm_, h, step_);
    }
    report_.step = step_;
    const auto now = std::chrono::steady_clock::now();
    // No previous return yet (first step, or first after a checkpoint restore): 0, not "since boot".
    report_.iteration_s =
        last_return_ != decltype(last_return_){} ? std::chrono::duration<double>(now - last_return_).count() : 0.0;
    report_.skipped = false;
    report_.previous_times_agreed = false;
    report_.modeled_communicate_s = report_.modeled_exposed_s = report_.exposed_communicate_s = 0;
  }

  // Host memory: the non-finite flag, the statistics a policy needs (with the previous
  // step's times) and the values it asked to agree on ride in the step's collective.
  void prepare_control() {
    if constexpr (memory_space::host_accessible) {
      std::span<const double> agree;
      if constexpr (requires(const P& p) { p.agreement_request(); }) agree = policy_.agreement_request();
      plane_.prepare(decltype(guard_)::flag_rides(options_.on_non_finite), P::needs_statistics, layout_.size(),
                     params_.gain_candidates.size(), agree);
    } else {
      plane_.prepare_none();
    }
  }

  // ready(): checks the call before anything is recorded (a refused call changes nothing).
  void check_ready(std::size_t layer_index) const {
    require(in_step_ && async_, "trainer::ready: no asynchronous step in progress (call begin_step first)");
    schedule_.check_ready(layout_, layer_index);
  }
  // ready(), after the layer's event (device) is recorded: marks the layer and lets the
  // buckets that are complete start (the worker's mutex orders the record before the
  // communication thread's wait for it).
  void mark_ready(std::size_t layer_index, double ready_s, bool given) {
    const std::size_t released = schedule_.mark_ready(layer_index, plan_.bucket_of(layer_index), ready_s, given);
    if (guard_.sends_before_finish()) worker_->release(released);
  }

  // The compressor whose stream orders work over the whole gradient (every bucket's
  // compressor has the same options, so the same stream).
  C& first_compressor() noexcept { return buckets_[0].compressor; }

  // What the non-finite screening reads now.
  detail::screened_step<memory_space> screened() noexcept {
    return {&layout_, grads_, residual_.data(), residual_zero_};
  }

  // The first \p count buckets give what they sent back to their residuals.
  void return_sent_buckets(std::size_t count) {
    if (count == 0) return;
    buckets_.return_sent(count);
    residual_zero_ = false;
  }

  // The communication thread's bucket: on a device the step's device is made current
  // there first (a thread starts on device 0).
  void run_bucket_on_worker(std::size_t b) {
    events_.enter_thread();
    run_bucket(b);
  }

  // One bucket: screened for non-finite values, seen by a policy that accumulates the
  // gradient, then compressed, exchanged and decompressed by its collective, which carries
  // the step's control values when it is the last bucket: every other bucket's statistics
  // travel down with it, and its seal() adds its own once it has compressed. In the
  // asynchronous step on a device its compressor stream first waits for its layers'
  // events, so no host thread waits for backward.
  void run_bucket(std::size_t b) {
    auto& s = buckets_[b];
    const bucket& bk = plan_[b];
    const grad_view<memory_space> g(grads_.data() + bk.offset, bk.numel);
    const grad_view<memory_space> e(residual_.data() + bk.offset, bk.numel);
    if (async_) {
      events_.wait(s.compressor, bk.first_layer, bk.last_layer);
      guard_.before_bucket(s.compressor, screened(), b, bk, comm_, [this](std::size_t n) { return_sent_buckets(n); });
    }
    guard_.screen_bucket(s.compressor, screened(), bk, g, plane_, comm_.rank());
    if constexpr (requires(P & p, std::span<const float> x) { p.accumulate(x, std::size_t{}, std::size_t{}); }) {
      if constexpr (memory_space::host_accessible)
        policy_.accumulate(std::span<const float>(grads_.span()), bk.first_layer, bk.last_layer);
    } else if constexpr (requires(P & p, std::span<const float> x) { p.accumulate(x); }) {
      static_assert(sizeof(P) == 0, "a policy that accumulates the gradient must take a layer range");
    }
    const bool carries_control = b + 1 == buckets_.size() && !plane_.control().empty();
    if (carries_control && plane_.carries_statistics())
      buckets_.merge_stats(plan_, layout_.size(), plane_.hand_down(layout_, bk.first_layer), b);
    s.buffers = step_buffers<memory_space>{g, e, residual_zero_, carries_control ? &plane_.control() : nullptr};
    const double modeled_before = comm_.modeled_seconds();
    s.report.wire_bytes_sent = s.report.wire_bytes_received = 0;  // a collective that counts them sets them
    s.collective.aggregate(s.compressor, comm_, s.buffers, s.params, s.stats, s.report);
    s.modeled_s = comm_.modeled_seconds() - modeled_before;
  }

  void merge_stats() { buckets_.merge_stats(plan_, layout_.size(), stats_); }

  // The report from the compressor's statistics, their rank averages where the policy
  // needs them, the values the policy asked to agree on, then the policy observes.
  void observe_step() {
    residual_zero_ = params_.all_dense();
    detail::step_statistics::local(stats_, layout_, params_.gain_candidates, report_);
    if constexpr (requires(const P& p) {
                    { p.fallback() } -> std::convertible_to<fallback_reason>;
                  })
      report_.fallback = policy_.fallback();
    else
      report_.fallback = fallback_reason::none;
    if constexpr (P::needs_statistics) plane_.average(stats_, layout_, comm_, report_);
    if constexpr (requires(P & p, std::span<const double> s) { p.agreed(s); }) {
      const std::span<const double> agreed = plane_.agreed(policy_.agreement_request(), comm_);
      if (!agreed.empty()) policy_.agreed(agreed);
    }
    policy_.observe(report_);
  }

  // Ends a step that ran (or was skipped by every rank): the counter advances.
  const step_report& finish_step() {
    ++step_;
    last_return_ = std::chrono::steady_clock::now();
    return report_;
  }

  communicator_ref<memory_space> comm_;
  layout layout_;
  options options_;
  bucket_plan plan_;
  P policy_;
  typename storage_for<memory_space>::type residual_;
  bool residual_zero_ = true;
  detail::non_finite_guard<memory_space> guard_;                     // the non-finite protocol
  detail::step_buckets<C, K> buckets_;                               // built from plan_
  detail::step_statistics plane_;                                    // the control plane
  detail::async_schedule schedule_;                                  // ready layers, releasable buckets
  [[no_unique_address]] detail::layer_events<memory_space> events_;  // device: one CUDA event per layer
  step_params params_;
  [[no_unique_address]] detail::step_settings_for<C> settings_;  // the compressor's, for the whole layout
  compress_stats stats_;
  step_report report_;
  grad_view<memory_space> grads_{};  // the gradient of the step in flight
  detail::consistency_checker consistency_;
  std::uint64_t step_ = 0;
  std::chrono::steady_clock::time_point last_return_{};
  bool in_step_ = false;
  bool async_ = false;
  // Last: its destructor joins the communication thread before anything it uses goes.
  std::unique_ptr<detail::bucket_worker<trainer>> worker_;
};

}  // namespace gravac
