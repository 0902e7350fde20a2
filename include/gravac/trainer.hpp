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
#include "gravac/comm/communicator_ref.hpp"
#include "gravac/concepts.hpp"
#include "gravac/detail/consistency.hpp"
#include "gravac/error.hpp"

namespace gravac {

//! What the trainer does when a gradient holds NaN or infinity.
enum class non_finite_action : std::uint8_t {
  throw_error,  //!< throw gravac::error naming the layer and the rank (on every rank)
  skip_step,    //!< skip the step on every rank: gradient zeroed, residuals untouched
  zero_values,  //!< replace the offending values by zero and go on
  ignore,       //!< do not check (fastest; the caller guarantees finite gradients)
};

//! Composes compressor \p C, collective \p K and policy \p P.
//!
//! \code
//! gravac::trainer<gravac::topk, gravac::allgather, gravac::fixed_policy> t{comm, lay, {}};
//! for (...) { backward(grads); t.step(grads); optimizer.step(grads); }
//! \endcode
template <Compressor C, Collective K, Policy P>
class trainer {
  static_assert(K::template accepts<C>,
                "gravac::trainer: this collective cannot aggregate this compressor's packets "
                "(allreduce_compatible needs a compressor whose values can be summed at shared indices)");

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
    bool verify_layout = true;         //!< check at construction that every rank has the same layout
    //! Debug: check every step that all ranks planned identical step_params (one allreduce
    //! of a 64-bit hash); a divergence throws gravac::error(diverged) on every rank, naming
    //! the ranks that differ from rank 0.
    bool check_consistency = false;
  };

  //! A trainer over communicator \p comm (which must outlive it) for the tensors of \p lay.
  //! Rejects invalid options (each part validates its own) and, when verify_layout is set,
  //! fails on every rank if any rank's layout differs.
  template <Communicator M>
  trainer(M& comm, const layout& lay, const options& opt = {})
      : comm_(comm),
        layout_(lay),
        options_(opt),
        compressor_(lay, opt.compressor),
        collective_(lay, opt.collective),
        policy_(lay, opt.policy) {
    static_assert(CommunicatorFor<M, C>,
                  "gravac::trainer: the communicator's memory space differs from the compressor's "
                  "(a device-memory compressor needs a communicator that accepts device memory)");
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

  //! Runs one step on host gradients \p grads (the flat buffer of the layout): leaves the
  //! rank-averaged (compressed) gradient in place and returns the step's report.
  const step_report& step(std::span<float> grads)
    requires memory_space::host_accessible
  {
    return step(grad_view<memory_space>(grads));
  }

  //! Runs one step on the flat gradient buffer \p grads.
  const step_report& step(grad_view<memory_space> grads) {
    // The message is built only on failure: the hot path allocates nothing.
    if (grads.size() != layout_.numel())
      throw error(status::invalid_argument, "trainer::step: gradient buffer has " + std::to_string(grads.size()) +
                                                " elements, the layout " + std::to_string(layout_.numel()));
    params_.step = step_;
    policy_.plan(params_);
    if (options_.check_consistency)
      consistency_.check(comm_, detail::hash_step_params(params_), step_);
    params_.collect_norms = P::needs_statistics;
    report_.step = step_;
    const auto now = std::chrono::steady_clock::now();
    // No previous return yet (first step, or first after a checkpoint restore): 0, not "since boot".
    report_.iteration_s = last_return_ != decltype(last_return_){}
                              ? std::chrono::duration<double>(now - last_return_).count()
                              : 0.0;
    report_.skipped = false;
    report_.modeled_communicate_s = 0;

    if (handle_non_finite(grads)) {
      ++step_;
      last_return_ = std::chrono::steady_clock::now();
      return report_;
    }

    step_buffers<memory_space> buf{grads, grad_view<memory_space>(residual_.data(), residual_.size()), residual_zero_};
    const double modeled_before = comm_.modeled_seconds();
    collective_.aggregate(compressor_, comm_, buf, params_, stats_, report_);
    report_.modeled_communicate_s = comm_.modeled_seconds() - modeled_before;
    residual_zero_ = params_.all_dense();
    fill_report();
    if constexpr (P::needs_statistics) synchronize_statistics();
    policy_.observe(report_);
    ++step_;
    last_return_ = std::chrono::steady_clock::now();
    return report_;
  }

  //! Marks the end of an interval (an epoch, or every F steps) for the policy.
  void end_interval(const interval_info& info) { policy_.on_interval(info); }

  //! The error-feedback residual (flat, in layout order, in the compressor's memory space).
  //! The caller may write through it, so the residual is no longer assumed zero.
  [[nodiscard]] grad_view<memory_space> residual_view() noexcept {
    residual_zero_ = false;
    return {residual_.data(), residual_.size()};
  }
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
  // Every rank posts its layout hash; a mismatch fails on all ranks, naming the odd ones.
  void verify_layout_across_ranks() {
    if constexpr (!memory_space::host_accessible) {  // device engines gather into device memory
      verify_layout_by_reduction();
      return;
    }
    const std::uint64_t h = layout_.hash();
    std::vector<std::size_t> sizes;
    typename communicator_ref<memory_space>::byte_buffer all;
    comm_.allgatherv(std::as_bytes(std::span<const std::uint64_t>(&h, 1)), all, sizes);
    std::string odd;
    std::uint64_t h0 = 0;
    for (std::size_t r = 0; r < sizes.size(); ++r) {
      std::uint64_t hr = 0;
      if (sizes[r] == sizeof hr) std::memcpy(&hr, all.data() + r * sizeof hr, sizeof hr);
      if (r == 0) h0 = hr;
      if (hr != h0 || sizes[r] != sizeof hr) odd += (odd.empty() ? "" : ", ") + std::to_string(r);
    }
    if (!odd.empty())
      throw error(status::layout_mismatch, "the layout differs between ranks (ranks " + odd + " differ from rank 0)",
                  comm_.rank());
  }

  // The same check through host-memory reductions only: rank 0's hash (in four exact 16-bit
  // parts) reaches every rank by a sum, then each rank flags itself when it differs.
  void verify_layout_by_reduction() {
    const std::uint64_t h = layout_.hash();
    const auto n = static_cast<std::size_t>(comm_.size());
    std::vector<double> v(4 + n, 0.0);
    for (int i = 0; i < 4; ++i) v[static_cast<std::size_t>(i)] = comm_.rank() == 0 ? double((h >> (16 * i)) & 0xffff) : 0.0;
    comm_.allreduce_sum(std::span<double>(v.data(), 4));
    std::uint64_t h0 = 0;
    for (int i = 0; i < 4; ++i) h0 |= static_cast<std::uint64_t>(v[static_cast<std::size_t>(i)]) << (16 * i);
    v[4 + static_cast<std::size_t>(comm_.rank())] = h0 != h ? 1.0 : 0.0;
    comm_.allreduce_sum(std::span<double>(v.data() + 4, n));
    std::string odd;
    for (std::size_t r = 0; r < n; ++r)
      if (v[4 + r] != 0.0) odd += (odd.empty() ? "" : ", ") + std::to_string(r);
    if (!odd.empty())
      throw error(status::layout_mismatch, "the layout differs between ranks (ranks " + odd + " differ from rank 0)",
                  comm_.rank());
  }

  // Returns true when the step must be skipped. Which layer and rank failed is agreed on
  // by a tiny allreduce so that every rank throws or skips together (never a hang).
  bool handle_non_finite(grad_view<memory_space> grads) {
    if (options_.on_non_finite == non_finite_action::ignore) return false;
    if constexpr (!memory_space::host_accessible) {
      return false;  // device compressors check on the device
    } else {
      auto g = grads.span();
      double bad_layer = -1;  // first offending layer on this rank
      for (std::size_t i = 0; i < layout_.size() && bad_layer < 0; ++i) {
        const auto& l = layout_[i];
        for (std::size_t j = 0; j < l.numel; ++j)
          if (!std::isfinite(g[l.offset + j])) {
            bad_layer = static_cast<double>(i);
            break;
          }
      }
      if (options_.on_non_finite == non_finite_action::zero_values) {
        if (bad_layer >= 0)
          for (auto& x : g)
            if (!std::isfinite(x)) x = 0.0f;
        return false;
      }
      // rank + 1 of a failing rank; the max over ranks names the highest failing rank.
      double flag = bad_layer >= 0 ? comm_.rank() + 1.0 : 0.0;
      comm_.allreduce_max(std::span<double>(&flag, 1));
      if (flag == 0) return false;
      const int who = static_cast<int>(flag) - 1;
      if (options_.on_non_finite == non_finite_action::throw_error) {
        // A failing rank names its own layer (even when a higher rank failed too); the others name a failing rank.
        const std::string where = bad_layer >= 0
                                      ? "layer '" + layout_[static_cast<std::size_t>(bad_layer)].name + "'"
                                      : "rank " + std::to_string(who) + "'s gradient";
        throw error(status::non_finite, "non-finite gradient in " + where, comm_.rank());
      }
      // skip_step: leave the residual as it is and contribute nothing.
      std::fill(g.begin(), g.end(), 0.0f);
      report_.skipped = true;
      report_.bytes_sent = 0;
      return true;
    }
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

  // Averages norms and gains over the ranks and takes the slowest rank's times, so that
  // every rank's policy sees identical inputs and takes identical decisions.
  void synchronize_statistics() {
    // Layout of sync_: L norms, L kept fractions, the gain, G gain-curve points.
    const std::size_t L = layout_.size(), G = report_.gain_curve.size();
    sync_.resize(2 * L + 1 + G);
    std::copy(report_.layer_grad_norm.begin(), report_.layer_grad_norm.end(), sync_.begin());
    std::copy(report_.kept_fraction.begin(), report_.kept_fraction.end(), sync_.begin() + static_cast<std::ptrdiff_t>(L));
    sync_[2 * L] = report_.gain;
    std::copy(report_.gain_curve.begin(), report_.gain_curve.end(),
              sync_.begin() + static_cast<std::ptrdiff_t>(2 * L + 1));
    comm_.allreduce_sum(std::span<double>(sync_));
    const double inv = 1.0 / comm_.size();
    for (std::size_t i = 0; i < L; ++i) report_.layer_grad_norm[i] = sync_[i] * inv;
    for (std::size_t i = 0; i < L; ++i) report_.kept_fraction[i] = sync_[L + i] * inv;
    report_.gain = sync_[2 * L] * inv;
    for (std::size_t c = 0; c < G; ++c) report_.gain_curve[c] = sync_[2 * L + 1 + c] * inv;
    // Every time a policy's clock may read (time_source.hpp) is the slowest rank's.
    double times[5] = {report_.compress_s, report_.communicate_s, report_.decompress_s, report_.iteration_s,
                       report_.modeled_communicate_s};
    comm_.allreduce_max(std::span<double>(times, 5));
    report_.compress_s = times[0];
    report_.communicate_s = times[1];
    report_.decompress_s = times[2];
    report_.iteration_s = times[3];
    report_.modeled_communicate_s = times[4];
    report_.statistics_synchronized = true;
  }

  communicator_ref<memory_space> comm_;
  layout layout_;
  options options_;
  C compressor_;
  K collective_;
  P policy_;
  typename storage_for<memory_space>::type residual_;
  bool residual_zero_ = true;
  step_params params_;
  compress_stats stats_;
  step_report report_;
  std::vector<double> sync_;
  detail::consistency_checker consistency_;
  std::uint64_t step_ = 0;
  std::chrono::steady_clock::time_point last_return_{};
};

}  // namespace gravac
