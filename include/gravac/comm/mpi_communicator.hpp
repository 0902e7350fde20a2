#pragma once
//! \file mpi_communicator.hpp
//! \brief The Open MPI engine (target gravac::mpi). Every MPI call is wrapped by
//! GRAVAC_TRY_MPI, which turns a failure into a gravac::error naming the rank. With
//! mpi_options::collective_timeout set, a collective that does not complete in time (a peer
//! rank hung: deadlocked, stopped, blocked in I/O) ends the job instead of waiting forever.

// gravac uses the C API only; the deprecated C++ bindings add nothing but warnings.
#ifndef OMPI_SKIP_MPICXX
#define OMPI_SKIP_MPICXX 1
#endif
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "gravac/comm/detail/collective_watchdog.hpp"
#include "gravac/comm/detail/mpi_abort.hpp"
#include "gravac/comm/detail/mpi_error.hpp"
#include "gravac/concepts/concepts.hpp"
#include "gravac/core/error.hpp"
#include "gravac/core/memory.hpp"

//! Calls an MPI function and throws gravac::error(backend_failure) with the call, the
//! MPI error text and the rank when it does not return MPI_SUCCESS.
#define GRAVAC_TRY_MPI(call)                                                                                    \
  do {                                                                                                          \
    const int gravac_mpi_status_ = (call);                                                                      \
    if (gravac_mpi_status_ != MPI_SUCCESS)                                                                      \
      throw ::gravac::error(::gravac::status::backend_failure,                                                  \
                            std::string(#call) + ": " + ::gravac::detail::mpi_error_string(gravac_mpi_status_), \
                            ::gravac::detail::mpi_world_rank(), ::gravac::backend::mpi, gravac_mpi_status_);    \
  } while (0)

//! Calls an MPI function where throwing is not allowed (destructors); failures are ignored.
#define GRAVAC_TRY_MPI_NO_THROW(call) \
  do {                                \
    (void)(call);                     \
  } while (0)

namespace gravac {

//! Options of mpi_communicator.
struct mpi_options {
  //! How long one collective may take before this rank ends the job; zero (the default) is
  //! off. MPI notices a dead rank, but not a hung one (deadlocked, stopped, blocked in I/O):
  //! alive and never entering the next collective, it leaves every other rank waiting in it
  //! forever. When set, a thread of the communicator watches each collective (which stays
  //! the blocking MPI call: same speed, same bits); one still not complete after this long
  //! prints "gravac: rank R of N failed: <collective> did not complete within <t> s ..." on
  //! stderr and ends this process with exit status mpi_abort_code, upon which mpiexec ends
  //! every other rank (see detail/collective_watchdog.hpp for why not MPI_Abort). The time runs
  //! from this rank's entry into the collective, so it includes waiting for the others to
  //! arrive: choose it well above the longest a healthy rank spends between two collectives
  //! (the slowest step, evaluation, writing a checkpoint). Negative, NaN or infinite values
  //! are rejected at construction.
  std::chrono::duration<double> collective_timeout{0};
};

//! The Open MPI engine over a duplicate of an MPI communicator. Models Communicator
//! over host memory. Errors are returned (MPI_ERRORS_RETURN) and mapped to gravac::error.
//!
//! Every collective is the blocking MPI call, with mpi_options::collective_timeout on or off
//! (on, a watchdog thread times it: the same calls, the same bits).
class mpi_communicator {
 public:
  //! Opt-in tag for the Communicator concept.
  using communicator_tag = void;
  //! Buffers live in host memory.
  using memory_space = host_space;
  //! allgatherv's output buffer.
  using byte_buffer = std::vector<std::byte>;

  //! Duplicates \p comm (so gravac's traffic never matches the user's) and sets MPI_ERRORS_RETURN on it.
  //! Throws gravac::error(invalid_argument) when \p opt is invalid.
  explicit mpi_communicator(MPI_Comm comm = MPI_COMM_WORLD, const mpi_options& opt = {}) : options_(opt) {
    const double t = opt.collective_timeout.count();
    if (!std::isfinite(t) || t < 0)  // checked before MPI_Comm_dup, so that nothing leaks
      throw error(status::invalid_argument,
                  "mpi_communicator: collective_timeout must be zero (off) or a positive finite number of seconds, "
                  "not " +
                      std::to_string(t),
                  detail::mpi_world_rank(), backend::mpi);
    int init = 0;
    GRAVAC_TRY_MPI(MPI_Initialized(&init));
    if (!init) throw error(status::invalid_argument, "mpi_communicator: MPI_Init has not been called");
    GRAVAC_TRY_MPI(MPI_Comm_dup(comm, &comm_));
    GRAVAC_TRY_MPI(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN));
    GRAVAC_TRY_MPI(MPI_Comm_rank(comm_, &rank_));
    GRAVAC_TRY_MPI(MPI_Comm_size(comm_, &size_));
    if (opt.collective_timeout.count() > 0)
      watchdog_ = std::make_unique<detail::collective_watchdog>(opt.collective_timeout, rank_, size_, mpi_abort_code);
  }
  //! Over a duplicate of MPI_COMM_WORLD, with \p opt.
  explicit mpi_communicator(const mpi_options& opt) : mpi_communicator(MPI_COMM_WORLD, opt) {}
  mpi_communicator(const mpi_communicator&) = delete;
  mpi_communicator& operator=(const mpi_communicator&) = delete;
  //! Frees the duplicate; never throws.
  ~mpi_communicator() {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized && comm_ != MPI_COMM_NULL) GRAVAC_TRY_MPI_NO_THROW(MPI_Comm_free(&comm_));
  }

  //! This rank.
  [[nodiscard]] int rank() const noexcept { return rank_; }
  //! Number of ranks.
  [[nodiscard]] int size() const noexcept { return size_; }
  //! Whether MPI was initialised with at least MPI_THREAD_SERIALIZED, so that an
  //! asynchronous step's communication thread may call it while the caller computes.
  [[nodiscard]] bool accepts_calls_from_other_threads() const noexcept {
    int level = MPI_THREAD_SINGLE;
    if (MPI_Query_thread(&level) != MPI_SUCCESS) return false;
    return level >= MPI_THREAD_SERIALIZED;
  }
  //! Ends the job (MPI_Abort, after printing \p why with the rank): called when this rank
  //! abandons a step whose collectives the other ranks are already in, which can never
  //! match again, so that no rank hangs.
  [[noreturn]] void abandon(const std::string& why) noexcept { detail::abort_job(comm_, why.c_str(), mpi_abort_code); }
  //! The underlying (duplicated) MPI communicator.
  [[nodiscard]] MPI_Comm native() const noexcept { return comm_; }
  //! The options it was made with.
  [[nodiscard]] const mpi_options& options() const noexcept { return options_; }

  //! Sums \p data over all ranks, in place.
  void allreduce_sum(std::span<float> data) {
    allreduce(data.data(), data.size(), MPI_FLOAT, MPI_SUM, "allreduce_sum");
  }
  //! Sums \p data over all ranks, in place.
  void allreduce_sum(std::span<double> data) {
    allreduce(data.data(), data.size(), MPI_DOUBLE, MPI_SUM, "allreduce_sum");
  }
  //! Elementwise maximum over all ranks, in place.
  void allreduce_max(std::span<double> data) {
    allreduce(data.data(), data.size(), MPI_DOUBLE, MPI_MAX, "allreduce_max");
  }

  //! Gathers every rank's bytes back to back in rank order, without padding to the largest:
  //! the sizes are exchanged first, then one MPI_Allgatherv moves exactly those bytes.
  void allgatherv(std::span<const std::byte> mine, byte_buffer& out, std::vector<std::size_t>& sizes) {
    const auto n = static_cast<std::size_t>(size_);
    sizes.resize(n);
    std::uint64_t my_size = mine.size();
    sizes64_.resize(n);
    {
      const watched w(watchdog_.get(), "allgatherv (its exchange of sizes)");
      GRAVAC_TRY_MPI(MPI_Allgather(&my_size, 1, MPI_UINT64_T, sizes64_.data(), 1, MPI_UINT64_T, comm_));
    }
    counts_.resize(n);
    displs_.resize(n);
    std::uint64_t total = 0;
    for (std::size_t r = 0; r < n; ++r) {
      if (sizes64_[r] > static_cast<std::uint64_t>(INT_MAX) || total > static_cast<std::uint64_t>(INT_MAX))
        throw error(status::invalid_argument, "allgatherv: more than 2 GiB in one call", rank_, backend::mpi);
      counts_[r] = static_cast<int>(sizes64_[r]);
      displs_[r] = static_cast<int>(total);
      sizes[r] = static_cast<std::size_t>(sizes64_[r]);
      total += sizes64_[r];
    }
    if (total > static_cast<std::uint64_t>(INT_MAX))
      throw error(status::invalid_argument, "allgatherv: more than 2 GiB in one call", rank_, backend::mpi);
    out.resize(static_cast<std::size_t>(total));
    const watched w(watchdog_.get(), "allgatherv");
    GRAVAC_TRY_MPI(MPI_Allgatherv(mine.data(), static_cast<int>(mine.size()), MPI_BYTE, out.data(), counts_.data(),
                                  displs_.data(), MPI_BYTE, comm_));
  }

  //! Personalised all-to-all of variable-length blocks (thread_communicator::alltoallv):
  //! the block sizes are exchanged first (MPI_Alltoall), then one MPI_Alltoallv moves
  //! exactly those bytes.
  void alltoallv(std::span<const std::byte> send, std::span<const std::size_t> send_sizes, byte_buffer& out,
                 std::vector<std::size_t>& recv_sizes) {
    const auto n = static_cast<std::size_t>(size_);
    require(send_sizes.size() == n, "alltoallv: send_sizes needs one entry per rank");
    sizes64_.assign(send_sizes.begin(), send_sizes.end());
    recv64_.resize(n);
    {
      const watched w(watchdog_.get(), "alltoallv (its exchange of sizes)");
      GRAVAC_TRY_MPI(MPI_Alltoall(sizes64_.data(), 1, MPI_UINT64_T, recv64_.data(), 1, MPI_UINT64_T, comm_));
    }
    to_counts(sizes64_, counts_, displs_, "alltoallv: more than 2 GiB sent in one call");
    require(static_cast<std::size_t>(displs_.back()) + static_cast<std::size_t>(counts_.back()) == send.size(),
            "alltoallv: the blocks' sizes do not add up to the send buffer");
    const std::size_t total =
        to_counts(recv64_, recv_counts_, recv_displs_, "alltoallv: more than 2 GiB received in one call");
    recv_sizes.assign(recv64_.begin(), recv64_.end());
    out.resize(total);
    const watched w(watchdog_.get(), "alltoallv");
    GRAVAC_TRY_MPI(MPI_Alltoallv(send.data(), counts_.data(), displs_.data(), MPI_BYTE, out.data(), recv_counts_.data(),
                                 recv_displs_.data(), MPI_BYTE, comm_));
  }

  //! Copies \p root's bytes into every rank's \p data.
  void broadcast(std::span<std::byte> data, int root) {
    require(root >= 0 && root < size_, "broadcast: root out of range");
    require(data.size() <= static_cast<std::size_t>(INT_MAX), "broadcast: more than 2 GiB");
    const watched w(watchdog_.get(), "broadcast");
    GRAVAC_TRY_MPI(MPI_Bcast(data.data(), static_cast<int>(data.size()), MPI_BYTE, root, comm_));
  }
  //! Copies \p root's values into every rank's \p data.
  template <class T>
  void broadcast_values(std::span<T> data, int root) {
    broadcast(std::as_writable_bytes(data), root);
  }

  //! Waits for every rank.
  void barrier() {
    const watched w(watchdog_.get(), "barrier");
    GRAVAC_TRY_MPI(MPI_Barrier(comm_));
  }

  //! Ends the whole MPI job: MPI cannot continue after one rank fails, so this turns a
  //! failure into a clean stop of every rank instead of a hang.
  [[noreturn]] void abort(const std::string& why, int code = 1) noexcept {
    (void)why;
    MPI_Abort(comm_, code);
    std::abort();
  }

 private:
  void allreduce(void* data, std::size_t n, MPI_Datatype type, MPI_Op op, const char* what) {
    if (n > static_cast<std::size_t>(INT_MAX))
      throw error(status::invalid_argument, "allreduce: more than INT_MAX elements", rank_, backend::mpi);
    const watched w(watchdog_.get(), what);
    GRAVAC_TRY_MPI(MPI_Allreduce(MPI_IN_PLACE, data, static_cast<int>(n), type, op, comm_));
  }

  // Brackets one collective for the watchdog (none when the timeout is off), leaving it
  // also when the call throws.
  class watched {
   public:
    watched(detail::collective_watchdog* w, const char* what) noexcept : w_(w) {
      if (w_) w_->enter(what);
    }
    watched(const watched&) = delete;
    watched& operator=(const watched&) = delete;
    ~watched() {
      if (w_) w_->leave();
    }

   private:
    detail::collective_watchdog* w_;
  };

  // MPI's int counts and displacements for \p sizes; returns the total. Throws past INT_MAX.
  std::size_t to_counts(const std::vector<std::uint64_t>& sizes, std::vector<int>& counts, std::vector<int>& displs,
                        const char* too_large) const {
    counts.resize(sizes.size());
    displs.resize(sizes.size());
    std::uint64_t total = 0;
    for (std::size_t r = 0; r < sizes.size(); ++r) {
      if (sizes[r] > static_cast<std::uint64_t>(INT_MAX) || total > static_cast<std::uint64_t>(INT_MAX) - sizes[r])
        throw error(status::invalid_argument, too_large, rank_, backend::mpi);
      counts[r] = static_cast<int>(sizes[r]);
      displs[r] = static_cast<int>(total);
      total += sizes[r];
    }
    return static_cast<std::size_t>(total);
  }

  mpi_options options_;
  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0;
  int size_ = 1;
  std::vector<std::uint64_t> sizes64_;
  std::vector<int> counts_;
  std::vector<int> displs_;
  std::vector<std::uint64_t> recv64_;
  std::vector<int> recv_counts_;
  std::vector<int> recv_displs_;
  std::unique_ptr<detail::collective_watchdog> watchdog_;  // only with a collective_timeout
};
static_assert(Communicator<mpi_communicator>);

}  // namespace gravac
