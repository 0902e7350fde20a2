#pragma once
//! \file dense_allreduce.hpp
//! \brief Aggregation by a dense Allreduce: each rank decompresses its own packet
//! locally (so error feedback still applies) and the dense buffers are summed.
//! With every layer dense it is one Allreduce of the gradient, the baseline.

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <memory>
#include <span>
#include <vector>

#include "gravac/collective/step_buffers.hpp"
#include "gravac/collective/workspace_slot.hpp"
#include "gravac/comm/communicator_ref.hpp"
#include "gravac/concepts.hpp"

namespace gravac {

//! dense_allreduce has no options.
struct dense_allreduce_options {};

//! Dense Allreduce of (locally decompressed) gradients, averaged. Models Collective.
class dense_allreduce {
 public:
  //! Opt-in tag for the Collective concept.
  using collective_tag = void;
  //! Options (see dense_allreduce_options).
  using options = dense_allreduce_options;
  //! Any compressor works: its output is decompressed before the Allreduce.
  template <class C>
  static constexpr bool accepts = true;

  //! A collective for \p lay.
  dense_allreduce(const layout& lay, const options& = {}) : layout_(lay) {}

  //! Sizes the packet workspace once for compressor \p c (two-phase: size, then run).
  //! A device compressor's packet lives in its memory space (default_byte_buffer).
  template <Compressor C>
  void prepare(const C& c) {
    if constexpr (C::memory_space::host_accessible) {
      packet_.resize(c.max_packet_bytes());
    } else {
      other_space_.emplace<typename default_byte_buffer<typename C::memory_space>::type>().resize(c.max_packet_bytes());
    }
  }

  //! Gives this rank's last packet back to its residual (e += decompress(packet)) when the
  //! step went through the compressor; the trainer calls it when the step is abandoned after
  //! the collective (a non-finite gradient on some rank). Host memory.
  template <Compressor C>
  void return_sent(C& c, step_buffers<typename C::memory_space>& buf) {
    if constexpr (C::memory_space::host_accessible)
      if (used_packet_) c.decompress_add(std::span<const std::byte>(packet_.data(), last_bytes_), buf.residual, 1.0f);
  }

  //! Runs one step: leaves the rank average of decompress(C(g + e)) in buf.grad.
  template <Compressor C, Communicator M>
  void aggregate(C& c, M& comm, step_buffers<typename C::memory_space>& buf, const step_params& p, compress_stats& st,
                 step_report& r) {
    static_assert(CommunicatorFor<M, C>, "dense_allreduce: the communicator must carry the compressor's memory");
    if constexpr (!C::memory_space::host_accessible)
      aggregate_device(c, comm, buf, p, st, r);
    else
      aggregate_host(c, comm, buf, p, st, r);
  }

 private:
  template <Compressor C, Communicator M>
  void aggregate_host(C& c, M& comm, step_buffers<typename C::memory_space>& buf, const step_params& p,
                      compress_stats& st, step_report& r) {
    const auto t0 = std::chrono::steady_clock::now();
    auto g = buf.grad.span();
    // With control values the Allreduce runs on a workspace of d + S floats (the values
    // ride at its end); the gradient is then written back while it is averaged, so the
    // workspace costs one write of d floats on the fast dense path (fused with the norms'
    // pass when a policy wants them) and nothing elsewhere.
    step_control* ctl = buf.control;
    const std::size_t d = g.size();
    if (ctl) sum_.resize(d + ctl->size());
    const std::span<float> target = ctl ? std::span<float>(sum_.data(), d) : g;
    used_packet_ = true;
    if (p.all_dense() && buf.residual_zero && p.gain_candidates.empty()) {
      // The baseline path: one Allreduce of the gradient.
      st.reset(layout_.size(), 0);
      if (p.collect_norms) {
        fill_dense_stats(g, st, ctl ? target.data() : nullptr);  // copies into the workspace in the same pass
      } else {
        // No norms asked for, but the counts are known: every value is sent (a report of
        // 0 kept on a dense step would misstate what went on the wire).
        for (std::size_t i = 0; i < layout_.size(); ++i) st.layers[i].kept = layout_[i].numel;
        if (ctl) std::copy(g.begin(), g.end(), target.begin());
      }
      used_packet_ = false;
    } else {
      // Materialize u = g + e through the compressor (which fills the statistics; dense
      // layers become raw segments), then decode the own packet.
      if (p.all_dense()) st.reset(layout_.size(), p.gain_candidates.size());
      last_bytes_ = c.compress(buf.grad, buf.residual, p, packet_, st);
      std::fill(target.begin(), target.end(), 0.0f);
      c.decompress_add(std::span<const std::byte>(packet_.data(), last_bytes_),
                       grad_view<typename C::memory_space>(target.data(), target.size()), 1.0f);
    }
    std::span<float> reduced = target;
    if (ctl) {
      ctl->seal(st);
      ctl->write_local(std::span<float>(sum_.data() + d, ctl->size()));
      reduced = std::span<float>(sum_.data(), d + ctl->size());
    }
    r.compress_s = detail::seconds_since(t0);
    const auto t1 = std::chrono::steady_clock::now();
    comm.allreduce_sum(reduced);
    r.communicate_s = detail::seconds_since(t1);
    const auto t2 = std::chrono::steady_clock::now();
    const float inv = 1.0f / static_cast<float>(comm.size());
    if (ctl) {
      ctl->set_summed(std::span<const float>(sum_.data() + d, ctl->size()));
      for (std::size_t i = 0; i < d; ++i) g[i] = sum_[i] * inv;
    } else {
      for (auto& x : g) x *= inv;
    }
    r.decompress_s = detail::seconds_since(t2);
    r.bytes_sent = g.size() * sizeof(float);
    r.collective = collective_kind::dense_allreduce;
  }

  // Device memory: compress, decode the own packet scaled by 1/N (one pass instead of a
  // decode and a later scaling; the same result when N is a power of two), then the
  // Allreduce sums the averages. A device compressor provides zero(view) and
  // synchronize() (the communicator may use another stream). Dense steps go through the
  // compressor too (its raw segments), which also folds the residual in.
  template <Compressor C, Communicator M>
  void aggregate_device(C& c, M& comm, step_buffers<typename C::memory_space>& buf, const step_params& p,
                        compress_stats& st, step_report& r) {
    using buffer_t = typename default_byte_buffer<typename C::memory_space>::type;
    auto& packet = other_space_.get<buffer_t>("dense_allreduce");
    const auto t0 = std::chrono::steady_clock::now();
    const std::size_t bytes =
        c.compress(buf.grad, buf.residual, p, std::span<std::byte>(packet.data(), packet.size()), st);
    c.zero(buf.grad);
    c.decompress_add(std::span<const std::byte>(packet.data(), bytes), buf.grad,
                     1.0f / static_cast<float>(comm.size()));
    c.synchronize();
    r.compress_s = detail::seconds_since(t0);
    const auto t1 = std::chrono::steady_clock::now();
    comm.allreduce_sum(std::span<float>(buf.grad.data(), buf.grad.size()));
    r.communicate_s = detail::seconds_since(t1);
    r.decompress_s = 0;
    r.bytes_sent = buf.grad.size() * sizeof(float);
    r.collective = collective_kind::dense_allreduce;
  }

  // Per-layer squared norms of g; with \p copy_to, g is copied there in the same pass.
  void fill_dense_stats(std::span<const float> g, compress_stats& st, float* copy_to = nullptr) const {
    for (std::size_t i = 0; i < layout_.size(); ++i) {
      const auto& l = layout_[i];
      double s = 0;
      for (std::size_t j = l.offset; j < l.offset + l.numel; ++j) {
        s += static_cast<double>(g[j]) * g[j];
        if (copy_to) copy_to[j] = g[j];
      }
      st.layers[i] = {l.numel, s, s, s};
    }
  }

  layout layout_;
  std::vector<std::byte> packet_;
  std::vector<float> sum_;  // the Allreduce buffer when control values ride along
  std::size_t last_bytes_ = 0;
  bool used_packet_ = false;
  workspace_slot other_space_;  // default_byte_buffer<Space>::type of a device compressor
};
static_assert(Collective<dense_allreduce>);

}  // namespace gravac
