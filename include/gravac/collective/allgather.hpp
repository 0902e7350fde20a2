#pragma once
//! \file allgather.hpp
//! \brief Aggregation by Allgather: every rank's variable-length packet reaches every
//! rank (no padding to the largest), is validated, decoded and summed, then divided by N.

#include <algorithm>
#include <chrono>
#include <concepts>
#include <cstddef>
#include <span>
#include <vector>

#include "gravac/collective/dense_allreduce.hpp"
#include "gravac/collective/detail/space_ops.hpp"
#include "gravac/collective/detail/space_workspace.hpp"
#include "gravac/collective/step_buffers.hpp"
#include "gravac/concepts/concepts.hpp"
#include "gravac/core/memory.hpp"
#include "gravac/network/wire_bytes.hpp"

namespace gravac {

//! allgather has no options.
struct allgather_options {};

namespace detail {
//! The packet buffers of allgather in memory space \p Space (device memory for cuda_space).
template <class Space>
struct allgather_workspace {
  typename default_byte_buffer<Space>::type packet;    //!< this rank's packet (and, on the host, its control trailer)
  typename default_byte_buffer<Space>::type gathered;  //!< every rank's packet, in rank order
};
}  // namespace detail

//! Allgather of compressed packets, decoded and averaged on every rank. Models Collective.
//!
//! A step that sends every layer dense is one Allreduce of the dense gradient (through
//! dense_allreduce), never an Allgather of raw segments: a ring Allreduce moves
//! 2(N-1)/N x 4d bytes per rank where gathering N raw segments moves (N-1) x 4d.
//!
//! Works in any memory space, with one body (what differs is detail::space_ops): the packet
//! buffers are `default_byte_buffer<Space>` (device memory for cuda_space). A device
//! compressor provides `zero(view)` and `synchronize()`, which clear the gradient and finish
//! decoding; the step's control values ride as a packet trailer in host memory only.
class allgather {
 public:
  //! Opt-in tag for the Collective concept.
  using collective_tag = void;
  //! Options (see allgather_options).
  using options = allgather_options;
  //! Any compressor whose packet is complete after one compress; not the low-rank ones
  //! (PowerSGD needs the sum of P before it can compute Q: use low_rank_allreduce).
  template <class C>
  static constexpr bool accepts = !LowRankCompressor<C>;
  //! Why it may refuse a compressor (the trainer's message): a LowRankCompressor needs two
  //! dependent Allreduces, which compress-then-gather cannot run.
  static constexpr bool rejects_low_rank = true;

  //! A collective for \p lay.
  allgather(const layout& lay, const options& = {}) : layout_(lay), dense_(lay) {}

  //! Sizes the packet workspace once for compressor \p c.
  template <Compressor C>
  void prepare(const C& c) {
    dense_.prepare(c);
    workspace_.prepare<typename C::memory_space>().packet.resize(c.max_packet_bytes());
  }

  //! Gives this rank's last packet back to its residual (e += decompress(packet)), so the
  //! residual holds everything it did not get to send: the trainer calls it when the step
  //! is abandoned after the collective (a non-finite gradient on some rank).
  template <Compressor C>
  void return_sent(C& c, step_buffers<typename C::memory_space>& buf) {
    if (last_dense_) return dense_.return_sent(c, buf);
    using space = typename C::memory_space;
    auto& w = workspace_.get<space>("allgather");
    c.decompress_add(std::span<const std::byte>(w.packet.data(), last_bytes_), buf.residual, 1.0f);
    detail::space_ops<space>::finish(c);
  }

  //! Runs one step: leaves the rank average of every rank's decompressed packet in buf.grad.
  //! Every packet is validated (a device compressor checks headers and indices on the
  //! device) before the gradient is touched: one that fails throws gravac::error naming the
  //! sender, with buf.grad intact and the residual already correct for what this rank sent.
  template <Compressor C, Communicator M>
  void aggregate(C& c, M& comm, step_buffers<typename C::memory_space>& buf, const step_params& p, compress_stats& st,
                 step_report& r) {
    static_assert(CommunicatorFor<M, C>, "allgather: the communicator must carry the compressor's memory");
    using space = typename C::memory_space;
    using ops = detail::space_ops<space>;
    static_assert(std::same_as<typename M::byte_buffer, typename default_byte_buffer<space>::type>,
                  "allgather: the communicator's byte_buffer must be the memory space's default");
    last_dense_ = p.all_dense();
    if (last_dense_) return dense_.aggregate(c, comm, buf, p, st, r);
    auto& w = workspace_.get<space>("allgather");
    const auto t0 = std::chrono::steady_clock::now();
    const std::size_t bytes =
        c.compress(buf.grad, buf.residual, p, std::span<std::byte>(w.packet.data(), w.packet.size()), st);
    last_bytes_ = bytes;
    // The control values ride as a trailer of the packet (every rank's has the same length).
    std::size_t trailer = 0;
    step_control* ctl = nullptr;
    if constexpr (ops::carries_control) ctl = buf.control;
    if (ctl) {
      ctl->seal(st);
      trailer = ctl->trailer_bytes();
      if (w.packet.size() < bytes + trailer) w.packet.resize(bytes + trailer);  // once: the trailer's length is stable
      ctl->write_trailer(std::span<std::byte>(w.packet.data() + bytes, trailer));
    }
    r.compress_s = detail::seconds_since(t0);
    const auto t1 = std::chrono::steady_clock::now();
    comm.allgatherv(std::span<const std::byte>(w.packet.data(), bytes + trailer), w.gathered, sizes_);
    r.communicate_s = detail::seconds_since(t1);
    const auto t2 = std::chrono::steady_clock::now();
    // Validate every packet before touching the gradient, so a bad peer leaves it intact.
    std::size_t at = 0;
    for (std::size_t rank = 0; rank < sizes_.size(); ++rank) {
      if (sizes_[rank] < trailer)
        throw_if_invalid(validation{status::malformed_packet, "the packet is shorter than the step's control trailer"},
                         static_cast<int>(rank));
      throw_if_invalid(c.validate(std::span<const std::byte>(w.gathered.data() + at, sizes_[rank] - trailer)),
                       static_cast<int>(rank));
      at += sizes_[rank];
    }
    if (ctl) {
      ctl->begin_sums();
      at = 0;
      for (std::size_t rank = 0; rank < sizes_.size(); ++rank) {
        at += sizes_[rank];
        ctl->add_trailer(std::span<const std::byte>(w.gathered.data() + at - trailer, trailer));
      }
    }
    ops::zero(c, buf.grad);
    const float inv = 1.0f / static_cast<float>(comm.size());
    at = 0;
    for (std::size_t rank = 0; rank < sizes_.size(); ++rank) {
      c.decompress_add(std::span<const std::byte>(w.gathered.data() + at, sizes_[rank] - trailer), buf.grad, inv);
      at += sizes_[rank];
    }
    ops::finish(c);
    r.decompress_s = detail::seconds_since(t2);
    r.bytes_sent = bytes;
    // Every block with its trailer: the other ranks' in, as many forwarded out.
    double total = 0;
    for (const std::size_t s : sizes_) total += static_cast<double>(s);
    set_wire_bytes(r, wire_bytes::allgather(comm.size(), total, static_cast<double>(bytes + trailer)));
    r.collective = collective_kind::allgather;
  }

 private:
  layout layout_;
  dense_allreduce dense_;  // all-dense steps
  bool last_dense_ = false;
  detail::space_workspace<detail::allgather_workspace> workspace_;
  std::vector<std::size_t> sizes_;
  std::size_t last_bytes_ = 0;
};
static_assert(Collective<allgather>);

}  // namespace gravac
