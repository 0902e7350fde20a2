#pragma once
//! \file torch_process_group.hpp
//! \brief process_group_communicator: a Communicator over a torch.distributed process
//! group (c10d::ProcessGroup: Gloo, MPI or NCCL), so a trainer runs on the process group a
//! LibTorch or PyTorch program already has.
//!
//! \code
//! auto store = c10::make_intrusive<c10d::FileStore>(path, world);
//! auto pg = c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, world,
//!                                                       c10d::ProcessGroupGloo::Options::create());
//! gravac::process_group_communicator comm(pg);
//! gravac::trainer<gravac::topk, gravac::allgather, gravac::gravac_policy> t{comm, lay};
//! \endcode
//!
//! Host (CPU) memory: every call wraps the caller's buffer in a CPU tensor without copying
//! (from_blob), so the backend must take CPU tensors (Gloo, MPI). Link gravac::torch.

#include <torch/torch.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <utility>
#include <vector>

#include "gravac/comm/detail/padded_allgatherv.hpp"
#include "gravac/concepts/concepts.hpp"
#include "gravac/core/error.hpp"
#include "gravac/core/memory.hpp"

namespace gravac {

//! One rank of a c10d::ProcessGroup, as a host-memory Communicator and AlltoallCommunicator.
//!
//! Collectives map one to one where the process group has them (Allreduce, Broadcast,
//! Barrier, all-to-all with split sizes). The variable-length Allgather is two Allgathers,
//! since Gloo has no allgatherv: the sizes first, then every packet padded to the largest
//! (so a rank pays for the largest packet, which is what an Allgather of equal top-k
//! packets sends anyway). Every call waits for its work: the trainer's collectives are
//! blocking. Reductions run in the backend's order, which Gloo keeps the same on every rank
//! and in every run, so every rank gets the same bits.
//!
//! Calls may come from any thread, one at a time (the trainer's communication thread): the
//! process group queues them in call order, and every rank must call them in the same
//! order, as for any collective. Keep other users of the same process group (DDP's own
//! broadcasts, the program's collectives) out of a step, or give gravac a group of its own
//! (torch.distributed.new_group()).
class process_group_communicator {
 public:
  //! Opt-in tag for the Communicator concept.
  using communicator_tag = void;
  //! Buffers live in host memory.
  using memory_space = host_space;
  //! allgatherv's output buffer.
  using byte_buffer = std::vector<std::byte>;

  //! Communicates over \p group, which this object shares (keeps alive).
  explicit process_group_communicator(c10::intrusive_ptr<c10d::ProcessGroup> group) : group_(std::move(group)) {
    require(group_.defined(), "process_group_communicator: the process group is null");
  }

  //! This rank in the process group.
  [[nodiscard]] int rank() const { return group_->getRank(); }
  //! Ranks in the process group.
  [[nodiscard]] int size() const { return group_->getSize(); }
  //! The process group.
  [[nodiscard]] const c10::intrusive_ptr<c10d::ProcessGroup>& group() const noexcept { return group_; }
  //! True: the process group may be called from any thread, one call at a time.
  [[nodiscard]] bool accepts_calls_from_other_threads() const noexcept { return true; }

  //! Sums \p data over the ranks in place.
  void allreduce_sum(std::span<float> data) { reduce(data.data(), data.size(), torch::kFloat32, c10d::ReduceOp::SUM); }
  //! Sums \p data over the ranks in place.
  void allreduce_sum(std::span<double> data) { reduce(data.data(), data.size(), torch::kFloat64, c10d::ReduceOp::SUM); }
  //! Elementwise maximum over the ranks, in place.
  void allreduce_max(std::span<double> data) { reduce(data.data(), data.size(), torch::kFloat64, c10d::ReduceOp::MAX); }

  //! Gathers every rank's bytes, back to back in rank order, without padding.
  //! \param mine   this rank's bytes
  //! \param out    receives the concatenation (resized; capacity is kept between calls)
  //! \param sizes  receives each rank's byte count
  void allgatherv(std::span<const std::byte> mine, byte_buffer& out, std::vector<std::size_t>& sizes) {
    const auto n = static_cast<std::size_t>(size());
    gather_sizes(mine.size(), sizes);
    // Equal-size slots: this rank's packet padded to the widest, then compacted in rank order.
    detail::padded_allgatherv(mine, sizes, out, scratch_, [&](const void* send, std::size_t bytes, void* recv) {
      std::vector<at::Tensor> in{bytes_tensor(static_cast<std::byte*>(const_cast<void*>(send)), bytes)};
      std::vector<std::vector<at::Tensor>> outs(1);
      for (std::size_t r = 0; r < n; ++r)
        outs[0].push_back(bytes_tensor(static_cast<std::byte*>(recv) + r * bytes, bytes));
      wait(group_->allgather(outs, in), "allgatherv");
    });
  }

  //! Personalised all-to-all of variable-length blocks (the process group's all-to-all
  //! with split sizes, after an all-to-all of the sizes).
  //! \param send        this rank's blocks, back to back in destination-rank order
  //! \param send_sizes  the byte count of each destination's block (size() entries)
  //! \param out         receives the blocks addressed to this rank, in source-rank order
  //! \param recv_sizes  receives the byte count from each source rank
  void alltoallv(std::span<const std::byte> send, std::span<const std::size_t> send_sizes, byte_buffer& out,
                 std::vector<std::size_t>& recv_sizes) {
    const auto n = static_cast<std::size_t>(size());
    require(send_sizes.size() == n, "alltoallv: send_sizes needs one entry per rank");
    std::size_t sent = 0;
    for (auto s : send_sizes) sent += s;
    require(sent == send.size(), "alltoallv: the blocks' sizes do not add up to the send buffer");
    std::vector<std::int64_t> in_splits(send_sizes.begin(), send_sizes.end()), out_splits(n);
    {
      auto in = torch::from_blob(in_splits.data(), {static_cast<std::int64_t>(n)}, torch::kInt64);
      auto got = torch::from_blob(out_splits.data(), {static_cast<std::int64_t>(n)}, torch::kInt64);
      std::vector<std::int64_t> ones(n, 1);
      wait(group_->alltoall_base(got, in, ones, ones), "alltoallv (sizes)");
    }
    recv_sizes.assign(out_splits.begin(), out_splits.end());
    std::size_t total = 0;
    for (auto s : recv_sizes) total += s;
    out.resize(total);
    // Every rank takes part, also one that neither sends nor receives (the others may
    // still exchange); a zero-length block points at a byte of its own.
    std::byte none{};
    auto in = bytes_tensor(sent ? const_cast<std::byte*>(send.data()) : &none, sent);
    auto got = bytes_tensor(total ? out.data() : &none, total);
    wait(group_->alltoall_base(got, in, out_splits, in_splits), "alltoallv");
  }

  //! Copies \p root's bytes into every rank's \p data (every rank passes the same size).
  void broadcast(std::span<std::byte> data, int root) {
    require(root >= 0 && root < size(), "broadcast: root out of range");
    if (data.empty()) return;
    std::vector<at::Tensor> t{bytes_tensor(data.data(), data.size())};
    c10d::BroadcastOptions opt;
    opt.rootRank = root;
    wait(group_->broadcast(t, opt), "broadcast");
  }
  //! Copies \p root's values into every rank's \p data.
  template <class T>
  void broadcast_values(std::span<T> data, int root) {
    broadcast(std::as_writable_bytes(data), root);
  }

  //! Waits for every rank.
  void barrier() { wait(group_->barrier(), "barrier"); }

 private:
  static at::Tensor bytes_tensor(std::byte* p, std::size_t n) {
    return torch::from_blob(p, {static_cast<std::int64_t>(n)}, torch::kUInt8);
  }
  // The process group's errors (a peer gone, a timeout) become gravac::error.
  void wait(const c10::intrusive_ptr<c10d::Work>& work, const char* what) {
    try {
      work->wait();
    } catch (const std::exception& e) {
      throw error(status::backend_failure, std::string("process group ") + what + " failed: " + e.what(), rank(),
                  backend::process_group);
    }
  }
  void reduce(void* data, std::size_t n, torch::ScalarType type, c10d::ReduceOp::RedOpType op) {
    // Empty on every rank (the sizes agree, as for every Allreduce): nothing to send.
    if (n == 0) return;
    std::vector<at::Tensor> t{torch::from_blob(data, {static_cast<std::int64_t>(n)}, type)};
    c10d::AllreduceOptions opt;
    opt.reduceOp = c10d::ReduceOp(op);
    wait(group_->allreduce(t, opt), "allreduce");
  }
  void gather_sizes(std::size_t mine, std::vector<std::size_t>& sizes) {
    const auto n = static_cast<std::size_t>(size());
    std::int64_t own = static_cast<std::int64_t>(mine);
    std::vector<std::int64_t> all(n);
    std::vector<at::Tensor> in{torch::from_blob(&own, {1}, torch::kInt64)};
    std::vector<std::vector<at::Tensor>> outs(1);
    for (std::size_t r = 0; r < n; ++r) outs[0].push_back(torch::from_blob(&all[r], {1}, torch::kInt64));
    wait(group_->allgather(outs, in), "allgatherv (sizes)");
    sizes.assign(all.begin(), all.end());
  }

  c10::intrusive_ptr<c10d::ProcessGroup> group_;
  detail::padded_allgather_scratch scratch_;  // allgatherv's padded slots
};
static_assert(Communicator<process_group_communicator>);
static_assert(AlltoallCommunicator<process_group_communicator>);

}  // namespace gravac
