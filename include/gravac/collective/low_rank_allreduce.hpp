#pragma once
//! \file low_rank_allreduce.hpp
//! \brief Aggregation of low-rank compressors (PowerSGD) by two allreduces: first the P
//! factors (and the layers sent raw), then the Q factors computed from the summed P.
//! Needs no Eigen itself; only LowRankCompressor models are accepted.

#include <chrono>
#include <cstddef>
#include <span>
#include <vector>

#include "gravac/collective/control/step_control.hpp"
#include "gravac/collective/step_buffers.hpp"
#include "gravac/concepts/concepts.hpp"
#include "gravac/network/wire_bytes.hpp"

namespace gravac {

//! low_rank_allreduce has no options.
struct low_rank_allreduce_options {};

//! Two-allreduce aggregation for LowRankCompressor models. Models Collective.
//!
//! A step: `project` (u = g + e, P = M Q, raw layers copied out), Allreduce-sum of P and
//! the raw values, `factor` (orthonormalize P, Q_local = M^T P^, e = u - P^ Q_local^T),
//! Allreduce-sum of Q, `reconstruct` (grad = P^ Q^T / N). Both reductions are identical on
//! every rank, so every rank reconstructs the same bits. The report's collective is
//! dense_allreduce (these are allreduces), bytes_sent the floats of both reductions and
//! the wire bytes those of both allreduces as called (the control floats included).
class low_rank_allreduce {
 public:
  //! Opt-in tag for the Collective concept.
  using collective_tag = void;
  //! Options (see low_rank_allreduce_options).
  using options = low_rank_allreduce_options;
  //! Only compressors that implement the low-rank protocol.
  template <class C>
  static constexpr bool accepts = LowRankCompressor<C>;
  //! Why it may refuse a compressor (the trainer's message): it drives the low-rank protocol.
  static constexpr bool needs_low_rank = true;

  //! A collective for \p lay.
  low_rank_allreduce(const layout&, const options& = {}) {}

  //! Nothing to size: the compressor owns its factor buffers.
  template <Compressor C>
  void prepare(const C&) noexcept {}

  //! Runs one step: leaves the rank average of the low-rank approximations in buf.grad.
  template <Compressor C, Communicator M>
  void aggregate(C& c, M& comm, step_buffers<typename C::memory_space>& buf, const step_params& p, compress_stats& st,
                 step_report& r) {
    static_assert(LowRankCompressor<C>, "low_rank_allreduce: the compressor must model LowRankCompressor (PowerSGD)");
    static_assert(CommunicatorFor<M, C>, "low_rank_allreduce: the communicator must carry the compressor's memory");
    auto t = std::chrono::steady_clock::now();
    const std::span<float> first = c.project(buf.grad, buf.residual, p, st);
    r.compress_s = detail::seconds_since(t);
    t = std::chrono::steady_clock::now();
    wire_bytes wire_total{};  // both allreduces, as called
    if (!first.empty()) {
      comm.allreduce_sum(first);
      wire_total += last_allreduce_wire_bytes(comm, static_cast<double>(first.size_bytes()));
    }
    r.communicate_s = detail::seconds_since(t);
    t = std::chrono::steady_clock::now();
    const std::span<float> second = c.factor(buf.residual, p, st);
    r.compress_s += detail::seconds_since(t);
    // The control values ride at the end of the second Allreduce (the statistics are
    // complete only after factor()); the factors are copied into a workspace for that.
    // A step without low-rank layers has no second Allreduce: the values then go alone.
    step_control* ctl = buf.control;
    t = std::chrono::steady_clock::now();
    if (ctl) {
      ctl->seal(st);
      sum_.resize(second.size() + ctl->size());
      std::copy(second.begin(), second.end(), sum_.begin());
      ctl->write_local(std::span<float>(sum_.data() + second.size(), ctl->size()));
      comm.allreduce_sum(std::span<float>(sum_));
      wire_total += last_allreduce_wire_bytes(comm, static_cast<double>(sum_.size() * sizeof(float)));
      std::copy(sum_.begin(), sum_.begin() + static_cast<std::ptrdiff_t>(second.size()), second.begin());
      ctl->set_summed(std::span<const float>(sum_.data() + second.size(), ctl->size()));
    } else if (!second.empty()) {
      comm.allreduce_sum(second);
      wire_total += last_allreduce_wire_bytes(comm, static_cast<double>(second.size_bytes()));
    }
    r.communicate_s += detail::seconds_since(t);
    t = std::chrono::steady_clock::now();
    c.reconstruct(buf.grad, 1.0f / static_cast<float>(comm.size()));
    r.decompress_s = detail::seconds_since(t);
    r.bytes_sent = (first.size() + second.size()) * sizeof(float);
    set_wire_bytes(r, wire_total);
    r.collective = collective_kind::dense_allreduce;
  }

 private:
  std::vector<float> sum_;  // the second Allreduce's buffer when control values ride along
};
static_assert(Collective<low_rank_allreduce>);

}  // namespace gravac
