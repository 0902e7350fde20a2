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

#include "gravac/collective/step_buffers.hpp"
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
  template <Compressor C>
  void prepare(const C& c) {
    packet_.resize(c.max_packet_bytes());
  }

  //! Runs one step: leaves the rank average of decompress(C(g + e)) in buf.grad.
  template <Compressor C, Communicator M>
  void aggregate(C& c, M& comm, step_buffers<typename C::memory_space>& buf, const step_params& p,
                 compress_stats& st, step_report& r) {
    static_assert(CommunicatorFor<M, C>, "dense_allreduce: the communicator must carry the compressor's memory");
    const auto t0 = std::chrono::steady_clock::now();
    auto g = buf.grad.span();
    if (p.all_dense()) {
      // The baseline path: fold any leftover residual in, then one Allreduce.
      st.reset(layout_.size(), p.gain_candidates.size());
      if (!buf.residual_zero || !p.gain_candidates.empty()) {
        // Materialize u = g + e; the compressor's skeleton fills the statistics.
        const std::size_t bytes = c.compress(buf.grad, buf.residual, p, packet_, st);
        std::fill(g.begin(), g.end(), 0.0f);
        c.decompress_add(std::span<const std::byte>(packet_.data(), bytes), buf.grad, 1.0f);
      } else if (p.collect_norms) {
        fill_dense_stats(g, st);
      }
    } else {
      const std::size_t bytes = c.compress(buf.grad, buf.residual, p, packet_, st);
      std::fill(g.begin(), g.end(), 0.0f);
      c.decompress_add(std::span<const std::byte>(packet_.data(), bytes), buf.grad, 1.0f);
    }
    r.compress_s = detail::seconds_since(t0);
    const auto t1 = std::chrono::steady_clock::now();
    comm.allreduce_sum(g);
    r.communicate_s = detail::seconds_since(t1);
    const auto t2 = std::chrono::steady_clock::now();
    const float inv = 1.0f / static_cast<float>(comm.size());
    for (auto& x : g) x *= inv;
    r.decompress_s = detail::seconds_since(t2);
    r.bytes_sent = g.size() * sizeof(float);
    r.collective = collective_kind::dense_allreduce;
  }

 private:
  void fill_dense_stats(std::span<const float> g, compress_stats& st) const {
    for (std::size_t i = 0; i < layout_.size(); ++i) {
      const auto& l = layout_[i];
      double s = 0;
      for (std::size_t j = 0; j < l.numel; ++j) s += static_cast<double>(g[l.offset + j]) * g[l.offset + j];
      st.layers[i] = {l.numel, s, s, s};
    }
  }

  layout layout_;
  std::vector<std::byte> packet_;
};
static_assert(Collective<dense_allreduce>);

}  // namespace gravac
