#pragma once
//! \file dense_allreduce.hpp
//! \brief Aggregation by a dense Allreduce: each rank decompresses its own packet
//! locally (so error feedback still applies) and the dense buffers are summed.
//! With every layer dense it is one Allreduce of the gradient, the baseline.

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <span>
#include <vector>

#include "gravac/collective/detail/space_ops.hpp"
#include "gravac/collective/detail/space_workspace.hpp"
#include "gravac/collective/step_buffers.hpp"
#include "gravac/concepts/concepts.hpp"
#include "gravac/core/memory.hpp"
#include "gravac/network/wire_bytes.hpp"

namespace gravac {

//! dense_allreduce has no options.
struct dense_allreduce_options {};

namespace detail {
//! The packet buffer of dense_allreduce in memory space \p Space (device memory for cuda_space).
template <class Space>
struct dense_allreduce_workspace {
  typename default_byte_buffer<Space>::type packet;  //!< this rank's packet, decoded locally
};
}  // namespace detail

//! Dense Allreduce of (locally decompressed) gradients, averaged. Models Collective.
//!
//! One body for every memory space (what differs is detail::space_ops). In host memory a
//! step that sends everything dense from a zero residual skips the compressor (one
//! Allreduce of the gradient, the baseline), the control values ride at the end of the
//! Allreduce buffer, and the sum is divided by N after the Allreduce. In device memory the
//! host reads nothing: every step goes through the compressor (its raw segments for dense
//! layers, which also fold the residual in), and the own packet is decoded scaled by 1/N
//! before the Allreduce (device compressors have no scaling pass of their own; the result
//! equals the host's when N is a power of two).
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
    workspace_.prepare<typename C::memory_space>().packet.resize(c.max_packet_bytes());
  }

  //! Gives this rank's last packet back to its residual (e += decompress(packet)) when the
  //! step went through the compressor; the trainer calls it when the step is abandoned after
  //! the collective (a non-finite gradient on some rank).
  template <Compressor C>
  void return_sent(C& c, step_buffers<typename C::memory_space>& buf) {
    if (!used_packet_) return;
    using space = typename C::memory_space;
    auto& w = workspace_.get<space>("dense_allreduce");
    c.decompress_add(std::span<const std::byte>(w.packet.data(), last_bytes_), buf.residual, 1.0f);
    detail::space_ops<space>::finish(c);
  }

  //! Runs one step: leaves the rank average of decompress(C(g + e)) in buf.grad.
  template <Compressor C, Communicator M>
  void aggregate(C& c, M& comm, step_buffers<typename C::memory_space>& buf, const step_params& p, compress_stats& st,
                 step_report& r) {
    static_assert(CommunicatorFor<M, C>, "dense_allreduce: the communicator must carry the compressor's memory");
    using space = typename C::memory_space;
    using ops = detail::space_ops<space>;
    auto& w = workspace_.get<space>("dense_allreduce");
    const auto t0 = std::chrono::steady_clock::now();
    // With control values the Allreduce runs on a workspace of d + S floats (the values
    // ride at its end); the gradient is then written back while it is averaged, so the
    // workspace costs one write of d floats on the fast dense path (fused with the norms'
    // pass when a policy wants them) and nothing elsewhere.
    step_control* ctl = nullptr;
    if constexpr (ops::carries_control) ctl = buf.control;
    const std::size_t d = buf.grad.size();
    grad_view<space> target = buf.grad;
    if constexpr (ops::carries_control) {
      if (ctl) {
        sum_.resize(d + ctl->size());
        target = grad_view<space>(sum_.data(), d);
      }
    }
    used_packet_ = true;
    if (!dense_without_compressor(buf, p, st, ctl, target)) {
      // Materialize u = g + e through the compressor (which fills the statistics; dense
      // layers become raw segments), then decode the own packet.
      if (p.all_dense()) st.reset(layout_.size(), p.gain_candidates.size());
      last_bytes_ = c.compress(buf.grad, buf.residual, p, std::span<std::byte>(w.packet.data(), w.packet.size()), st);
      ops::zero(c, target);
      const float scale = ops::host_readable ? 1.0f : 1.0f / static_cast<float>(comm.size());
      c.decompress_add(std::span<const std::byte>(w.packet.data(), last_bytes_), target, scale);
    }
    std::span<float> reduced(target.data(), target.size());
    if (ctl) {
      ctl->seal(st);
      ctl->write_local(std::span<float>(sum_.data() + d, ctl->size()));
      reduced = std::span<float>(sum_.data(), d + ctl->size());
    }
    ops::finish(c);
    r.compress_s = detail::seconds_since(t0);
    const auto t1 = std::chrono::steady_clock::now();
    comm.allreduce_sum(reduced);
    r.communicate_s = detail::seconds_since(t1);
    r.decompress_s = 0;
    if constexpr (ops::host_readable) {
      const auto t2 = std::chrono::steady_clock::now();
      auto g = buf.grad.span();
      const float inv = 1.0f / static_cast<float>(comm.size());
      if (ctl) {
        ctl->set_summed(std::span<const float>(sum_.data() + d, ctl->size()));
        for (std::size_t i = 0; i < d; ++i) g[i] = sum_[i] * inv;
      } else {
        for (auto& x : g) x *= inv;
      }
      r.decompress_s = detail::seconds_since(t2);
    }
    r.bytes_sent = d * sizeof(float);
    // The wire carries the whole reduced buffer, control floats included.
    set_wire_bytes(r, last_allreduce_wire_bytes(comm, static_cast<double>(reduced.size_bytes())));
    r.collective = collective_kind::dense_allreduce;
  }

 private:
  // Host memory, every layer dense and a zero residual, no gain curve: the baseline path,
  // one Allreduce of the gradient, without the compressor; the statistics come from g
  // (copied into the control workspace \p target in the same pass). Returns false (the
  // step needs the compressor) otherwise, and always outside host memory.
  template <class Space>
  bool dense_without_compressor(const step_buffers<Space>& buf, const step_params& p, compress_stats& st,
                                const step_control* ctl, grad_view<Space> target) {
    if constexpr (!detail::space_ops<Space>::host_readable) {
      return false;
    } else {
      if (!(p.all_dense() && buf.residual_zero && p.gain_candidates.empty())) return false;
      auto g = buf.grad.span();
      st.reset(layout_.size(), 0);
      if (p.collect_norms) {
        fill_dense_stats(g, st, ctl ? target.data() : nullptr);  // copies into the workspace in the same pass
      } else {
        // No norms asked for, but the counts are known: every value is sent (a report of
        // 0 kept on a dense step would misstate what went on the wire).
        for (std::size_t i = 0; i < layout_.size(); ++i) st.layers[i].kept = layout_[i].numel;
        if (ctl) std::copy(g.begin(), g.end(), target.data());
      }
      used_packet_ = false;
      return true;
    }
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
  detail::space_workspace<detail::dense_allreduce_workspace> workspace_;
  std::vector<float> sum_;  // host: the Allreduce buffer when control values ride along
  std::size_t last_bytes_ = 0;
  bool used_packet_ = false;
};
static_assert(Collective<dense_allreduce>);

}  // namespace gravac
