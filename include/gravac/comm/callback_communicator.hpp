#pragma once
//! \file callback_communicator.hpp
//! \brief A host-memory communicator over collectives the caller provides as C callbacks
//! (gravac_comm_callbacks of gravac_c.h): how the C ABI, and every language over it, hands
//! gravac its own transport.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "gravac/comm/detail/padded_allgatherv.hpp"
#include "gravac/concepts/concepts.hpp"
#include "gravac/core/error.hpp"
#include "gravac/core/memory.hpp"
#include "gravac_c.h"

namespace gravac {

//! A Communicator and AlltoallCommunicator over a table of C callbacks (host memory).
//! allgatherv is an allgather of the 8-byte sizes, then an allgather padded to the
//! largest; alltoallv is an allgather of the size matrix, then the alltoallv callback. A
//! callback that returns nonzero becomes gravac::error(status::backend_failure).
class callback_communicator {
 public:
  //! Opt-in tag for the Communicator concept.
  using communicator_tag = void;
  //! Buffers live in host memory.
  using memory_space = host_space;
  //! allgatherv's output buffer.
  using byte_buffer = std::vector<std::byte>;

  //! Over a copy of \p cb; gravac::error (invalid_argument) when a required callback is
  //! NULL or the rank and size are inconsistent. `cb.user` must outlive this object.
  explicit callback_communicator(const gravac_comm_callbacks& cb) : cb_(cb) {
    require(cb_.size > 0, "callback communicator: size must be positive, got " + std::to_string(cb_.size));
    require(cb_.rank >= 0 && cb_.rank < cb_.size, "callback communicator: rank " + std::to_string(cb_.rank) +
                                                      " is out of range [0, " + std::to_string(cb_.size) + ")");
    require(cb_.allreduce && cb_.allgather && cb_.broadcast && cb_.barrier,
            "callback communicator: allreduce, allgather, broadcast and barrier are required (only alltoallv "
            "may be NULL)");
  }

  //! This rank.
  [[nodiscard]] int rank() const noexcept { return cb_.rank; }
  //! Number of ranks.
  [[nodiscard]] int size() const noexcept { return cb_.size; }
  //! Whether the table has an alltoallv callback.
  [[nodiscard]] bool has_alltoallv() const noexcept { return cb_.alltoallv != nullptr; }

  //! Sums \p d over the ranks, in place (the callback's reduction order).
  void allreduce_sum(std::span<float> d) { reduce(d.data(), d.size(), GRAVAC_FLOAT32, GRAVAC_SUM); }
  //! Sums \p d over the ranks, in place.
  void allreduce_sum(std::span<double> d) { reduce(d.data(), d.size(), GRAVAC_FLOAT64, GRAVAC_SUM); }
  //! Elementwise maximum over the ranks, in place.
  void allreduce_max(std::span<double> d) { reduce(d.data(), d.size(), GRAVAC_FLOAT64, GRAVAC_MAX); }

  //! Gathers every rank's bytes back to back in rank order into \p out; \p sizes receives
  //! each rank's byte count.
  void allgatherv(std::span<const std::byte> in, byte_buffer& out, std::vector<std::size_t>& sizes) {
    const std::uint64_t mine = in.size();
    counts_.resize(static_cast<std::size_t>(cb_.size));
    check(cb_.allgather(cb_.user, &mine, sizeof mine, counts_.data()), "allgather");
    sizes.assign(counts_.begin(), counts_.end());
    detail::padded_allgatherv(in, sizes, out, scratch_, [&](const void* send, std::size_t bytes, void* recv) {
      check(cb_.allgather(cb_.user, send, bytes, recv), "allgather");
    });
  }

  //! Sends block j of \p in (send_sizes[j] bytes, back to back) to rank j; \p out receives
  //! the blocks addressed to this rank in source-rank order (recv_sizes[i] from rank i).
  //! gravac::error (invalid_argument) when the table has no alltoallv callback.
  void alltoallv(std::span<const std::byte> in, std::span<const std::size_t> send_sizes, byte_buffer& out,
                 std::vector<std::size_t>& recv_sizes) {
    if (!cb_.alltoallv)
      throw error(status::invalid_argument,
                  "callback communicator: alltoallv is NULL in the callback table (the compressed allreduce needs "
                  "it)",
                  cb_.rank);
    const auto n = static_cast<std::size_t>(cb_.size);
    require(send_sizes.size() == n, "callback communicator: alltoallv needs one send size per rank");
    counts_.assign(send_sizes.begin(), send_sizes.end());  // this rank's row of the size matrix
    matrix_.resize(n * n);
    check(cb_.allgather(cb_.user, counts_.data(), n * sizeof(std::uint64_t), matrix_.data()), "allgather");
    recv_sizes.resize(n);
    std::size_t total = 0;
    for (std::size_t i = 0; i < n; ++i) total += recv_sizes[i] = matrix_[i * n + static_cast<std::size_t>(cb_.rank)];
    out.resize(total);
    check(cb_.alltoallv(cb_.user, in.data(), send_sizes.data(), out.data(), recv_sizes.data()), "alltoallv");
  }

  //! Copies \p root's bytes into every rank's \p d.
  void broadcast(std::span<std::byte> d, int root) {
    check(cb_.broadcast(cb_.user, d.data(), d.size(), root), "broadcast");
  }
  //! Broadcast of typed values from \p root.
  template <class T>
  void broadcast_values(std::span<T> d, int root) {
    broadcast(std::as_writable_bytes(d), root);
  }
  //! Waits for every rank.
  void barrier() { check(cb_.barrier(cb_.user), "barrier"); }

 private:
  void reduce(void* data, std::size_t count, gravac_dtype t, gravac_reduce_op op) {
    check(cb_.allreduce(cb_.user, data, count, t, op), "allreduce");
  }
  void check(int rc, const char* what) const {
    if (rc != 0)
      throw error(status::backend_failure, "callback " + std::string(what) + " returned " + std::to_string(rc),
                  cb_.rank);
  }

  gravac_comm_callbacks cb_;
  // Kept between calls, so that a step allocates nothing once they have grown.
  detail::padded_allgather_scratch scratch_;
  std::vector<std::uint64_t> counts_;  // every rank's byte count (allgatherv), this rank's row (alltoallv)
  std::vector<std::uint64_t> matrix_;  // alltoallv's size matrix
};
static_assert(AlltoallCommunicator<callback_communicator>);

}  // namespace gravac
