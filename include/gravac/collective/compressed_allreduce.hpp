#pragma once
//! \file compressed_allreduce.hpp
//! \brief An Allreduce in the compressed domain: a reduce-scatter of compressed shards, an
//! fp32 sum per shard, a second compression of each shard with an error-feedback residual
//! of its own, and an Allgather of the recompressed shards. What a rank sends and receives
//! stays about 2(N-1)/N times the compressed gradient, whatever the number of ranks N,
//! where an Allgather of whole packets brings N-1 of them to every rank.

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "gravac/collective/dense_allreduce.hpp"
#include "gravac/collective/detail/shard_plan.hpp"
#include "gravac/collective/detail/space_ops.hpp"
#include "gravac/collective/detail/space_workspace.hpp"
#include "gravac/collective/step_buffers.hpp"
#include "gravac/comm/sum_piece.hpp"
#include "gravac/concepts/concepts.hpp"
#include "gravac/core/detail/bucket_states.hpp"
#include "gravac/core/detail/random.hpp"
#include "gravac/core/memory.hpp"
#include "gravac/network/wire_bytes.hpp"
#include "gravac/packet/format.hpp"

namespace gravac {

namespace detail {
//! The packets of compressed_allreduce's 16-bit path in memory space \p Space.
template <class Space>
struct piece_sum_workspace {
  typename default_byte_buffer<Space>::type packet;  //!< this rank's packet
  typename default_byte_buffer<Space>::type summed;  //!< the packet with its pieces summed over the ranks
};

//! The buffers of compressed_allreduce's two stages in memory space \p Space (the host's
//! or the device's: the one body reads and writes them through space_ops::shard_staging).
template <class Space>
struct shard_workspace {
  typename storage_for<Space>::type stage;    //!< shard-major staging of the gradient (every shard back to back)
  typename storage_for<Space>::type average;  //!< this rank's shard: the average of the N packets
  //! This rank's shard: the second stage's residual (state, saved with the checkpoint).
  typename storage_for<Space>::type server_residual;
  typename storage_for<Space>::type server_before;          //!< the server residual before the last step (return_sent)
  typename default_byte_buffer<Space>::type send;           //!< this rank's N shard packets, back to back
  typename default_byte_buffer<Space>::type received;       //!< the N packets of this rank's shard
  typename default_byte_buffer<Space>::type server_packet;  //!< this rank's recompressed shard
  typename default_byte_buffer<Space>::type gathered;       //!< every rank's recompressed shard
};

//! Device compressors that can run on shards: they say so (`runs_on_shards`, the device
//! quantizers but cast16_cuda, whose path is the 16-bit sum), and have the stream-ordered
//! members the device staging uses.
template <class C>
concept device_shardable = !C::memory_space::host_accessible && requires(const C& c) {
  requires C::runs_on_shards;
  c.stream();
  c.synchronize();
};
}  // namespace detail

//! Options of the compressed allreduce.
struct compressed_allreduce_options {
  //! Keep the second stage's own residual (1-bit Adam's "server" error): what the second
  //! compression of a shard's average leaves out is added to that shard's next average.
  //! Off, the second quantization's error is dropped every step (for ablations).
  bool server_error_feedback = true;
};

//! Compressors the compressed allreduce can run on shards: host memory, one packet per
//! compress (not low-rank), and options it can copy for the shards' own compressors
//! (`get_options()`, or options without members).
template <class C>
concept ShardableCompressor = Compressor<C> && !LowRankCompressor<C> && C::memory_space::host_accessible &&
                              (std::is_empty_v<typename C::options> || requires(const C& c) {
                                { c.get_options() } -> std::convertible_to<const typename C::options&>;
                              });

//! Device compressors the compressed allreduce runs on shards (qsgd_cuda, terngrad_cuda,
//! sign_cuda): device memory, one packet per compress, `runs_on_shards`, and options it
//! copies (`get_options()`, the stream included, so every shard's compressor queues on the
//! caller's stream). Kept apart from ShardableCompressor, which flexible prices with host
//! probes of the compressor.
template <class C>
concept DeviceShardableCompressor =
    Compressor<C> && !LowRankCompressor<C> && detail::device_shardable<C> && requires(const C& c) {
  { c.get_options() } -> std::convertible_to<const typename C::options&>;
};

//! Compressors whose packets a communicator can sum in place, piece by piece, in the
//! values' own type: `summed_pieces()` lists where the last packet's values lie (a span
//! of sum_piece); everything else in the packet is the same on every rank.
//! cast16_cuda is one (its 16-bit codes and its raw floats).
template <class C>
concept PieceSummableCompressor = Compressor<C> && requires(C& c) {
  { c.summed_pieces().size() } -> std::convertible_to<std::size_t>;
};

//! Communicators that sum those pieces in their own type over the ranks:
//! `allreduce_sum_pieces(in, out, pieces)` copies \p in to \p out and sums every piece of
//! \p out in place (nccl_communicator, which sums 16-bit floats in 16 bits).
template <class M, class C>
concept PieceSumCommunicator = Communicator<M> && PieceSummableCompressor<C> &&
    requires(M& m, C& c, std::span<const std::byte> in, std::span<std::byte> out) {
  m.allreduce_sum_pieces(in, out, c.summed_pieces());
};

//! The seed of the second compression: its random draws (stochastic rounding) must not
//! repeat the first stage's, which used the same shard layout.
constexpr std::uint64_t server_seed(std::uint64_t seed) noexcept {
  return detail::mix_seed(seed, 0x5345525645520001ull);
}

//! Reduce-scatter + Allgather of compressed shards with two-stage error feedback. Models Collective.
//!
//! With N ranks every layer is split into N contiguous shards (sizes differ by at most one;
//! a layer smaller than N leaves some shards empty), and shard j of every layer belongs to
//! rank j. One step on rank r:
//! 1. u = g + e is compressed shard by shard, by N compressors of the same kind and options
//!    over the shard layouts; each shard's residual goes back into e, so e = u - decompress
//!    of everything this rank sent (the invariant of error feedback).
//! 2. An alltoallv brings rank r the N packets of shard r; every one is validated before
//!    anything is decoded (a bad one throws naming its sender, the gradient intact).
//! 3. They are decoded and summed in fp32, in rank order, and divided by N.
//! 4. The average plus the shard's server residual is compressed again (seed
//!    server_seed(seed)), and the server residual keeps what that compression left out.
//! 5. An Allgather brings every rank the N recompressed shards (the step's control values
//!    ride as a trailer, as in allgather); all are validated, then decoded into the gradient.
//!
//! Every rank decodes the same packets in the same order, so the averaged gradient has the
//! same bits everywhere. A step that sends every layer dense is one dense Allreduce.
//! The communicator must have alltoallv (AlltoallCommunicator): mpi_communicator,
//! thread_communicator and their decorators do (nccl_communicator has one too, for device
//! memory); the host engines always run the two stages above with fp32 sums. The server residual is state: it is
//! saved and restored with the trainer's checkpoint (save/load), keyed by layer id and shard.
//!
//! The 16-bit path (a PieceSummableCompressor, i.e. cast16_cuda, on a PieceSumCommunicator,
//! i.e. nccl_communicator): the packet is compressed once, whole, and one Allreduce sums
//! its pieces in their own type (the codes in fp16 or bf16, as NCCL adds them; raw layers
//! in fp32). The summed packet is validated (an fp16 sum past 65504 is infinite and is
//! rejected on every rank, the gradient intact and the packet given back to the residual,
//! which holds u again), then decoded with the multiplier N and a scale of 1/N,
//! so the result is float(sum of the 16-bit codes) * N * (1/N). There is no second
//! compression and no server residual: the residual is the compressor's, u minus the
//! 16-bit value sent. Compiled; not yet run on a GPU.
//!
//! The two stages on device memory (a DeviceShardableCompressor: qsgd_cuda, terngrad_cuda,
//! sign_cuda, over nccl_communicator) are the same body: what differs is
//! detail::space_ops<Space>::shard_staging (the shard gathers and scatters are device copies
//! on the compressor's stream) and the workspace's buffers (device memory). The shards'
//! compressors have the host's shard layouts, names and random streams, so their packets
//! are the host quantizers' wherever the device quantizers equal the host's. The step's
//! control values are not carried on device memory (space_ops::carries_control). The server
//! residual lives in device memory; save() copies it to the host and load() back, in the
//! host's blob format. Compiled; not yet run on a GPU.
class compressed_allreduce {
 public:
  //! Opt-in tag for the Collective concept.
  using collective_tag = void;
  //! Options (see compressed_allreduce_options).
  using options = compressed_allreduce_options;
  //! Host compressors with one packet per compress whose options it can copy, and
  //! compressors whose packets can be summed piece by piece (cast16_cuda's 16-bit path).
  template <class C>
  static constexpr bool accepts = ShardableCompressor<C> || DeviceShardableCompressor<C> || PieceSummableCompressor<C>;
  //! Why it may refuse a compressor (the trainer's message).
  static constexpr bool rejects_low_rank = true;

  //! A collective for \p lay.
  compressed_allreduce(const layout& lay, const options& opt = {}) : layout_(lay), options_(opt), dense_(lay) {}

  //! Sizes the dense path for compressor \p c and keeps a factory for the shards' compressors.
  template <Compressor C>
  void prepare(const C& c) {
    static_assert(accepts<C>,
                  "compressed_allreduce: the compressor can neither run on shards nor be summed piece by piece");
    dense_.prepare(c);
    if constexpr (!on_shards<C>) {
      auto& w = pieces_.prepare<typename C::memory_space>();
      w.packet.resize(c.max_packet_bytes());
      w.summed.resize(c.max_packet_bytes());
    } else {
      prepare_shards(c);
    }
  }

  //! Gives back what the last step sent, when the trainer abandons it after the collective:
  //! this rank's shard packets return to its residual and the server residual is as before
  //! (on the 16-bit path, this rank's packet returns to its residual).
  template <Compressor C>
  void return_sent(C& c, step_buffers<typename C::memory_space>& buf) {
    if (last_dense_) return dense_.return_sent(c, buf);
    if constexpr (!on_shards<C>) {
      using space = typename C::memory_space;
      if (!sent_) return;
      auto& w = pieces_.get<space>("compressed_allreduce");
      c.decompress_add(std::span<const std::byte>(w.packet.data(), last_bytes_), buf.residual, 1.0f);
      detail::space_ops<space>::finish(c);
      sent_ = false;
    } else {
      return_sent_shards(c, buf);
    }
  }

  //! Runs one step: leaves the rank average of the recompressed shards in buf.grad (on the
  //! 16-bit path: the decoded 16-bit sum over the ranks, divided by N).
  template <Compressor C, Communicator M>
  void aggregate(C& c, M& comm, step_buffers<typename C::memory_space>& buf, const step_params& p, compress_stats& st,
                 step_report& r) {
    static_assert(CommunicatorFor<M, C>, "compressed_allreduce: the communicator must carry the compressor's memory");
    if constexpr (!on_shards<C>) {
      static_assert(PieceSumCommunicator<M, C>,
                    "compressed_allreduce: this compressor's path sums its packet's pieces in their own type and needs "
                    "a communicator with allreduce_sum_pieces (nccl_communicator, or the trainer's communicator_ref "
                    "over it)");
      last_dense_ = p.all_dense();
      if (last_dense_) return dense_.aggregate(c, comm, buf, p, st, r);
      aggregate_pieces(c, comm, buf, p, st, r);
    } else {
      aggregate_shards(c, comm, buf, p, st, r);
    }
  }

  //! The server residual of this rank's shard, in shard order (layer by layer), for a host
  //! compressor (a device compressor's is in device memory: save() copies it to the host).
  [[nodiscard]] std::span<const float> server_residual() const noexcept {
    const auto& r = shards_.get<host_space>("compressed_allreduce").server_residual;
    return {r.data(), r.size()};
  }
  //! The shard split of the last step (empty before the first).
  [[nodiscard]] const detail::shard_plan& plan() const noexcept { return plan_; }

 private:
  // Whether the two stages run for C (host or device shards); the 16-bit path otherwise.
  template <class C>
  static constexpr bool on_shards = ShardableCompressor<C> || DeviceShardableCompressor<C>;

  template <Compressor C>
  void prepare_shards(const C& c) {
    using space = typename C::memory_space;
    typename C::options opt{};
    if constexpr (requires { c.get_options(); }) opt = c.get_options();
    // A server residual already held in another space's buffers (or a device workspace about
    // to be replaced) waits in host memory for the next step's upload.
    if (plan_.size() && !loaded_) {
      if (download_) {
        download_(*this, pending_);
        loaded_ = true;
      } else if constexpr (!std::same_as<space, host_space>) {
        pending_ = shards_.get<host_space>("compressed_allreduce").server_residual;
        loaded_ = true;
      }
    }
    codec_ = std::make_unique<codec_of<C>>(opt);
    shards_.prepare<space>();
    if constexpr (std::same_as<space, host_space>) {
      download_ = nullptr;
      if (loaded_) {
        shards_.get<host_space>("compressed_allreduce").server_residual = std::move(pending_);
        pending_.clear();
        loaded_ = false;
      }
    } else {
      download_ = &download_residual<space>;
    }
    built_ = false;  // the new codec and workspace are sized at the next step
  }

  // Copies a device workspace's server residual to the host (save(), a re-prepare).
  template <class Space>
  static void download_residual(const compressed_allreduce& self, std::vector<float>& out) {
    const auto& w = self.shards_.get<Space>("compressed_allreduce");
    out.resize(w.server_residual.size());
    detail::space_ops<Space>::shard_staging::to_host(w.server_residual.data(), out.data(), out.size());
  }

  template <Compressor C>
  void return_sent_shards(C& c, step_buffers<typename C::memory_space>& buf) {
    using space = typename C::memory_space;
    using ops = detail::space_ops<space>;
    if (!sent_) return;
    auto& w = shards_.get<space>("compressed_allreduce");
    codec_->return_sent(plan_, std::span<float>(buf.residual.data(), buf.residual.size()),
                        std::span<const std::byte>(w.send.data(), w.send.size()), send_sizes_);
    ops::shard_staging::copy(c, w.server_before.data(), w.server_residual.data(), w.server_residual.size());
    ops::finish(c);
    sent_ = false;
  }

  // The 16-bit path: one compress, one Allreduce of the packet's pieces in their own type,
  // the summed packet validated and decoded with a scale of 1/N.
  template <Compressor C, Communicator M>
  void aggregate_pieces(C& c, M& comm, step_buffers<typename C::memory_space>& buf, const step_params& p,
                        compress_stats& st, step_report& r) {
    using space = typename C::memory_space;
    using ops = detail::space_ops<space>;
    // Refused before compressing, so the residual is untouched (a communicator_ref over an
    // engine without the piece sums satisfies the concept but throws when called).
    if constexpr (requires { comm.has_allreduce_sum_pieces(); })
      require(comm.has_allreduce_sum_pieces(),
              "compressed_allreduce: the communicator cannot sum 16-bit pieces (allreduce_sum_pieces: "
              "nccl_communicator)");
    auto& w = pieces_.get<space>("compressed_allreduce");
    const auto t0 = std::chrono::steady_clock::now();
    const std::size_t bytes =
        c.compress(buf.grad, buf.residual, p, std::span<std::byte>(w.packet.data(), w.packet.size()), st);
    last_bytes_ = bytes;
    sent_ = true;  // w.packet keeps this rank's packet until the next step (return_sent reads it)
    const auto pieces = c.summed_pieces();
    double summed_bytes = 0;
    for (const auto& pc : pieces) summed_bytes += static_cast<double>(pc.count * sum_type_bytes(pc.type));
    r.compress_s = detail::seconds_since(t0);
    const auto t1 = std::chrono::steady_clock::now();
    comm.allreduce_sum_pieces(std::span<const std::byte>(w.packet.data(), bytes),
                              std::span<std::byte>(w.summed.data(), bytes), pieces);
    r.communicate_s = detail::seconds_since(t1);
    const auto t2 = std::chrono::steady_clock::now();
    // The sum is checked before the gradient is touched: a 16-bit sum can overflow (fp16).
    // Every rank holds the same sum, so every rank refuses it; each first gives its packet
    // back to its residual (which then holds u again): the step sent nothing that counts.
    const std::span<const std::byte> sum(w.summed.data(), bytes);
    if (validation v = c.validate(sum); !v) {
      return_sent(c, buf);
      throw error(v.code,
                  "compressed_allreduce: the 16-bit sum over the ranks is rejected (an fp16 sum above 65504 "
                  "overflows; bf16 has the range of float): " +
                      v.reason);
    }
    ops::zero(c, buf.grad);
    c.decompress_add(sum, buf.grad, 1.0f / static_cast<float>(comm.size()));
    ops::finish(c);
    r.decompress_s = detail::seconds_since(t2);
    // Only the pieces travel (every rank writes the same headers and multipliers).
    r.bytes_sent = static_cast<std::size_t>(summed_bytes);
    set_wire_bytes(r, wire_bytes::allreduce(comm.size(), summed_bytes));
    r.collective = collective_kind::compressed_allreduce;
  }

  // The two stages (the class comment's steps 1 to 5), in any memory space: the buffers are
  // the workspace's, the copies and clears go through space_ops.
  template <Compressor C, Communicator M>
  void aggregate_shards(C& c, M& comm, step_buffers<typename C::memory_space>& buf, const step_params& p,
                        compress_stats& st, step_report& r) {
    using space = typename C::memory_space;
    using ops = detail::space_ops<space>;
    using staging = typename ops::shard_staging;
    static_assert(AlltoallCommunicator<M>, "compressed_allreduce: the communicator needs alltoallv");
    last_dense_ = p.all_dense();
    if (last_dense_) return dense_.aggregate(c, comm, buf, p, st, r);
    if constexpr (requires { comm.has_alltoallv(); })
      require(comm.has_alltoallv(),
              "compressed_allreduce: the communicator has no alltoallv (it needs an "
              "AlltoallCommunicator: mpi_communicator, thread_communicator, nccl_communicator or a decorator)");
    auto& w = shards_.get<space>("compressed_allreduce");
    ensure_plan(c, w, comm.size(), comm.rank());
    const auto n = static_cast<std::size_t>(comm.size());
    const auto me = static_cast<std::size_t>(comm.rank());
    const std::span<float> g(buf.grad.data(), buf.grad.size());
    const std::span<float> e(buf.residual.data(), buf.residual.size());
    const auto view = [](float* at, std::size_t count) { return grad_view<space>(at, count); };

    // 1. Compress u = g + e shard by shard; the shards' residuals go back into e.
    const auto t0 = std::chrono::steady_clock::now();
    st.reset(layout_.size(), p.gain_candidates.size());
    send_sizes_.resize(n);
    staging::resize(c, w.send, codec_->max_send_bytes());
    const std::span<float> stage(w.stage.data(), w.stage.size());
    std::size_t at = 0;
    for (std::size_t j = 0; j < n; ++j) {
      const std::size_t b = codec_->compress_shard(
          plan_, j, g, e, p, std::span<std::byte>(w.send.data(), w.send.size()).subspan(at), stage, st);
      send_sizes_[j] = b;
      at += b;
    }
    ops::finish(c);  // the residual's scatters are queued on the compressor's stream
    sent_ = true;    // w.send keeps the shard packets until the next step (return_sent reads them)
    r.compress_s = detail::seconds_since(t0);

    // 2. The N packets of this rank's shard.
    auto t1 = std::chrono::steady_clock::now();
    comm.alltoallv(std::span<const std::byte>(w.send.data(), at), send_sizes_, w.received, recv_sizes_);
    r.communicate_s = detail::seconds_since(t1);
    auto t2 = std::chrono::steady_clock::now();
    std::size_t from = 0;
    for (std::size_t rank = 0; rank < n; ++rank) {
      throw_if_invalid(codec_->validate(me, std::span<const std::byte>(w.received.data() + from, recv_sizes_[rank])),
                       static_cast<int>(rank));
      from += recv_sizes_[rank];
    }
    // 3. Their fp32 average, in rank order.
    const std::size_t mine = plan_.numel(me);
    staging::resize(c, w.average, mine);
    ops::zero(c, view(w.average.data(), mine));
    const float inv = 1.0f / static_cast<float>(n);
    from = 0;
    for (std::size_t rank = 0; rank < n; ++rank) {
      codec_->decode(me, std::span<const std::byte>(w.received.data() + from, recv_sizes_[rank]),
                     std::span<float>(w.average.data(), mine), inv);
      from += recv_sizes_[rank];
    }
    // 4. Compress the average again, with the shard's own residual.
    staging::resize(c, w.server_before, w.server_residual.size());
    staging::copy(c, w.server_residual.data(), w.server_before.data(), w.server_residual.size());
    if (!options_.server_error_feedback) ops::zero(c, view(w.server_residual.data(), w.server_residual.size()));
    server_params_ = p;
    server_params_.seed = server_seed(p.seed);
    step_control* ctl = nullptr;
    if constexpr (ops::carries_control) ctl = buf.control;
    staging::resize(c, w.server_packet, codec_->max_server_bytes() + (ctl ? ctl->trailer_bytes() : 0));
    const std::size_t own = codec_->compress_server(
        std::span<float>(w.average.data(), mine), std::span<float>(w.server_residual.data(), w.server_residual.size()),
        server_params_, std::span<std::byte>(w.server_packet.data(), w.server_packet.size()), server_stats_);
    std::size_t trailer = 0;
    if constexpr (ops::carries_control) {
      if (ctl) {
        ctl->seal(st);
        trailer = ctl->trailer_bytes();
        if (w.server_packet.size() < own + trailer) w.server_packet.resize(own + trailer);
        ctl->write_trailer(std::span<std::byte>(w.server_packet.data() + own, trailer));
      }
    }
    r.decompress_s = detail::seconds_since(t2);

    // 5. Every rank's recompressed shard, validated, then decoded into the gradient.
    const auto t3 = std::chrono::steady_clock::now();
    comm.allgatherv(std::span<const std::byte>(w.server_packet.data(), own + trailer), w.gathered, gathered_sizes_);
    r.communicate_s += detail::seconds_since(t3);
    const auto t4 = std::chrono::steady_clock::now();
    from = 0;
    for (std::size_t rank = 0; rank < n; ++rank) {
      if (gathered_sizes_[rank] < trailer)
        throw_if_invalid(validation{status::malformed_packet, "the packet is shorter than the step's control trailer"},
                         static_cast<int>(rank));
      throw_if_invalid(
          codec_->validate(rank, std::span<const std::byte>(w.gathered.data() + from, gathered_sizes_[rank] - trailer)),
          static_cast<int>(rank));
      from += gathered_sizes_[rank];
    }
    if constexpr (ops::carries_control) {
      if (ctl) {
        ctl->begin_sums();
        from = 0;
        for (std::size_t rank = 0; rank < n; ++rank) {
          from += gathered_sizes_[rank];
          ctl->add_trailer(std::span<const std::byte>(w.gathered.data() + from - trailer, trailer));
        }
      }
    }
    from = 0;
    for (std::size_t rank = 0; rank < n; ++rank) {
      const std::span<float> shard(stage.data() + plan_.start(rank), plan_.numel(rank));
      ops::zero(c, view(shard.data(), shard.size()));
      codec_->decode(rank, std::span<const std::byte>(w.gathered.data() + from, gathered_sizes_[rank] - trailer), shard,
                     1.0f);
      staging::scatter(c, plan_, rank, shard.data(), g.data());
      from += gathered_sizes_[rank];
    }
    ops::finish(c);
    r.decompress_s += detail::seconds_since(t4);

    // What went on the wire: the other ranks' shards out and in, then the Allgather.
    double out = 0, in = 0, total = 0;
    for (std::size_t rank = 0; rank < n; ++rank) {
      if (rank != me) {
        out += static_cast<double>(send_sizes_[rank]);
        in += static_cast<double>(recv_sizes_[rank]);
      }
      total += static_cast<double>(gathered_sizes_[rank]);
    }
    r.bytes_sent = static_cast<std::size_t>(out) + own + trailer;
    set_wire_bytes(r, wire_bytes::alltoall(comm.size(), out, in) +
                          wire_bytes::allgather(comm.size(), total, static_cast<double>(own + trailer)));
    r.collective = collective_kind::compressed_allreduce;
  }

 public:
  //! Saves the server residual with its key: rank count, shard, and each layer's id and
  //! piece length.
  void save(std::vector<std::byte>& out) const {
    out.clear();
    if (plan_.size() == 0) return;  // before the first step: nothing
    detail::put_u64(out, state_magic);
    detail::put_u64(out, plan_.size());
    detail::put_u64(out, shard_);
    const layout& mine = plan_.shard_layout(shard_);
    detail::put_u64(out, mine.size());
    for (std::size_t i = 0; i < mine.size(); ++i) {
      detail::put_u64(out, layout_[i].id);
      detail::put_u64(out, mine[i].numel);
    }
    // The values: the host workspace's, a loaded blob not yet uploaded, or a device
    // workspace's copied to the host (same format in every space).
    std::vector<float> copied;
    std::span<const float> values = server_residual();
    if (loaded_) {
      values = pending_;
    } else if (download_) {
      download_(*this, copied);
      values = copied;
    }
    const std::size_t at = out.size();
    out.resize(at + values.size() * sizeof(float));
    if (!values.empty()) std::memcpy(out.data() + at, values.data(), values.size() * sizeof(float));
  }
  //! Restores what save() wrote; checks every key against this layout and rejects a blob of
  //! another layout, rank count or length before changing anything.
  void load(std::span<const std::byte> in) {
    if (in.empty()) {
      plan_ = {};
      shards_.get<host_space>("compressed_allreduce").server_residual.clear();
      pending_.clear();
      loaded_ = false;
      built_ = false;
      return;
    }
    const auto fail = [](const std::string& why) {
      throw error(status::invalid_argument, "compressed_allreduce: the server residual " + why);
    };
    std::size_t at = 0;
    const auto u64 = [&]() {
      if (in.size() - at < 8) fail("is truncated");
      std::uint64_t v = 0;
      std::memcpy(&v, in.data() + at, 8);
      at += 8;
      return v;
    };
    if (u64() != state_magic) fail("has no header");
    const std::uint64_t ranks = u64(), shard = u64(), layers = u64();
    if (ranks == 0 || ranks > (1u << 24) || shard >= ranks)
      fail("names shard " + std::to_string(shard) + " of " + std::to_string(ranks));
    if (layers != layout_.size())
      fail("has " + std::to_string(layers) + " layers, the layout " + std::to_string(layout_.size()));
    std::size_t floats = 0;
    for (std::size_t i = 0; i < layout_.size(); ++i) {
      const std::uint64_t id = u64(), numel = u64();
      const std::size_t want =
          detail::shard_begin(layout_[i].numel, shard + 1, ranks) - detail::shard_begin(layout_[i].numel, shard, ranks);
      if (id != layout_[i].id || numel != want)
        fail("does not match layer '" + layout_[i].name + "' (another layout or rank count)");
      floats += want;
    }
    if (in.size() - at != floats * sizeof(float)) fail("has the wrong length");
    std::vector<float> values(floats);
    if (floats) std::memcpy(values.data(), in.data() + at, floats * sizeof(float));
    plan_ = detail::shard_plan(layout_, static_cast<std::size_t>(ranks));
    shard_ = static_cast<std::size_t>(shard);
    if (download_) {
      pending_ = std::move(values);  // uploaded to the device workspace at the next step
      loaded_ = true;
    } else {
      shards_.get<host_space>("compressed_allreduce").server_residual = std::move(values);
    }
    built_ = false;  // the next step builds the codec and sizes the staging for this plan
    sent_ = false;
  }

 private:
  static constexpr std::uint64_t state_magic = 0x5245565245535643ull;  // "CVSERVER"

  // The type-erased codecs of one compressor type: N shard compressors (stage 1 and the
  // decoders) and this rank's server compressor (stage 2).
  struct codec_base {
    virtual ~codec_base() = default;
    virtual void build(const detail::shard_plan& plan, std::size_t mine) = 0;
    [[nodiscard]] virtual std::size_t max_send_bytes() const = 0;
    [[nodiscard]] virtual std::size_t max_server_bytes() const = 0;
    // Spans of the compressor's memory space (device memory: never dereferenced here).
    virtual std::size_t compress_shard(const detail::shard_plan& plan, std::size_t j, std::span<const float> g,
                                       std::span<float> e, const step_params& p, std::span<std::byte> out,
                                       std::span<float> stage, compress_stats& st) = 0;
    virtual std::size_t compress_server(std::span<float> average, std::span<float> residual, const step_params& p,
                                        std::span<std::byte> out, compress_stats& st) = 0;
    [[nodiscard]] virtual validation validate(std::size_t shard, std::span<const std::byte> packet) const = 0;
    virtual void decode(std::size_t shard, std::span<const std::byte> packet, std::span<float> out, float scale) = 0;
    virtual void return_sent(const detail::shard_plan& plan, std::span<float> e, std::span<const std::byte> packets,
                             std::span<const std::size_t> sizes) = 0;
  };
  template <class C>
  struct codec_of final : codec_base {
    using space = typename C::memory_space;
    using staging = typename detail::space_ops<space>::shard_staging;
    explicit codec_of(const typename C::options& o) : opt(o) {}
    typename C::options opt;
    std::vector<std::unique_ptr<C>> shards;  // one per shard: compresses this rank's piece, decodes anyone's
    std::unique_ptr<C> server;               // compresses this rank's shard average
    std::size_t send_bound = 0;              // the shards' packet bounds, summed
    compress_stats piece;                    // one shard's statistics

    void build(const detail::shard_plan& plan, std::size_t mine) override {
      shards.clear();
      for (std::size_t j = 0; j < plan.size(); ++j) shards.push_back(std::make_unique<C>(plan.shard_layout(j), opt));
      server = std::make_unique<C>(plan.shard_layout(mine), opt);
      server_layers = plan.shard_layout(mine).size();
      send_bound = 0;
      for (const auto& s : shards) send_bound += s->max_packet_bytes();
    }
    [[nodiscard]] std::size_t max_send_bytes() const override { return send_bound; }
    [[nodiscard]] std::size_t max_server_bytes() const override { return server->max_packet_bytes(); }
    std::size_t compress_shard(const detail::shard_plan& plan, std::size_t j, std::span<const float> g,
                               std::span<float> e, const step_params& p, std::span<std::byte> out,
                               std::span<float> stage, compress_stats& st) override {
      // stage holds g's shard, then e's shard (after the g piece) while compressing.
      const C& sc = *shards[j];
      const std::size_t m = plan.numel(j);
      const std::size_t start = plan.start(j);
      float* gs = stage.data() + start;
      staging::gather(sc, plan, j, g.data(), gs);
      staging::resize(sc, e_piece, m);
      staging::gather(sc, plan, j, e.data(), e_piece.data());
      piece.reset(plan.shard_layout(j).size(), p.gain_candidates.size());
      const std::size_t bytes =
          shards[j]->compress(grad_view<space>(gs, m), grad_view<space>(e_piece.data(), m), p, out, piece);
      staging::scatter(sc, plan, j, e_piece.data(), e.data());
      add_stats(piece, st);
      return bytes;
    }
    std::size_t compress_server(std::span<float> average, std::span<float> residual, const step_params& p,
                                std::span<std::byte> out, compress_stats& st) override {
      // The residual has this shard's length (ensure_plan, load).
      st.reset(server_layers, p.gain_candidates.size());
      return server->compress(grad_view<space>(average.data(), average.size()),
                              grad_view<space>(residual.data(), residual.size()), p, out, st);
    }
    [[nodiscard]] validation validate(std::size_t shard, std::span<const std::byte> packet) const override {
      return shards[shard]->validate(packet);
    }
    void decode(std::size_t shard, std::span<const std::byte> packet, std::span<float> out, float scale) override {
      shards[shard]->decompress_add(packet, grad_view<space>(out.data(), out.size()), scale);
    }
    void return_sent(const detail::shard_plan& plan, std::span<float> e, std::span<const std::byte> packets,
                     std::span<const std::size_t> sizes) override {
      std::size_t at = 0;
      for (std::size_t j = 0; j < plan.size(); ++j) {
        const C& sc = *shards[j];
        const std::size_t m = plan.numel(j);
        staging::resize(sc, e_piece, m);
        staging::gather(sc, plan, j, e.data(), e_piece.data());
        shards[j]->decompress_add(packets.subspan(at, sizes[j]), grad_view<space>(e_piece.data(), m), 1.0f);
        staging::scatter(sc, plan, j, e_piece.data(), e.data());
        at += sizes[j];
      }
    }

   private:
    static void add_stats(const compress_stats& from, compress_stats& to) {
      for (std::size_t i = 0; i < from.layers.size() && i < to.layers.size(); ++i) {
        to.layers[i].kept += from.layers[i].kept;
        to.layers[i].grad_sq += from.layers[i].grad_sq;
        to.layers[i].input_sq += from.layers[i].input_sq;
        to.layers[i].kept_sq += from.layers[i].kept_sq;
      }
      for (std::size_t k = 0; k < from.candidate_kept_sq.size() && k < to.candidate_kept_sq.size(); ++k)
        to.candidate_kept_sq[k] += from.candidate_kept_sq[k];
      to.non_finite = to.non_finite || from.non_finite;
    }
    typename storage_for<space>::type e_piece;  // one shard of e while it is compressed or returned
    std::size_t server_layers = 0;
  };

  // Builds the shard plan, the codec and the workspace for n ranks on the first step (or
  // after prepare() or load()); the server residual starts at zero, or is the loaded one.
  template <Compressor C>
  void ensure_plan(const C& c, detail::shard_workspace<typename C::memory_space>& w, int n, int rank) {
    using space = typename C::memory_space;
    using ops = detail::space_ops<space>;
    using staging = typename ops::shard_staging;
    require(codec_ != nullptr, "compressed_allreduce: prepare() was not called");
    const auto ranks = static_cast<std::size_t>(n), mine = static_cast<std::size_t>(rank);
    if (plan_.size() == ranks && shard_ == mine && built_) return;
    bool fresh = false;
    if (plan_.size() != ranks || shard_ != mine) {
      require(plan_.size() == 0, "compressed_allreduce: the server residual was saved for shard " +
                                     std::to_string(shard_) + " of " + std::to_string(plan_.size()) +
                                     " ranks; this is rank " + std::to_string(rank) + " of " + std::to_string(n));
      plan_ = detail::shard_plan(layout_, ranks);
      shard_ = mine;
      fresh = true;
      loaded_ = false;
      pending_.clear();
    }
    if (fresh) {
      staging::resize(c, w.server_residual, plan_.numel(mine));
      ops::zero(c, grad_view<space>(w.server_residual.data(), w.server_residual.size()));
    } else if (loaded_) {
      staging::resize(c, w.server_residual, pending_.size());
      staging::from_host(c, pending_.data(), w.server_residual.data(), pending_.size());
      pending_.clear();
      loaded_ = false;
    }
    codec_->build(plan_, shard_);
    staging::resize(c, w.stage, layout_.numel());
    ops::zero(c, grad_view<space>(w.stage.data(), w.stage.size()));
    ops::finish(c);
    built_ = true;
  }

  layout layout_;
  options options_;
  dense_allreduce dense_;  // all-dense steps
  std::unique_ptr<codec_base> codec_;
  detail::shard_plan plan_;
  std::size_t shard_ = 0;
  bool built_ = false;
  bool last_dense_ = false;
  bool sent_ = false;  // the workspace's send holds the last step's shard packets
  step_params server_params_;
  compress_stats server_stats_;
  std::vector<std::size_t> send_sizes_, recv_sizes_, gathered_sizes_;
  detail::space_workspace<detail::shard_workspace> shards_;  // the two stages' buffers
  // A device workspace's server residual, copied to the host (null for host memory, whose
  // residual save() reads directly).
  void (*download_)(const compressed_allreduce&, std::vector<float>&) = nullptr;
  std::vector<float> pending_;  // a loaded (or re-prepared) server residual not yet in the workspace
  bool loaded_ = false;         // pending_ holds it
  detail::space_workspace<detail::piece_sum_workspace> pieces_;  // the 16-bit path's packets
  std::size_t last_bytes_ = 0;                                   // the 16-bit path's last packet
};
static_assert(Collective<compressed_allreduce>);

}  // namespace gravac
