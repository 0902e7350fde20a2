#pragma once
//! \file allgather.hpp
//! \brief Aggregation by Allgather: every rank's variable-length packet reaches every
//! rank (no padding to the largest), is validated, decoded and summed, then divided by N.

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <memory>
#include <span>
#include <vector>

#include "gravac/collective/dense_allreduce.hpp"
#include "gravac/collective/step_buffers.hpp"
#include "gravac/collective/workspace_slot.hpp"
#include "gravac/comm/communicator_ref.hpp"
#include "gravac/concepts.hpp"

namespace gravac {

//! allgather has no options.
struct allgather_options {};

//! Allgather of compressed packets, decoded and averaged on every rank. Models Collective.
//!
//! A step that sends every layer dense is one Allreduce of the dense gradient (through
//! dense_allreduce), never an Allgather of raw segments: a ring Allreduce moves
//! 2(N-1)/N x 4d bytes per rank where gathering N raw segments moves (N-1) x 4d.
//!
//! Works in any memory space: the packet buffers are `default_byte_buffer<Space>` (device
//! memory for cuda_space). A device compressor provides `zero(view)` and `synchronize()`,
//! which the device path uses to clear the gradient and to finish decoding.
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
    if constexpr (C::memory_space::host_accessible) {
      packet_.resize(c.max_packet_bytes());
    } else {
      other_space_.emplace<space_workspace<typename C::memory_space>>().packet.resize(c.max_packet_bytes());
    }
  }

  //! Gives this rank's last packet back to its residual (e += decompress(packet)), so the
  //! residual holds everything it did not get to send: the trainer calls it when the step
  //! is abandoned after the collective (a non-finite gradient on some rank). Host memory.
  template <Compressor C>
  void return_sent(C& c, step_buffers<typename C::memory_space>& buf) {
    if (last_dense_)
      dense_.return_sent(c, buf);
    else if constexpr (C::memory_space::host_accessible)
      c.decompress_add(std::span<const std::byte>(packet_.data(), last_bytes_), buf.residual, 1.0f);
  }

  //! Runs one step: leaves the rank average of every rank's decompressed packet in buf.grad.
  //! A packet that fails validation throws gravac::error naming the sender; buf.grad is then
  //! left partly summed but the residual is already correct for what this rank sent.
  template <Compressor C, Communicator M>
  void aggregate(C& c, M& comm, step_buffers<typename C::memory_space>& buf, const step_params& p, compress_stats& st,
                 step_report& r) {
    static_assert(CommunicatorFor<M, C>, "allgather: the communicator must carry the compressor's memory");
    last_dense_ = p.all_dense();
    if (last_dense_) return dense_.aggregate(c, comm, buf, p, st, r);
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
    const std::size_t bytes = c.compress(buf.grad, buf.residual, p, packet_, st);
    last_bytes_ = bytes;
    // The control values ride as a trailer of the packet (every rank's has the same length).
    std::size_t trailer = 0;
    if (buf.control) {
      buf.control->seal(st);
      trailer = buf.control->trailer_bytes();
      if (packet_.size() < bytes + trailer) packet_.resize(bytes + trailer);  // once: the trailer's length is stable
      buf.control->write_trailer(std::span<std::byte>(packet_.data() + bytes, trailer));
    }
    r.compress_s = detail::seconds_since(t0);
    const auto t1 = std::chrono::steady_clock::now();
    comm.allgatherv(std::span<const std::byte>(packet_.data(), bytes + trailer), gathered_, sizes_);
    r.communicate_s = detail::seconds_since(t1);
    const auto t2 = std::chrono::steady_clock::now();
    // Validate every packet before touching the gradient, so a bad peer leaves it intact.
    std::size_t at = 0;
    for (std::size_t rank = 0; rank < sizes_.size(); ++rank) {
      if (sizes_[rank] < trailer)
        throw_if_invalid(validation{status::malformed_packet, "the packet is shorter than the step's control trailer"},
                         static_cast<int>(rank));
      throw_if_invalid(c.validate(std::span<const std::byte>(gathered_.data() + at, sizes_[rank] - trailer)),
                       static_cast<int>(rank));
      at += sizes_[rank];
    }
    if (buf.control) {
      buf.control->begin_sums();
      at = 0;
      for (std::size_t rank = 0; rank < sizes_.size(); ++rank) {
        at += sizes_[rank];
        buf.control->add_trailer(std::span<const std::byte>(gathered_.data() + at - trailer, trailer));
      }
    }
    auto g = buf.grad.span();
    std::fill(g.begin(), g.end(), 0.0f);
    const float inv = 1.0f / static_cast<float>(comm.size());
    at = 0;
    for (std::size_t rank = 0; rank < sizes_.size(); ++rank) {
      c.decompress_add(std::span<const std::byte>(gathered_.data() + at, sizes_[rank] - trailer), buf.grad, inv);
      at += sizes_[rank];
    }
    r.decompress_s = detail::seconds_since(t2);
    r.bytes_sent = bytes;
    r.collective = collective_kind::allgather;
  }

  // The workspace of a memory space other than the host's.
  template <class Space>
  struct space_workspace {
    typename default_byte_buffer<Space>::type packet, gathered;
  };

  // The same steps for device memory: packets stay on the device; every packet is
  // validated (the compressor checks headers and indices on the device) before decoding.
  template <Compressor C, Communicator M>
  void aggregate_device(C& c, M& comm, step_buffers<typename C::memory_space>& buf, const step_params& p,
                        compress_stats& st, step_report& r) {
    using ws_t = space_workspace<typename C::memory_space>;
    static_assert(std::same_as<typename M::byte_buffer, decltype(ws_t::gathered)>,
                  "allgather: the communicator's byte_buffer must be the memory space's default");
    auto& w = other_space_.get<ws_t>("allgather");
    const auto t0 = std::chrono::steady_clock::now();
    const std::size_t bytes =
        c.compress(buf.grad, buf.residual, p, std::span<std::byte>(w.packet.data(), w.packet.size()), st);
    r.compress_s = detail::seconds_since(t0);
    const auto t1 = std::chrono::steady_clock::now();
    comm.allgatherv(std::span<const std::byte>(w.packet.data(), bytes), w.gathered, sizes_);
    r.communicate_s = detail::seconds_since(t1);
    const auto t2 = std::chrono::steady_clock::now();
    std::size_t at = 0;
    for (std::size_t rank = 0; rank < sizes_.size(); ++rank) {
      throw_if_invalid(c.validate(std::span<const std::byte>(w.gathered.data() + at, sizes_[rank])),
                       static_cast<int>(rank));
      at += sizes_[rank];
    }
    c.zero(buf.grad);
    const float inv = 1.0f / static_cast<float>(comm.size());
    at = 0;
    for (std::size_t rank = 0; rank < sizes_.size(); ++rank) {
      c.decompress_add(std::span<const std::byte>(w.gathered.data() + at, sizes_[rank]), buf.grad, inv);
      at += sizes_[rank];
    }
    c.synchronize();
    r.decompress_s = detail::seconds_since(t2);
    r.bytes_sent = bytes;
    r.collective = collective_kind::allgather;
  }

  layout layout_;
  dense_allreduce dense_;  // all-dense steps
  bool last_dense_ = false;
  workspace_slot other_space_;  // space_workspace<Space> of a device compressor
  std::vector<std::byte> packet_;
  std::vector<std::byte> gathered_;
  std::vector<std::size_t> sizes_;
  std::size_t last_bytes_ = 0;
};
static_assert(Collective<allgather>);

}  // namespace gravac
