#pragma once
//! \file
//! \brief The NCCL engine (target gravac::nccl): float buffers in device memory, one rank
//! per GPU. Every NCCL and CUDA call is wrapped (GRAVAC_TRY_NCCL / GRAVAC_TRY_CUDA); the
//! communicator is non-blocking, every operation is waited for by polling the stream and
//! ncclCommGetAsyncError with a timeout, and a failed or hung communicator is aborted with
//! ncclCommAbort, so a failure becomes a gravac::error instead of a hang.

#include "gravac/cuda/detail/nvcc_flags.hpp"
// (first, and apart from the includes below: a missing compiler option is one readable error)

#include <nccl.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "gravac/comm/detail/mpi_abort.hpp"
#include "gravac/comm/mpi_communicator.hpp"  // the unique-id exchange, and mpi_world_rank for errors
#include "gravac/comm/sum_piece.hpp"
#include "gravac/concepts/concepts.hpp"
#include "gravac/cuda/detail/throw_nccl.hpp"
#include "gravac/cuda/device_buffer.hpp"
#include "gravac/cuda/stream.hpp"

//! Calls an NCCL function and throws gravac::error(backend_failure, backend::nccl) unless it
//! returns ncclSuccess or (non-blocking communicators) ncclInProgress. The error names this
//! process's MPI rank (NCCL runs one process per GPU beside MPI).
#define GRAVAC_TRY_NCCL(call)                                                                       \
  do {                                                                                              \
    const ncclResult_t gravac_nccl_status_ = (call);                                                \
    if (gravac_nccl_status_ != ncclSuccess && gravac_nccl_status_ != ncclInProgress)                \
      ::gravac::detail::throw_nccl(gravac_nccl_status_, #call, ::gravac::detail::mpi_world_rank()); \
  } while (0)

//! Calls an NCCL function where throwing is not allowed (destructors).
#define GRAVAC_TRY_NCCL_NO_THROW(call) \
  do {                                 \
    (void)(call);                      \
  } while (0)

namespace gravac {

//! Options of nccl_communicator.
struct nccl_options {
  //! The stream that produces the operations' device inputs: each operation is ordered
  //! after the work queued on it so far (by an event; the default is the calling thread's
  //! per-thread default stream). NCCL itself runs on a stream the communicator owns.
  stream_ref stream{};
  double timeout_s = 300;  //!< an operation not complete after this long aborts the communicator
};

//! Creates an NCCL unique id on rank \p root of \p mpi and broadcasts it to every rank.
inline ncclUniqueId nccl_unique_id(mpi_communicator& mpi, int root = 0) {
  ncclUniqueId id;
  std::memset(&id, 0, sizeof id);
  if (mpi.rank() == root) GRAVAC_TRY_NCCL(ncclGetUniqueId(&id));
  mpi.broadcast(std::as_writable_bytes(std::span<ncclUniqueId>(&id, 1)), root);
  return id;
}

class nccl_communicator;

namespace detail {

//! An NCCL group closed on every path. NCCL's group depth belongs to the calling thread: a
//! call that throws between ncclGroupStart and ncclGroupEnd would leave the thread inside
//! the group, and NCCL would defer every later call of that thread, on any communicator,
//! to a group end that never comes. On an exception the group is ended (its calls fail on
//! the communicator, which the owner aborts) instead.
template <class Owner>
class nccl_group {
 public:
  explicit nccl_group(Owner& owner) : owner_(owner) { GRAVAC_TRY_NCCL(ncclGroupStart()); }
  nccl_group(const nccl_group&) = delete;
  nccl_group& operator=(const nccl_group&) = delete;
  ~nccl_group() {
    if (!open_) return;
    (void)ncclGroupEnd();  // leaves the thread's group; the calls queued so far go out
    owner_.abort();        // the other ranks may wait for this group: they fail instead of hanging
  }
  //! Ends the group (queues its calls).
  void end() {
    open_ = false;
    GRAVAC_TRY_NCCL(ncclGroupEnd());
  }

 private:
  Owner& owner_;
  bool open_ = true;
};

}  // namespace detail

//! The NCCL engine. Models AlltoallCommunicator over device memory: float spans passed to
//! allreduce_sum, broadcast, allgatherv and alltoallv are device memory (allgatherv and
//! alltoallv also accept a host input and stage it); double spans (statistics) are host
//! memory, as the concept says. Besides the concept it sums pieces of a packet in their own
//! type, 16-bit floats included (allreduce_sum_pieces, the 16-bit path of
//! compressed_allreduce). Every operation returns when it has completed. Uses the device
//! current at construction.
//!
//! Streams: the communicator is non-blocking, so NCCL queues a call's kernels from a thread
//! of its own, where cudaStreamPerThread would name that thread's stream. NCCL therefore
//! runs on a non-blocking stream the communicator owns, never on a default stream; each
//! operation first waits (an event) for nccl_options::stream, and for the stream that
//! allocates an output buffer it grows; the workspaces are allocated and freed on the
//! owned stream; host results come back through pinned memory, so that every wait polls
//! and nccl_options::timeout_s can fire.
class nccl_communicator {
 public:
  //! Opt-in tag for the Communicator concept.
  using communicator_tag = void;
  //! Buffers live in device memory.
  using memory_space = cuda_space;
  //! allgatherv's output buffer (device memory).
  using byte_buffer = device_byte_buffer;

  //! Joins the communicator of \p size ranks identified by \p id as rank \p rank.
  nccl_communicator(const ncclUniqueId& id, int rank, int size, const nccl_options& opt = {})
      : rank_(rank), size_(size), options_(opt) {
    require(size >= 1 && rank >= 0 && rank < size, "nccl_communicator: rank out of range");
    require(opt.timeout_s > 0, "nccl_communicator: timeout_s must be positive");
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;  // every call returns at once; wait() polls with a timeout
    GRAVAC_TRY_CUDA(cudaEventCreateWithFlags(&ordered_, cudaEventDisableTiming));
    GRAVAC_TRY_NCCL(ncclCommInitRankConfig(&comm_, size, id, rank, &config));
    wait_comm("ncclCommInitRankConfig");
    scratch_.set_stream(own_);
    staging_.set_stream(own_);
    sizes_dev_.set_stream(own_);
    sizes_dev_.resize(static_cast<std::size_t>(size));
    host_sizes_.resize(static_cast<std::size_t>(size));
    // alltoallv's counts: the N sent, then the N received, in one device buffer.
    counts_dev_.set_stream(own_);
    counts_dev_.resize(2 * static_cast<std::size_t>(size));
    host_counts_.resize(2 * static_cast<std::size_t>(size));
    // host_reduce's staging: sized for the device trainer's flags and statistics (see
    // initial_host_values), grown without freeing if a reduction is larger.
    scratch_.resize(initial_host_values);
    host_values_.resize(initial_host_values);
  }
  //! Creates the unique id on rank 0 of \p mpi, exchanges it over MPI, and joins with
  //! mpi's rank and size.
  explicit nccl_communicator(mpi_communicator& mpi, const nccl_options& opt = {})
      : nccl_communicator(nccl_unique_id(mpi), mpi.rank(), mpi.size(), opt) {}
  nccl_communicator(const nccl_communicator&) = delete;
  nccl_communicator& operator=(const nccl_communicator&) = delete;
  //! Destroys the communicator (aborts it when it failed); never throws.
  ~nccl_communicator() {
    if (ordered_) GRAVAC_TRY_CUDA_NO_THROW(cudaEventDestroy(ordered_));
    if (!comm_) return;
    if (failed_) {
      GRAVAC_TRY_NCCL_NO_THROW(ncclCommAbort(comm_));
    } else {
      GRAVAC_TRY_NCCL_NO_THROW(ncclCommFinalize(comm_));
      // Non-blocking finalize: wait a bounded time, then destroy (or abort on trouble).
      const auto t0 = std::chrono::steady_clock::now();
      ncclResult_t st = ncclInProgress;
      while (ncclCommGetAsyncError(comm_, &st) == ncclSuccess && st == ncclInProgress &&
             std::chrono::steady_clock::now() - t0 < std::chrono::duration<double>(options_.timeout_s))
        std::this_thread::yield();
      if (st == ncclSuccess)
        GRAVAC_TRY_NCCL_NO_THROW(ncclCommDestroy(comm_));
      else
        GRAVAC_TRY_NCCL_NO_THROW(ncclCommAbort(comm_));
    }
  }

  //! This rank.
  [[nodiscard]] int rank() const noexcept { return rank_; }
  //! Number of ranks.
  [[nodiscard]] int size() const noexcept { return size_; }
  //! The native communicator.
  [[nodiscard]] ncclComm_t native() const noexcept { return comm_; }
  //! The stream whose earlier work the operations are ordered after (nccl_options::stream).
  [[nodiscard]] stream_ref stream() const noexcept { return options_.stream; }
  //! The stream NCCL runs on (owned; non-blocking).
  [[nodiscard]] stream_ref nccl_stream() const noexcept { return own_; }

  //! Sums device floats over all ranks, in place.
  void allreduce_sum(std::span<float> data) {
    require_live("ncclAllReduce(float, sum)");
    if (data.empty()) return;
    order_after(options_.stream);
    GRAVAC_TRY_NCCL(ncclAllReduce(data.data(), data.data(), data.size(), ncclFloat, ncclSum, comm_, s()));
    wait("ncclAllReduce(float, sum)");
  }
  //! Sums host doubles (statistics) over all ranks, in place.
  void allreduce_sum(std::span<double> data) { host_reduce(data, ncclSum, "ncclAllReduce(double, sum)"); }
  //! Elementwise maximum of host doubles over all ranks, in place.
  void allreduce_max(std::span<double> data) { host_reduce(data, ncclMax, "ncclAllReduce(double, max)"); }

  //! Stages reductions of up to \p doubles host doubles (allreduce_sum, allreduce_max) so
  //! that none allocates: a larger one would grow the pinned staging in the step, and
  //! cudaMallocHost synchronizes the whole device. Call between steps (it may allocate and
  //! free pinned memory, which synchronizes the device); the trainer calls it at
  //! construction with the most values one reduction of its device step carries. Never
  //! shrinks.
  void reserve_host_staging(std::size_t doubles) {
    if (host_values_.size() >= doubles) return;
    host_values_.resize(doubles);
    scratch_.resize(doubles);  // as large (stream-ordered, on NCCL's stream)
  }

  //! Gathers every rank's bytes back to back in rank order into device memory, without
  //! padding to the largest: the sizes are gathered first, then one group of broadcasts
  //! (one per non-empty rank) writes each rank's bytes at its exact offset.
  void allgatherv(std::span<const std::byte> mine, byte_buffer& out, std::vector<std::size_t>& sizes) {
    require_live("allgatherv");
    const auto n = static_cast<std::size_t>(size_);
    order_after(options_.stream);
    host_sizes_[static_cast<std::size_t>(rank_)] = mine.size();
    GRAVAC_TRY_CUDA(cudaMemcpyAsync(sizes_dev_.data() + rank_, host_sizes_.data() + rank_, sizeof(std::uint64_t),
                                    cudaMemcpyHostToDevice, s()));
    GRAVAC_TRY_NCCL(ncclAllGather(sizes_dev_.data() + rank_, sizes_dev_.data(), 1, ncclUint64, comm_, s()));
    // Non-blocking mode: an operation that returned ncclInProgress is on the stream only once
    // the communicator is ready; a copy queued before that would run ahead of it.
    wait_comm("ncclAllGather(sizes)");
    GRAVAC_TRY_CUDA(
        cudaMemcpyAsync(host_sizes_.data(), sizes_dev_.data(), n * sizeof(std::uint64_t), cudaMemcpyDeviceToHost, s()));
    wait("ncclAllGather(sizes)");
    sizes.resize(n);
    std::size_t total = 0;
    for (std::size_t r = 0; r < n; ++r) {
      sizes[r] = static_cast<std::size_t>(host_sizes_[r]);
      total += sizes[r];
    }
    out.resize(total);
    order_after(out.stream());  // a grown buffer is allocated in the order of its own stream
    const std::byte* src = mine.data();
    if (!mine.empty() && !is_device_pointer(src)) {  // a host input (e.g. the trainer's layout check)
      staging_.resize(mine.size());
      GRAVAC_TRY_CUDA(cudaMemcpyAsync(staging_.data(), src, mine.size(), cudaMemcpyHostToDevice, s()));
      src = staging_.data();
    }
    detail::nccl_group group(*this);
    std::size_t at = 0;
    for (std::size_t r = 0; r < n; ++r) {
      if (sizes[r] > 0)
        GRAVAC_TRY_NCCL(ncclBroadcast(static_cast<int>(r) == rank_ ? static_cast<const void*>(src) : nullptr,
                                      out.data() + at, sizes[r], ncclChar, static_cast<int>(r), comm_, s()));
      at += sizes[r];
    }
    group.end();
    wait("ncclBroadcast group (allgatherv)");
  }

  //! Personalised all-to-all of variable-length blocks (thread_communicator::alltoallv):
  //! block j of \p send (send_sizes[j] bytes, blocks back to back in rank order) reaches
  //! rank j, and \p out receives the blocks addressed to this rank back to back in
  //! source-rank order (recv_sizes[i] bytes from rank i), in device memory.
  //!
  //! The block sizes are exchanged first, as mpi_communicator does with an MPI_Alltoall of
  //! counts: here one group of ncclSend/ncclRecv of one count per peer. An ncclAllGather of
  //! the count rows would be one collective too, but it moves N x N counts to every rank
  //! where the pairwise exchange moves N, and it runs over the ring while the blocks that
  //! follow go to every peer directly, so the pairwise exchange also opens the very
  //! connections the data uses. Then one group of ncclSend/ncclRecv per peer moves exactly
  //! those bytes (an empty block is neither sent nor received: both sides know its size);
  //! this rank's own block is a device copy. A host \p send is staged to the device first.
  void alltoallv(std::span<const std::byte> send, std::span<const std::size_t> send_sizes, byte_buffer& out,
                 std::vector<std::size_t>& recv_sizes) {
    require_live("alltoallv");
    const auto n = static_cast<std::size_t>(size_);
    const auto me = static_cast<std::size_t>(rank_);
    require(send_sizes.size() == n, "alltoallv: send_sizes needs one entry per rank");
    std::size_t sent = 0;
    for (std::size_t j = 0; j < n; ++j) sent += send_sizes[j];
    require(sent == send.size(), "alltoallv: the blocks' sizes do not add up to the send buffer");
    order_after(options_.stream);
    // 1. The sizes: host_counts_[j] to rank j, host_counts_[n + i] from rank i.
    for (std::size_t j = 0; j < n; ++j) host_counts_[j] = send_sizes[j];
    host_counts_[n + me] = send_sizes[me];
    if (n > 1) {
      GRAVAC_TRY_CUDA(cudaMemcpyAsync(counts_dev_.data(), host_counts_.data(), n * sizeof(std::uint64_t),
                                      cudaMemcpyHostToDevice, s()));
      detail::nccl_group group(*this);
      for (std::size_t j = 0; j < n; ++j) {
        if (j == me) continue;
        GRAVAC_TRY_NCCL(ncclSend(counts_dev_.data() + j, 1, ncclUint64, static_cast<int>(j), comm_, s()));
        GRAVAC_TRY_NCCL(ncclRecv(counts_dev_.data() + n + j, 1, ncclUint64, static_cast<int>(j), comm_, s()));
      }
      group.end();
      // Non-blocking mode: the group is on the stream only once the communicator is ready.
      wait_comm("alltoallv (its exchange of sizes)");
      GRAVAC_TRY_CUDA(cudaMemcpyAsync(host_counts_.data() + n, counts_dev_.data() + n, n * sizeof(std::uint64_t),
                                      cudaMemcpyDeviceToHost, s()));
      wait("alltoallv (its exchange of sizes)");
      host_counts_[n + me] = send_sizes[me];  // the copy back wrote this rank's unused slot
    }
    recv_sizes.resize(n);
    std::size_t total = 0;
    for (std::size_t i = 0; i < n; ++i) total += recv_sizes[i] = static_cast<std::size_t>(host_counts_[n + i]);
    out.resize(total);
    order_after(out.stream());
    // 2. The blocks.
    const std::byte* src = send.data();
    if (!send.empty() && !is_device_pointer(src)) {
      staging_.resize(send.size());
      GRAVAC_TRY_CUDA(cudaMemcpyAsync(staging_.data(), src, send.size(), cudaMemcpyHostToDevice, s()));
      src = staging_.data();
    }
    std::size_t send_at = 0, recv_at = 0, own_from = 0, own_to = 0;
    bool any = false;
    for (std::size_t j = 0; j < n; ++j) {
      if (j == me) {
        own_from = send_at;
        own_to = recv_at;
      } else {
        any = any || send_sizes[j] > 0 || recv_sizes[j] > 0;
      }
      send_at += send_sizes[j];
      recv_at += recv_sizes[j];
    }
    if (send_sizes[me] > 0)
      GRAVAC_TRY_CUDA(
          cudaMemcpyAsync(out.data() + own_to, src + own_from, send_sizes[me], cudaMemcpyDeviceToDevice, s()));
    if (any) {
      detail::nccl_group group(*this);
      send_at = recv_at = 0;
      for (std::size_t j = 0; j < n; ++j) {
        const int peer = static_cast<int>(j);
        if (j != me && send_sizes[j] > 0)
          GRAVAC_TRY_NCCL(ncclSend(src + send_at, send_sizes[j], ncclChar, peer, comm_, s()));
        if (j != me && recv_sizes[j] > 0)
          GRAVAC_TRY_NCCL(ncclRecv(out.data() + recv_at, recv_sizes[j], ncclChar, peer, comm_, s()));
        send_at += send_sizes[j];
        recv_at += recv_sizes[j];
      }
      group.end();
    }
    wait("ncclSend/ncclRecv group (alltoallv)");
  }

  //! Copies \p in (device memory) to \p out and sums every piece of \p out over all ranks,
  //! in place and in the piece's own type: ncclFloat, ncclHalf or ncclBfloat16, so 16-bit
  //! values are added in 16 bits (every partial sum rounded to the format, in the order
  //! NCCL's ring or tree chooses). The bytes between pieces stay those of \p in. Every rank
  //! passes the same pieces of the same total length. One group of Allreduces (a few when
  //! there are many pieces), then one wait.
  void allreduce_sum_pieces(std::span<const std::byte> in, std::span<std::byte> out,
                            std::span<const sum_piece> pieces) {
    require_live("allreduce_sum_pieces");
    require(out.size() >= in.size(), "allreduce_sum_pieces: the output is shorter than the input");
    for (const auto& pc : pieces) {
      const std::size_t w = sum_type_bytes(pc.type);
      require(pc.offset % w == 0 && pc.offset <= in.size() && pc.count <= (in.size() - pc.offset) / w,
              "allreduce_sum_pieces: a piece lies outside the buffer or is misaligned");
    }
    order_after(options_.stream);
    if (!in.empty() && in.data() != out.data())
      GRAVAC_TRY_CUDA(cudaMemcpyAsync(out.data(), in.data(), in.size(), cudaMemcpyDeviceToDevice, s()));
    // A bounded number of operations per group: older NCCL releases cap a group's size.
    constexpr std::size_t per_group = 256;
    std::size_t queued = 0;
    std::optional<detail::nccl_group<nccl_communicator>> group;
    for (const auto& pc : pieces) {
      if (pc.count == 0) continue;
      if (queued == 0) group.emplace(*this);
      std::byte* at = out.data() + pc.offset;
      GRAVAC_TRY_NCCL(ncclAllReduce(at, at, pc.count, nccl_type(pc.type), ncclSum, comm_, s()));
      if (++queued == per_group) {
        group->end();
        group.reset();
        wait_comm("ncclAllReduce group (allreduce_sum_pieces)");
        queued = 0;
      }
    }
    if (group) group->end();
    wait("ncclAllReduce group (allreduce_sum_pieces)");
  }

  //! Copies \p root's device bytes into every rank's \p data.
  void broadcast(std::span<std::byte> data, int root) {
    require(root >= 0 && root < size_, "broadcast: root out of range");
    require_live("ncclBroadcast");
    if (data.empty()) return;
    order_after(options_.stream);
    GRAVAC_TRY_NCCL(ncclBroadcast(data.data(), data.data(), data.size(), ncclChar, root, comm_, s()));
    wait("ncclBroadcast");
  }
  //! Copies \p root's device values into every rank's \p data.
  template <class T>
  void broadcast_values(std::span<T> data, int root) {
    broadcast(std::as_writable_bytes(data), root);
  }

  //! Waits for every rank (an allreduce of one value).
  void barrier() {
    require_live("ncclAllReduce(barrier)");
    scratch_.resize(1);
    GRAVAC_TRY_NCCL(ncclAllReduce(scratch_.data(), scratch_.data(), 1, ncclDouble, ncclSum, comm_, s()));
    wait("ncclAllReduce(barrier)");
  }

  //! This rank gives up a step whose NCCL calls the other ranks may already be in (its
  //! trainer was destroyed between begin_step and finish: communicator_ref::abandon). When
  //! MPI is initialised (the unique id came over MPI) it ends the job as
  //! mpi_communicator::abandon does: one line on stderr naming this rank and \p why, then
  //! MPI_Abort, so every rank ends at once instead of at its NCCL timeout. Without MPI it
  //! only prints that line: aborting the NCCL communicator here could race with the
  //! communication thread inside a call on it, and the other ranks' calls fail at
  //! nccl_options::timeout_s (an error naming the operation, not a hang).
  void abandon(const std::string& why) noexcept {
    int up = 0, down = 0;
    MPI_Initialized(&up);
    if (up) MPI_Finalized(&down);
    if (up && !down) detail::abort_job(MPI_COMM_WORLD, why.c_str(), mpi_abort_code);
    std::fprintf(stderr,
                 "gravac: NCCL rank %d of %d: %s (no MPI to end the job: the other ranks fail at their timeout)\n",
                 rank_, size_, why.c_str());
  }

  //! Aborts the communicator: pending and future operations fail (never hang). Used when
  //! another rank has failed; never throws.
  void abort() noexcept {
    if (comm_ && !failed_) {
      failed_ = true;
      GRAVAC_TRY_NCCL_NO_THROW(ncclCommAbort(comm_));
      comm_ = nullptr;
    }
  }

 private:
  [[nodiscard]] cudaStream_t s() const noexcept { return own_.ref().get(); }

  // Every operation starts here: an aborted communicator fails with status::aborted
  // before any NCCL call (NCCL itself would only see a null communicator).
  void require_live(const char* what) const {
    if (!comm_)
      throw error(status::aborted, std::string(what) + ": the communicator was aborted", rank_, backend::nccl);
  }

  // The owned stream waits for the work queued so far on \p producer (resolved on the
  // calling thread, as the caller queued it).
  void order_after(stream_ref producer) {
    GRAVAC_TRY_CUDA(cudaEventRecord(ordered_, producer.get()));
    GRAVAC_TRY_CUDA(cudaStreamWaitEvent(s(), ordered_, 0));
  }

  static ncclDataType_t nccl_type(sum_type t) noexcept {
    switch (t) {
      case sum_type::f16:
        return ncclHalf;
      case sum_type::bf16:
        return ncclBfloat16;
      default:
        return ncclFloat;
    }
  }

  static bool is_device_pointer(const void* p) {
    cudaPointerAttributes a{};
    if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
      (void)cudaGetLastError();
      return false;
    }
    return a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged;
  }

  // Host values go through pinned staging both ways: a copy into pageable memory would
  // block the host until the allreduce ends, where no timeout can interrupt it.
  void host_reduce(std::span<double> data, ncclRedOp_t op, const char* what) {
    require_live(what);
    if (data.empty()) return;
    if (host_values_.size() < data.size()) {  // beyond what was reserved (see initial_host_values)
      // The old pinned staging is kept, not freed: cudaFreeHost would synchronize the device.
      detail::grow_pinned_keeping(host_values_, data.size(), retired_host_values_);
      scratch_.resize(host_values_.size());  // as large (stream-ordered: cudaFreeAsync on NCCL's stream)
    }
    std::copy(data.begin(), data.end(), host_values_.data());
    GRAVAC_TRY_CUDA(
        cudaMemcpyAsync(scratch_.data(), host_values_.data(), data.size_bytes(), cudaMemcpyHostToDevice, s()));
    GRAVAC_TRY_NCCL(ncclAllReduce(scratch_.data(), scratch_.data(), data.size(), ncclDouble, op, comm_, s()));
    wait_comm(what);  // on the stream before the copy back (see allgatherv)
    GRAVAC_TRY_CUDA(
        cudaMemcpyAsync(host_values_.data(), scratch_.data(), data.size_bytes(), cudaMemcpyDeviceToHost, s()));
    wait(what);
    std::copy(host_values_.data(), host_values_.data() + data.size(), data.begin());
  }

  // Fails (and aborts) when the communicator reports an error or the deadline passes.
  void check_async(const char* what, std::chrono::steady_clock::time_point t0, bool& in_progress) {
    if (!comm_)
      throw error(status::aborted, std::string(what) + ": the communicator was aborted", rank_, backend::nccl);
    ncclResult_t st = ncclSuccess;
    const ncclResult_t q = ncclCommGetAsyncError(comm_, &st);
    if (q != ncclSuccess) st = q;
    in_progress = st == ncclInProgress;
    if (st != ncclSuccess && st != ncclInProgress) {
      abort();
      detail::throw_nccl(st, what, rank_);
    }
    if (std::chrono::steady_clock::now() - t0 > std::chrono::duration<double>(options_.timeout_s)) {
      abort();
      throw error(status::timeout,
                  std::string(what) + ": not complete after " + std::to_string(options_.timeout_s) +
                      " s; the communicator was aborted",
                  rank_, backend::nccl);
    }
  }
  // Waits until the communicator's pending calls are issued (non-blocking mode).
  void wait_comm(const char* what) {
    const auto t0 = std::chrono::steady_clock::now();
    bool busy = true;
    for (;;) {
      check_async(what, t0, busy);
      if (!busy) return;
      std::this_thread::yield();
    }
  }
  // Waits for the stream (and so the operation) to complete, polling for NCCL errors.
  void wait(const char* what) {
    const auto t0 = std::chrono::steady_clock::now();
    bool busy = true;
    for (;;) {
      check_async(what, t0, busy);
      if (!busy) {
        const cudaError_t q = cudaStreamQuery(s());
        if (q == cudaSuccess) {
          check_async(what, t0, busy);  // an error raised while the stream finished
          return;
        }
        if (q != cudaErrorNotReady) {
          abort();
          detail::throw_cuda(q, what, rank_);
        }
        (void)cudaGetLastError();
      }
      std::this_thread::yield();
    }
  }

  // Doubles host_reduce stages without growing until reserve_host_staging asks for more
  // (the trainer does at construction, for its layout's statistics): the non-finite flags
  // (2), the layout check (8) and, for up to about 125 layers, the statistics (2 per layer,
  // the gain, the gain curve, the previous times). A larger reduction nobody reserved grows
  // the staging in the step (cudaMallocHost, which synchronizes the device: the tests count
  // it), at least doubling, and keeps the old pinned memory until the communicator is
  // destroyed (retired_host_values_): host_reduce never frees pinned memory.
  static constexpr std::size_t initial_host_values = 256;

  int rank_ = 0;
  int size_ = 1;
  nccl_options options_;
  cuda_stream own_;  // NCCL's stream: declared before the buffers that are freed on it
  cudaEvent_t ordered_ = nullptr;
  ncclComm_t comm_ = nullptr;
  bool failed_ = false;
  device_buffer<double> scratch_;
  device_byte_buffer staging_;
  device_buffer<std::uint64_t> sizes_dev_;
  pinned_buffer<std::uint64_t> host_sizes_;
  device_buffer<std::uint64_t> counts_dev_;  // alltoallv: counts sent (N), then received (N)
  pinned_buffer<std::uint64_t> host_counts_;
  pinned_buffer<double> host_values_;                       // host_reduce's staging
  std::vector<pinned_buffer<double>> retired_host_values_;  // outgrown staging, freed with the communicator
};
static_assert(AlltoallCommunicator<nccl_communicator>);

}  // namespace gravac
