#pragma once
//! \file trainer.hpp
//! \brief trainer<C, K, P>: composes a Compressor, a Collective and a Policy, owns the
//! residuals and workspaces, and runs one data-parallel step.

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "gravac/bucket_plan.hpp"
#include "gravac/collective/step_buffers.hpp"
#include "gravac/collective/step_control.hpp"
#include "gravac/comm/communicator_ref.hpp"
#include "gravac/concepts.hpp"
#include "gravac/detail/bucket_worker.hpp"
#include "gravac/detail/composition_checks.hpp"
#include "gravac/detail/consistency.hpp"
#include "gravac/detail/layer_events.hpp"
#include "gravac/detail/non_finite_ops.hpp"
#include "gravac/error.hpp"

namespace gravac {

//! What the trainer does when u = g + e (the gradient plus the error-feedback residual, as
//! every compressor computes it) holds NaN or infinity: a non-finite gradient, or a finite
//! one whose sum with the residual overflows the float range.
enum class non_finite_action : std::uint8_t {
  //! throw gravac::error on every rank, naming the layer (the failing rank) or the failing
  //! rank (the others). The flag rides in the step's collective, so the others learn of it
  //! after sending: each gives what it sent back to its residual (it then holds u = g + e);
  //! the failing rank's residual is unchanged. The step counter does not advance. On
  //! device memory (no control plane rides in the device collectives) every rank screens
  //! its whole u before anything is sent and one small Allreduce decides: every residual
  //! is then unchanged. The asynchronous device step decides so per bucket, before each is
  //! sent: the buckets sent before give back what they sent, as on the host.
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
    //! Target bucket size in bytes of float gradient (bucket_plan.hpp): one_bucket for a
    //! single bucket (the step of a release without buckets), bucket_per_layer for one per
    //! layer. A compressor that selects over the whole buffer selects per bucket.
    std::size_t bucket_bytes = default_bucket_bytes;
  };

  //! A trainer over communicator \p comm (which must outlive it) for the tensors of \p lay.
  //! Rejects invalid options (each part validates its own) and, when verify_layout is set,
  //! fails on every rank if any rank's layout differs.
  template <class M, bool = detail::check_communicator<M, C>()>
  trainer(M& comm, const layout& lay, const options& opt = {})
      : comm_(comm), layout_(lay), options_(opt), plan_(checked_plan(lay, opt)), policy_(lay, opt.policy) {
    if (opt.verify_layout) verify_layout_across_ranks();
    residual_ = typename storage_for<memory_space>::type(lay.numel());
    for (std::size_t b = 0; b < plan_.size(); ++b) {
      buckets_.push_back(std::make_unique<bucket_state>(plan_[b].layers, opt));
      buckets_.back()->collective.prepare(buckets_.back()->compressor);
    }
    params_.kept_fraction.assign(lay.size(), dense_fraction);
    params_.bin_length.assign(lay.size(), 0);
    params_.ranks = comm_.size();
    params_.seed = opt.seed;
    report_.kept_fraction.assign(lay.size(), 0.0);
    report_.layer_grad_norm.assign(lay.size(), 0.0);
    report_.buckets = plan_.size();
    stats_.reset(lay.size(), 0);
    layer_ready_.assign(lay.size(), false);
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
  //! in the calling thread.
  //!
  //! On host memory the step makes no collective besides the gradient's own: the
  //! non-finite flag, the statistics a policy needs and the values it asked to agree on
  //! ride in that collective (step_control.hpp; in the last bucket's when there are
  //! several). Exceptions: `on_non_finite = skip_step` agrees on the flag by one small
  //! allreduce before anything is sent (a skipped step must leave every residual
  //! untouched, so the ranks must know before compressing), and the `check_consistency`
  //! debug option adds its own check. On device memory `throw_error` takes that small
  //! allreduce too (the device collectives carry no control values).
  //!
  //! On a device, \p grads must be produced on the calling thread's default stream (its
  //! per-thread default stream, or the legacy default stream, which that stream follows) or
  //! be complete: every bucket's compressor stream first waits for one CUDA event recorded
  //! on cudaStreamPerThread here (no host wait), so compressors on streams of their own
  //! (gravac::cuda_stream) read \p grads only after the caller's kernels wrote it. A
  //! gradient produced on another stream must be synchronized (or ordered before the
  //! calling thread's default stream) by the caller.
  const step_report& step(grad_view<memory_space> grads) {
    start_step(grads, false);
    const auto t0 = std::chrono::steady_clock::now();
    try {
      order_buckets_after_caller();
      if (skip_agreed_before_sending()) {
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

  //! Starts an asynchronous step on the flat gradient buffer \p grads (host or device
  //! memory), which backward is about to fill: the policy plans the step (its decisions
  //! are fixed from here on, so every rank agrees without a collective) and the
  //! communication thread waits for buckets. Until finish(), the caller must not touch a
  //! layer after marking it ready(), and \p grads must outlive the step: the communication
  //! thread may still be writing it until finish() returns or the trainer is destroyed
  //! (declare the gradient buffer before the trainer, so an exception in backward destroys
  //! the trainer first).
  //!
  //! The communication thread calls the communicator while the caller computes, and
  //! during the step only it does (the caller's thread calls it before the first bucket
  //! and after the last, never beside it): an MPI engine needs MPI initialised with
  //! MPI_THREAD_SERIALIZED or more (checked here); NCCL allows a communicator to be used
  //! from another thread one call at a time, which is what this is. On a device the
  //! device current here is made current in the communication thread for every bucket.
  void begin_step(grad_view<memory_space> grads) {
    if (!comm_.accepts_calls_from_other_threads())
      throw error(status::invalid_argument,
                  "trainer::begin_step: the communicator may not be called from the communication thread (an MPI "
                  "engine needs MPI_Init_thread with MPI_THREAD_SERIALIZED or MPI_THREAD_MULTIPLE); use step() or "
                  "initialise MPI with a thread level",
                  comm_.rank());
    if (!worker_) worker_ = std::make_unique<detail::bucket_worker>(&trainer::run_bucket_on_worker, this);
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
    step_began_ = std::chrono::steady_clock::now();
  }

  //! Marks layer \p layer_index final (backward has produced it); a bucket's compression
  //! and collective start once all its layers are ready and the buckets before it have
  //! started. Its ready time on the modeled timeline is the wall time since begin_step().
  //! On a device the layer is final once the work queued so far on the calling thread's
  //! per-thread default stream (cudaStreamPerThread) is: that stream runs after the work
  //! queued before on the legacy default stream, so a backward on either default stream of
  //! this thread is covered, but it does not wait for other threads' streams (nor for the
  //! communication thread's buckets in flight). Pass the stream backward ran on when it is
  //! any other one (ready(layer, stream)).
  void ready(std::size_t layer_index) {
    check_ready(layer_index);
    events_.record_default(layer_index);
    mark_ready_and_release(layer_index, detail::seconds_since(step_began_), false);
  }

  // clang-format off
  //! Device memory: layer \p layer_index is final once the work queued so far on
  //! \p stream (a cudaStream_t or a stream_ref, the stream the caller's backward produced
  //! it on) is. Records the layer's CUDA event on \p stream and returns at once; the
  //! bucket's compression waits for that event on the device, not in any host thread.
  template <class Stream>
    requires(detail::layer_events<memory_space>::template accepts_stream<Stream>)
  void ready(std::size_t layer_index, Stream stream) {
    check_ready(layer_index);
    events_.record(layer_index, stream);
    mark_ready_and_release(layer_index, detail::seconds_since(step_began_), false);
  }
  // clang-format on

  //! ready() with the layer's time on the modeled timeline given: \p ready_s seconds of
  //! (modeled or measured) backward since begin_step(); backward then ends at the last time
  //! given (finish() marks the layers left at that time). Communication hides behind
  //! backward on that timeline (step_report::modeled_exposed_s). On a device the layer's
  //! stream is the calling thread's per-thread default stream, as for ready(layer).
  void ready(std::size_t layer_index, double ready_s) {
    check_ready(layer_index);
    events_.record_default(layer_index);
    mark_ready_and_release(layer_index, ready_s, true);
  }

  //! Ends the asynchronous step: marks every layer not yet ready (backward has ended; on a
  //! device such a layer is final after the work queued so far on the calling thread's
  //! per-thread default stream, as for ready(layer)), waits for every bucket's collective
  //! and returns the step's report. A failure in a bucket (a peer's malformed packet, a
  //! failed rank, a non-finite gradient) is thrown here; the step is then abandoned (the
  //! step counter does not advance). On a device every bucket's kernels and copies have
  //! completed when it returns, as after step().
  //!
  //! With `on_non_finite = skip_step` nothing is sent before finish(): the ranks must agree
  //! to skip before any residual changes, so that mode forgoes the overlap. On device
  //! memory `throw_error` (the default) agrees per bucket instead, just before the bucket
  //! is sent (the device collectives carry no flag): when a rank finds a non-finite value
  //! every rank throws there, the buckets already sent give what they sent back to the
  //! residual and the others are left as they were.
  const step_report& finish() {
    require(in_step_ && async_, "trainer::finish: no asynchronous step in progress (call begin_step first)");
    // Backward ends now, or, on a timeline the caller gave, at its last ready time.
    const double backward_s = given_times_ ? backward_end_s_ : detail::seconds_since(step_began_);
    for (std::size_t i = layout_.size(); i-- > 0;) {
      if (layer_ready_[i]) continue;
      events_.record_default(i);
      mark_ready(i, backward_s);
    }
    backward_end_s_ = std::max(backward_end_s_, backward_s);
    const auto t0 = std::chrono::steady_clock::now();
    try {
      // The whole-gradient screening below runs on this thread's compressor stream: after
      // every layer's event (only when nothing was sent yet, so no bucket runs beside it).
      if (!sends_before_finish()) events_.wait(first_compressor(), 0, layout_.size());
      if (skip_agreed_before_sending()) {
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
  //! Destroying a trainer between begin_step() and finish() (an exception in backward)
  //! abandons the step: the other ranks are or will be in its collectives, which can never
  //! complete, so the communicator is told (communicator_ref::abandon: a thread team is
  //! aborted with a message naming this rank, an MPI job ends) rather than leave them waiting.
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
  // clang-format on
  // clang-format off
  //! Mutable residual, for checkpoint restore (host memory spaces).
  [[nodiscard]] std::span<float> residual() noexcept
    requires memory_space::host_accessible
  {
    residual_zero_ = false;  // the caller may write through it (checkpoint restore)
    return {residual_.data(), residual_.size()};
  }
  // clang-format on
  //! Appends the trainer's own state between steps to \p out (checkpoint.hpp): this
  //! rank's times of the last step, which ride in the next step's collective for a policy
  //! that needs statistics. Restored by load_step_state, so that a resumed run sends and
  //! decides what an uninterrupted one does.
  void save_step_state(std::vector<std::byte>& out) const {
    const double v[5] = {has_pending_times_ ? 1.0 : 0.0, pending_times_.compress_s, pending_times_.communicate_s,
                         pending_times_.decompress_s, pending_times_.iteration_s};
    const auto* b = reinterpret_cast<const std::byte*>(v);
    out.insert(out.end(), b, b + sizeof v);
  }
  //! Restores what save_step_state wrote; an empty \p in (a checkpoint without it) means
  //! no times are pending. Throws gravac::error for any other length.
  void load_step_state(std::span<const std::byte> in) {
    if (in.empty()) {
      has_pending_times_ = false;
      return;
    }
    double v[5];
    require(in.size() == sizeof v, "trainer::load_step_state: the step state has " + std::to_string(in.size()) +
                                       " bytes, not " + std::to_string(sizeof v));
    std::memcpy(v, in.data(), sizeof v);
    for (double x : v) require(std::isfinite(x), "trainer::load_step_state: a time is not finite");
    has_pending_times_ = v[0] != 0.0;
    pending_times_ = {v[1], v[2], v[3], v[4]};
  }
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
  [[nodiscard]] C& compressor(std::size_t b = 0) { return buckets_.at(b)->compressor; }
  //! The compressor of bucket \p b.
  [[nodiscard]] const C& compressor(std::size_t b = 0) const { return buckets_.at(b)->compressor; }
  //! The collective of bucket \p b.
  [[nodiscard]] K& collective(std::size_t b = 0) { return buckets_.at(b)->collective; }
  //! The collective of bucket \p b.
  [[nodiscard]] const K& collective(std::size_t b = 0) const { return buckets_.at(b)->collective; }
  //! The policy.
  [[nodiscard]] P& policy() noexcept { return policy_; }
  //! The last step's report.
  [[nodiscard]] const step_report& last_report() const noexcept { return report_; }
  //! The parameters the policy chose for the last step.
  [[nodiscard]] const step_params& last_params() const noexcept { return params_; }
  //! The communicator.
  [[nodiscard]] communicator_ref<memory_space>& communicator() noexcept { return comm_; }

 private:
  // One bucket's compressor and collective (over the bucket's own layout), the slice of
  // the step's parameters they see, and what they report.
  struct bucket_state {
    bucket_state(const layout& lay, const options& opt)
        : compressor(lay, opt.compressor), collective(lay, opt.collective) {}
    C compressor;
    K collective;
    step_params params;
    compress_stats stats;
    step_report report;
    step_buffers<memory_space> buffers{};
    std::size_t pending = 0;  // layers not yet ready this step
    double ready_s = 0;       // when its last layer was ready, seconds since the step began
    double modeled_s = 0;     // seconds the network model charged for its messages
  };

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

  static constexpr std::size_t no_slot = step_control::no_slot;

  // The start of every step, synchronous or not: the buffer is checked, the policy plans
  // the step (its decisions are fixed from here on), the buckets get their slices of the
  // parameters and the control slots are laid out.
  void start_step(grad_view<memory_space> grads, bool async) {
    require(!in_step_, "trainer: a step is already in progress (call finish() first)");
    begin_report(grads);
    for (std::size_t b = 0; b < buckets_.size(); ++b) slice_params(b);
    bad_layer_ = -1;
    bad_is_overflow_ = false;
    prepare_control();
    grads_ = grads;
    for (std::size_t b = 0; b < buckets_.size(); ++b) {
      auto& s = *buckets_[b];
      s.pending = plan_[b].last_layer - plan_[b].first_layer;
      s.ready_s = s.modeled_s = 0;
    }
    std::fill(layer_ready_.begin(), layer_ready_.end(), false);
    released_ = 0;
    backward_end_s_ = 0;
    given_times_ = false;
    async_ = async;
    in_step_ = true;
  }

  // The end of a step whose buckets all ran: the control values' check, a rank's
  // non-finite gradient, then the report and the policy.
  const step_report& complete_step() {
    in_step_ = false;
    merge_buckets();
    // A collective that dropped the control values would leave the ranks deciding on
    // local numbers (and a failing rank alone): refuse rather than diverge.
    if (!control_.empty() && !control_.has_sums())
      throw error(status::invalid_argument,
                  "trainer::step: the collective did not carry the step's control values (see step_control.hpp)",
                  comm_.rank());
    if (flag_slot_ != no_slot) throw_if_flagged();
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
    report_.modeled_communicate_s = report_.modeled_exposed_s = report_.exposed_communicate_s = 0;
  }

  // Bucket b's view of the step's parameters: the per-layer decisions of its layers.
  void slice_params(std::size_t b) {
    step_params& q = buckets_[b]->params;
    q = params_;  // reuses q's memory after the first step
    if (buckets_.size() == 1) return;
    const auto first = static_cast<std::ptrdiff_t>(plan_[b].first_layer);
    const auto last = static_cast<std::ptrdiff_t>(plan_[b].last_layer);
    const auto slice = [&](const auto& all, auto& part) {
      if (all.size() == layout_.size()) part.assign(all.begin() + first, all.begin() + last);
    };
    slice(params_.kept_fraction, q.kept_fraction);
    slice(params_.bin_length, q.bin_length);
    slice(params_.approximation_rank, q.approximation_rank);
  }

  // ready(): checks the call before anything is recorded (a refused call changes nothing).
  void check_ready(std::size_t layer_index) const {
    require(in_step_ && async_, "trainer::ready: no asynchronous step in progress (call begin_step first)");
    require(layer_index < layout_.size(), "trainer::ready: layer " + std::to_string(layer_index) +
                                              " is outside the layout (" + std::to_string(layout_.size()) + " layers)");
    require(!layer_ready_[layer_index],
            "trainer::ready: layer '" + layout_[layer_index].name + "' was already marked ready this step");
  }
  // ready(), after the layer's event (device) is recorded: marks the layer and lets the
  // buckets that are complete start (the worker's mutex orders the record before the
  // communication thread's wait for it).
  void mark_ready_and_release(std::size_t layer_index, double ready_s, bool given) {
    given_times_ = given_times_ || given;
    mark_ready(layer_index, ready_s);
    if (sends_before_finish()) worker_->release(released_);
  }

  // Whether the asynchronous step may send buckets before finish(): not when the ranks
  // must first agree on the whole gradient's non-finite values (skip_step), as the
  // synchronous step does before its first bucket.
  [[nodiscard]] bool sends_before_finish() const noexcept {
    return options_.on_non_finite != non_finite_action::skip_step;
  }

  // Marks layer i ready at ready_s; the buckets whose layers are all ready, in order from
  // bucket 0, may start.
  void mark_ready(std::size_t i, double ready_s) {
    layer_ready_[i] = true;
    auto& s = *buckets_[plan_.bucket_of(i)];
    if (--s.pending == 0) s.ready_s = ready_s;
    backward_end_s_ = std::max(backward_end_s_, ready_s);
    while (released_ < buckets_.size() && buckets_[released_]->pending == 0) ++released_;
  }

  // skip_step: every rank screens its whole gradient and one allreduce of the flag decides
  // before anything is sent. Returns true when every rank skips the step. On device
  // memory throw_error is decided here too (throw_if_non_finite_before_sending).
  bool skip_agreed_before_sending() {
    if constexpr (!memory_space::host_accessible) {
      if (options_.on_non_finite == non_finite_action::throw_error) {
        if (!async_) throw_if_non_finite_before_sending();  // the asynchronous step agrees per bucket
        return false;
      }
    }
    if (options_.on_non_finite != non_finite_action::skip_step) return false;
    bad_layer_ = scan_non_finite(first_compressor(), 0, layout_.size());
    return skip_agreed(bad_layer_);
  }

  // The synchronous step on a device: the compressors' stream (every bucket's compressor
  // has the same options, so the same stream; see first_compressor) waits for one event
  // recorded on the calling thread's per-thread default stream, which produced g (or
  // follows the legacy stream that did), before its first kernel. No host wait; nothing on
  // the host. (The asynchronous step orders each bucket after its layers' events instead.)
  void order_buckets_after_caller() {
    events_.record_step();
    events_.wait_step(first_compressor());
  }

  // The compressor whose stream orders a screening of the whole gradient (every bucket's
  // compressor has the same options, so the same stream).
  C& first_compressor() noexcept { return buckets_.front()->compressor; }

  // Device memory, throw_error: the device collectives carry no control plane, so the flag
  // cannot ride in the last bucket's collective as on the host. Every rank screens its
  // whole u before anything is sent and one allreduce of two host doubles (failing ranks,
  // the sum of their rank + 1) decides. Its cost, every step: one kernel over g and e, one
  // copy of a flag per layer back, one wait for the stream and that small allreduce. When
  // any rank failed, every rank throws as the host does (naming its layer, or the failing
  // rank) with nothing sent: gradients, residuals and step counter are as before the step
  // (on the host a rank's gradient then holds what its collective left there). The
  // asynchronous step decides per bucket instead (throw_if_non_finite_before_sending_bucket).
  void throw_if_non_finite_before_sending() {
    bad_layer_ = scan_non_finite(first_compressor(), 0, layout_.size());
    agree_non_finite(bad_layer_ >= 0, 0);
  }

  // Device memory: one allreduce of two host doubles (the failing ranks, the sum of their
  // rank + 1) tells every rank whether any found a non-finite value; if one did, the first
  // \p sent buckets give back what they sent and every rank throws.
  void agree_non_finite(bool bad, std::size_t sent) {
    double flag[2] = {bad ? 1.0 : 0.0, bad ? comm_.rank() + 1.0 : 0.0};
    comm_.allreduce_sum(std::span<double>(flag, 2));
    if (flag[0] == 0) return;
    return_sent_buckets(sent);
    throw_non_finite(flag[0], flag[1]);
  }

  // The first \p count buckets give what they sent back to their residuals (collectives
  // with return_sent; the others had nothing to give back).
  void return_sent_buckets(std::size_t count) {
    if (count == 0) return;
    if constexpr (requires(K & k, C & c, step_buffers<memory_space> & sb) { k.return_sent(c, sb); }) {
      for (std::size_t b = 0; b < count; ++b)
        buckets_[b]->collective.return_sent(buckets_[b]->compressor, buckets_[b]->buffers);
    }
    residual_zero_ = false;
  }

  // Device memory, throw_error, asynchronous step: the whole gradient is not there before
  // the first bucket, so the agreement of throw_if_non_finite_before_sending runs per
  // bucket, on the communication thread just before the bucket is sent: this rank screens
  // the bucket's u and one allreduce of two host doubles decides. When any rank failed,
  // the buckets already sent give what they sent back to their residuals (which then hold
  // u = g + e there, as on the host) and every rank throws, naming its layer or the
  // failing rank; the bucket and the later ones are left as they were (nothing of them
  // was sent). Its cost per bucket: one kernel over the bucket's g and e, one copy back,
  // one wait for the compressor's stream and that small allreduce, none of it in the
  // caller's thread. A step without non-finite values gives step()'s bits.
  void throw_if_non_finite_before_sending_bucket(std::size_t b) {
    if constexpr (!memory_space::host_accessible) {
      if (options_.on_non_finite != non_finite_action::throw_error) return;
      const bucket& bk = plan_[b];
      const long bad = scan_non_finite(buckets_[b]->compressor, bk.first_layer, bk.last_layer);
      if (bad >= 0 && bad_layer_ < 0) bad_layer_ = bad;
      agree_non_finite(bad >= 0, b);
    } else {
      (void)b;
    }
  }

  // The communication thread's bucket: on a device the step's device is made current
  // there first (a thread starts on device 0).
  static void run_bucket_on_worker(void* self, std::size_t b) {
    auto& t = *static_cast<trainer*>(self);
    t.events_.enter_thread();
    t.run_bucket(b);
  }

  // One bucket: its layers are screened for non-finite values (by on_non_finite), a policy
  // that accumulates the gradient sees them, then its collective compresses, exchanges and
  // decompresses them, carrying the step's control values when it is the last bucket (the
  // last to run, so every other bucket's statistics are known when it seals them).
  //
  // In the asynchronous step on a device, the bucket's compressor stream first waits for
  // its layers' events (issued here, in the thread that queues the bucket's kernels next),
  // so the bucket's first kernel runs after backward produced its layers, without a host
  // thread waiting for that. Everything after is the synchronous step's code: the
  // collective waits for the compressor and the communicator on the host (they read
  // counts and sizes), in this (the communication) thread.
  void run_bucket(std::size_t b) {
    bucket_state& s = *buckets_[b];
    const bucket& bk = plan_[b];
    const grad_view<memory_space> g(grads_.data() + bk.offset, bk.numel);
    const grad_view<memory_space> e(residual_.data() + bk.offset, bk.numel);
    if (async_) events_.wait(s.compressor, bk.first_layer, bk.last_layer);
    if (async_) throw_if_non_finite_before_sending_bucket(b);
    screen_bucket(s, bk, g);
    if constexpr (requires(P & p, std::span<const float> x) { p.accumulate(x, std::size_t{}, std::size_t{}); }) {
      if constexpr (memory_space::host_accessible)
        policy_.accumulate(std::span<const float>(grads_.span()), bk.first_layer, bk.last_layer);
    } else if constexpr (requires(P & p, std::span<const float> x) { p.accumulate(x); }) {
      static_assert(sizeof(P) == 0, "a policy that accumulates the gradient must take a layer range");
    }
    const bool carries_control = b + 1 == buckets_.size() && !control_.empty();
    s.buffers = step_buffers<memory_space>{g, e, residual_zero_, carries_control ? &control_ : nullptr};
    const double modeled_before = comm_.modeled_seconds();
    s.report.wire_bytes_sent = s.report.wire_bytes_received = 0;  // a collective that counts them sets them
    s.collective.aggregate(s.compressor, comm_, s.buffers, s.params, s.stats, s.report);
    s.modeled_s = comm_.modeled_seconds() - modeled_before;
  }

  // Non-finite values in bucket bk's u = g + e, handled by on_non_finite (skip_step was
  // decided before anything was sent). The first bad layer is remembered; under
  // throw_error this rank leaves that bucket and every later one out (zeroed): its flag
  // rides in the last bucket's collective, and what it already sent of the earlier ones
  // goes back to its residual when every rank throws.
  //
  // On device memory throw_error was decided before anything was sent too, and zero_values
  // zeroes without a scan: its kernel leaves finite values as they are, and a scan would
  // cost a wait for the stream per bucket.
  void screen_bucket(bucket_state& s, const bucket& bk, grad_view<memory_space> g) {
    const auto action = options_.on_non_finite;
    if (action == non_finite_action::ignore || action == non_finite_action::skip_step) return;
    if constexpr (!memory_space::host_accessible) {
      if (action == non_finite_action::zero_values) zero_non_finite(s.compressor, bk);
      return;
    }
    if (bad_layer_ < 0) {
      const long bad = scan_non_finite(s.compressor, bk.first_layer, bk.last_layer);
      if (bad < 0) return;
      bad_layer_ = bad;
      if (action == non_finite_action::throw_error && flag_slot_ != no_slot) {
        control_.local(flag_slot_) = 1.0f;
        control_.local(flag_slot_ + 1) = static_cast<float>(comm_.rank() + 1);
      }
    } else if (action == non_finite_action::zero_values &&
               scan_non_finite(s.compressor, bk.first_layer, bk.last_layer) < 0) {
      return;
    }
    if (action == non_finite_action::zero_values) zero_non_finite(s.compressor, bk);
    if (action == non_finite_action::throw_error) zero_all(s.compressor, g);
  }

  // The step's statistics and report from its buckets': per-layer statistics in layout
  // order, gain-curve energies, bytes and times summed, the modeled timeline.
  void merge_stats() {
    std::size_t candidates = 0;
    for (const auto& s : buckets_) candidates = std::max(candidates, s->stats.candidate_kept_sq.size());
    stats_.reset(layout_.size(), candidates);
    for (std::size_t b = 0; b < buckets_.size(); ++b) {
      const compress_stats& st = buckets_[b]->stats;
      for (std::size_t i = 0; i < st.layers.size(); ++i) stats_.layers[plan_[b].first_layer + i] = st.layers[i];
      for (std::size_t c = 0; c < st.candidate_kept_sq.size(); ++c)
        stats_.candidate_kept_sq[c] += st.candidate_kept_sq[c];
      stats_.non_finite = stats_.non_finite || st.non_finite;
    }
  }
  void merge_buckets() {
    merge_stats();
    report_.compress_s = report_.communicate_s = report_.decompress_s = 0;
    report_.bytes_sent = 0;
    report_.wire_bytes_sent = report_.wire_bytes_received = 0;
    std::size_t largest = 0;
    double timeline = 0;
    for (std::size_t b = 0; b < buckets_.size(); ++b) {
      const bucket_state& s = *buckets_[b];
      report_.compress_s += s.report.compress_s;
      report_.communicate_s += s.report.communicate_s;
      report_.decompress_s += s.report.decompress_s;
      report_.bytes_sent += s.report.bytes_sent;
      report_.wire_bytes_sent += s.report.wire_bytes_sent;
      report_.wire_bytes_received += s.report.wire_bytes_received;
      report_.modeled_communicate_s += s.modeled_s;
      timeline = std::max(timeline, s.ready_s) + s.modeled_s;
      if (plan_[b].numel > plan_[largest].numel) largest = b;
    }
    report_.collective = buckets_[largest]->report.collective;
    report_.modeled_exposed_s = std::max(0.0, timeline - backward_end_s_);
    report_.buckets = buckets_.size();
  }

  // The report from the compressor's statistics, their rank averages where the policy
  // needs them, the values the policy asked to agree on, then the policy observes.
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

  // The first layer in [first, last) where this rank's u = g + e holds NaN or infinity,
  // or -1 (also when the check is off), found by the memory space's non_finite_ops on
  // compressor c's stream. u is what every compressor computes, in float and in the same
  // order, so a gradient finite by itself whose sum with the residual leaves the float
  // range is caught too; bad_is_overflow_ then says g itself was finite in that layer. A
  // residual known to be zero is not read (u = g).
  long scan_non_finite(const C& c, std::size_t first, std::size_t last) {
    if (options_.on_non_finite == non_finite_action::ignore) return -1;
    const detail::non_finite_scan found = non_finite_.first_non_finite(
        c, layout_, first, last, grads_.data(), residual_.data(), residual_zero_, bad_layer_ < 0);
    if (found.layer >= 0 && bad_layer_ < 0) bad_is_overflow_ = found.overflow;
    return found.layer;
  }
  // zero_values: g is zeroed wherever u = g + e is not finite (a non-finite g, or a sum that
  // overflows), so u there is the residual alone and the step goes on.
  void zero_non_finite(const C& c, const bucket& bk) {
    non_finite_.zero_non_finite(c, grads_.data() + bk.offset, residual_.data() + bk.offset, bk.numel, residual_zero_);
  }
  void zero_all(const C& c, grad_view<memory_space> g) { non_finite_.zero_all(c, g.data(), g.size()); }

  // skip_step: one allreduce of a flag, so that every rank skips together before anything
  // touches a residual. Returns true when the step is skipped.
  bool skip_agreed(long bad_layer) {
    double flag = bad_layer >= 0 ? comm_.rank() + 1.0 : 0.0;
    comm_.allreduce_max(std::span<double>(&flag, 1));
    if (flag == 0) return false;
    zero_all(first_compressor(), grads_);
    report_.skipped = true;
    report_.bytes_sent = 0;
    report_.wire_bytes_sent = report_.wire_bytes_received = 0;
    return true;
  }

  // Slots of this step's control plane (host memory only): the non-finite flag (count of
  // failing ranks, sum of their rank + 1; set when a bucket finds one), the statistics a
  // policy needs, and the values the policy asked to agree on. The collective may add
  // slots of its own.
  void prepare_control() {
    control_.clear();
    flag_slot_ = stats_slot_ = agree_slot_ = times_slot_ = no_slot;
    agree_count_ = 0;
    if constexpr (memory_space::host_accessible) {
      if (options_.on_non_finite == non_finite_action::throw_error) flag_slot_ = control_.reserve(2);
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

  // Runs when the last bucket's collective has compressed (every other bucket has run): this
  // rank's gain, gain curve, layer norms and kept fractions over all buckets go into the
  // statistics slots.
  static void seal_statistics(void* self, const compress_stats&) {
    auto& t = *static_cast<trainer*>(self);
    t.merge_stats();
    const compress_stats& st = t.stats_;
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

  // After the collectives: when any rank flagged a non-finite gradient, every rank gives
  // back what it sent to its residual (so nothing is lost: the residuals hold u = g + e
  // where the rank sent, and the failing rank's buckets from its bad layer on hold their
  // old residual) and throws, naming its own layer or a failing rank. The step counter
  // does not advance.
  void throw_if_flagged() {
    if (!control_.has_sums()) return;
    const float failing = control_.sum(flag_slot_);
    if (failing == 0.0f) return;
    return_sent_buckets(buckets_.size());
    throw_non_finite(control_.sum(flag_slot_), control_.sum(flag_slot_ + 1));
  }

  // Every rank's error for a step where \p failing ranks (the sum of their rank + 1:
  // \p rank_sum) found a non-finite u: a failing rank names its first bad layer (and says
  // when g + e overflowed from finite values), the others the failing rank or their count.
  [[noreturn]] void throw_non_finite(double failing, double rank_sum) {
    std::string where;
    if (bad_layer_ >= 0) {
      where = "layer '" + layout_[static_cast<std::size_t>(bad_layer_)].name + "'";
      if (bad_is_overflow_)
        throw error(status::non_finite,
                    "gradient + residual overflows the float range in " + where +
                        " (the gradient itself is finite; u = g + e is not)",
                    comm_.rank());
    } else if (failing == 1.0) {
      where = "rank " + std::to_string(static_cast<int>(rank_sum) - 1) + "'s gradient";
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
  bucket_plan plan_;
  P policy_;
  std::vector<std::unique_ptr<bucket_state>> buckets_;
  typename storage_for<memory_space>::type residual_;
  bool residual_zero_ = true;
  bool bad_is_overflow_ = false;  // the last screened bad layer had finite g and e, and g + e overflowed
  [[no_unique_address]] detail::non_finite_ops<memory_space> non_finite_;  // the screening kernels on a device
  [[no_unique_address]] detail::layer_events<memory_space> events_;        // device: one CUDA event per layer
  step_params params_;
  compress_stats stats_;
  step_report report_;
  grad_view<memory_space> grads_{};  // the gradient of the step in flight
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
  // The step in flight: which layers are ready, how many buckets may start, whether the
  // asynchronous step runs it, where this rank's first bad layer is.
  std::vector<bool> layer_ready_;
  std::size_t released_ = 0;
  double backward_end_s_ = 0;  // the last ready time: when backward ended
  bool given_times_ = false;   // the caller gave ready times (a modeled timeline), not the wall clock
  bool in_step_ = false;
  bool async_ = false;
  long bad_layer_ = -1;
  std::chrono::steady_clock::time_point step_began_{};
  // Last: its destructor joins the communication thread before anything it uses goes.
  std::unique_ptr<detail::bucket_worker> worker_;
};

}  // namespace gravac
