#pragma once
//! \file thread_communicator.hpp
//! \brief N ranks as threads in one process: the in-process engine for tests and
//! single-machine runs. Reductions sum in rank order, so every rank gets identical bits.

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstring>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "gravac/concepts/concepts.hpp"
#include "gravac/core/error.hpp"
#include "gravac/core/memory.hpp"

namespace gravac {

//! The state shared by the ranks of one thread team: a reusable barrier that can be
//! aborted (so that one failing rank ends the others with an error, never a hang) and
//! the slots where ranks post their buffers.
class thread_team {
 public:
  //! A team of \p size ranks; a rank waiting longer than \p timeout in a collective fails.
  explicit thread_team(int size, std::chrono::milliseconds timeout = std::chrono::minutes(5))
      : size_(size), timeout_(timeout), slots_(static_cast<std::size_t>(size)) {
    require(size > 0, "thread_team: size must be positive");
  }

  //! Number of ranks.
  [[nodiscard]] int size() const noexcept { return size_; }

  //! Waits until every rank arrives; throws if the team was aborted or the wait timed out.
  void arrive_and_wait(int rank) {
    std::unique_lock lock(mutex_);
    throw_if_aborted(rank);
    const auto gen = generation_;
    if (++arrived_ == size_) {
      arrived_ = 0;
      ++generation_;
      cv_.notify_all();
      return;
    }
    const bool done = cv_.wait_for(lock, timeout_, [&] { return generation_ != gen || aborted_; });
    if (generation_ != gen) return;  // the barrier completed, even if a rank failed since
    throw_if_aborted(rank);
    if (!done) {
      abort_locked(rank, "collective timed out waiting for the other ranks");
      throw error(status::timeout, "thread collective timed out", rank, backend::threads);
    }
  }

  //! Marks the team failed by \p rank; every rank waiting (or arriving later) throws.
  void abort(int rank, const std::string& why) noexcept {
    std::lock_guard lock(mutex_);
    abort_locked(rank, why);
  }

  //! Slot where rank \p r posts a pointer to its data for the current collective.
  const void*& slot(int r) noexcept { return slots_[static_cast<std::size_t>(r)].ptr; }
  //! Size posted by rank \p r with its pointer.
  std::size_t& slot_size(int r) noexcept { return slots_[static_cast<std::size_t>(r)].size; }

 private:
  struct slot_t {
    const void* ptr = nullptr;
    std::size_t size = 0;
  };
  void abort_locked(int rank, const std::string& why) noexcept {
    if (!aborted_) {
      aborted_ = true;
      failed_rank_ = rank;
      reason_ = why;
    }
    cv_.notify_all();
  }
  void throw_if_aborted(int rank) const {
    if (aborted_)
      throw error(status::aborted, "rank " + std::to_string(failed_rank_) + " failed: " + reason_, rank,
                  backend::threads);
  }

  int size_;
  std::chrono::milliseconds timeout_;
  std::vector<slot_t> slots_;
  std::mutex mutex_;
  std::condition_variable cv_;
  int arrived_ = 0;
  std::uint64_t generation_ = 0;
  bool aborted_ = false;
  int failed_rank_ = -1;
  std::string reason_;
};

//! One rank of a thread team. Models Communicator over host memory.
class thread_communicator {
 public:
  //! Opt-in tag for the Communicator concept.
  using communicator_tag = void;
  //! Buffers live in host memory.
  using memory_space = host_space;
  //! allgatherv's output buffer.
  using byte_buffer = std::vector<std::byte>;

  //! Rank \p rank of \p team.
  thread_communicator(thread_team& team, int rank) : team_(&team), rank_(rank) {
    require(rank >= 0 && rank < team.size(), "thread_communicator: rank out of range");
  }

  //! This rank.
  [[nodiscard]] int rank() const noexcept { return rank_; }
  //! Number of ranks.
  [[nodiscard]] int size() const noexcept { return team_->size(); }
  //! Aborts the team with \p why (every rank waiting in a collective, or arriving later,
  //! throws): called when this rank abandons a step the others are already in.
  void abandon(const std::string& why) noexcept { team_->abort(rank_, why); }

  //! Sums \p data over all ranks, in place (summed in rank order: identical on every rank).
  void allreduce_sum(std::span<float> data) {
    reduce(data, [](float a, float b) { return a + b; });
  }
  //! Sums \p data over all ranks, in place.
  void allreduce_sum(std::span<double> data) {
    reduce(data, [](double a, double b) { return a + b; });
  }
  //! Elementwise maximum over all ranks, in place.
  void allreduce_max(std::span<double> data) {
    reduce(data, [](double a, double b) { return std::max(a, b); });
  }

  //! Gathers every rank's bytes, back to back in rank order, without padding.
  //! \param mine   this rank's bytes
  //! \param out    receives the concatenation (resized; capacity is kept between calls)
  //! \param sizes  receives each rank's byte count
  void allgatherv(std::span<const std::byte> mine, byte_buffer& out, std::vector<std::size_t>& sizes) {
    team_->slot(rank_) = mine.data();
    team_->slot_size(rank_) = mine.size();
    team_->arrive_and_wait(rank_);
    const int n = size();
    sizes.resize(static_cast<std::size_t>(n));
    std::size_t total = 0;
    for (int r = 0; r < n; ++r) total += sizes[static_cast<std::size_t>(r)] = team_->slot_size(r);
    out.resize(total);
    std::size_t at = 0;
    for (int r = 0; r < n; ++r) {
      const auto sz = sizes[static_cast<std::size_t>(r)];
      if (sz) std::memcpy(out.data() + at, team_->slot(r), sz);
      at += sz;
    }
    team_->arrive_and_wait(rank_);  // nobody reuses its buffer while others still read it
  }

  //! Personalised all-to-all of variable-length blocks: rank r's block for rank j reaches
  //! rank j, which receives the blocks addressed to it back to back in source-rank order.
  //! \param send        this rank's blocks, back to back in destination-rank order
  //! \param send_sizes  the byte count of each destination's block (size() entries)
  //! \param out         receives the blocks addressed to this rank (resized; capacity kept)
  //! \param recv_sizes  receives the byte count from each source rank
  void alltoallv(std::span<const std::byte> send, std::span<const std::size_t> send_sizes, byte_buffer& out,
                 std::vector<std::size_t>& recv_sizes) {
    const auto n = static_cast<std::size_t>(size());
    require(send_sizes.size() == n, "alltoallv: send_sizes needs one entry per rank");
    // Each rank posts its blocks with their offsets, so a reader finds its block in O(1).
    post_.data = send.data();
    post_.sizes = send_sizes.data();
    post_.offsets.resize(n + 1);
    post_.offsets[0] = 0;
    for (std::size_t j = 0; j < n; ++j) post_.offsets[j + 1] = post_.offsets[j] + send_sizes[j];
    require(post_.offsets[n] == send.size(), "alltoallv: the blocks' sizes do not add up to the send buffer");
    team_->slot(rank_) = &post_;
    team_->arrive_and_wait(rank_);
    const auto me = static_cast<std::size_t>(rank_);
    recv_sizes.resize(n);
    std::size_t total = 0;
    for (int r = 0; r < size(); ++r) total += recv_sizes[static_cast<std::size_t>(r)] = peer_post(r).sizes[me];
    out.resize(total);
    std::size_t at = 0;
    for (int r = 0; r < size(); ++r) {
      const block_post& peer = peer_post(r);
      const std::size_t sz = recv_sizes[static_cast<std::size_t>(r)];
      if (sz) std::memcpy(out.data() + at, peer.data + peer.offsets[me], sz);
      at += sz;
    }
    team_->arrive_and_wait(rank_);  // nobody reuses its buffers while others still read them
  }

  //! Copies \p root's bytes into every rank's \p data (all ranks pass the same size).
  void broadcast(std::span<std::byte> data, int root) {
    require(root >= 0 && root < size(), "broadcast: root out of range");
    team_->slot(rank_) = data.data();
    team_->slot_size(rank_) = data.size();
    team_->arrive_and_wait(rank_);
    if (team_->slot_size(root) != data.size()) {
      team_->abort(rank_, "broadcast sizes differ between ranks");
      throw error(status::invalid_argument, "broadcast sizes differ between ranks", rank_, backend::threads);
    }
    if (rank_ != root && !data.empty()) std::memcpy(data.data(), team_->slot(root), data.size());
    team_->arrive_and_wait(rank_);
  }
  //! Copies \p root's values into every rank's \p data.
  template <class T>
  void broadcast_values(std::span<T> data, int root) {
    broadcast(std::as_writable_bytes(data), root);
  }

  //! Waits for every rank.
  void barrier() { team_->arrive_and_wait(rank_); }

  //! Marks the team failed so that the other ranks stop with an error naming this rank.
  void abort(const std::string& why) noexcept { team_->abort(rank_, why); }

 private:
  // Reduce-scatter, then allgather, in memory: rank r reduces chunk r of every rank's
  // buffer (in rank order, the order a full reduction uses for every element, so the bits do
  // not depend on which rank reduces a chunk), then every rank copies the N reduced chunks.
  // Each rank does O(size) work whatever N is, so teams of hundreds of ranks stay affordable.
  template <class T, class Op>
  void reduce(std::span<T> data, Op op) {
    const int n = size();
    const auto chunk_begin = [&](int j) {
      const std::size_t base = data.size() / static_cast<std::size_t>(n),
                        extra = data.size() % static_cast<std::size_t>(n);
      const auto uj = static_cast<std::size_t>(j);
      return uj * base + std::min(uj, extra);
    };
    auto& scratch = scratch_for<T>();
    scratch.resize(chunk_begin(rank_ + 1) - chunk_begin(rank_));
    reduce_post_ = {data.data(), scratch.data()};
    team_->slot(rank_) = &reduce_post_;
    team_->slot_size(rank_) = data.size();
    team_->arrive_and_wait(rank_);
    for (int r = 0; r < n; ++r)
      if (team_->slot_size(r) != data.size()) {
        team_->abort(rank_, "allreduce sizes differ between ranks");
        throw error(status::invalid_argument, "allreduce sizes differ between ranks", rank_, backend::threads);
      }
    const std::size_t b = chunk_begin(rank_), m = scratch.size();
    const auto peer = [&](int r) { return *static_cast<const reduce_post*>(team_->slot(r)); };
    const T* first = static_cast<const T*>(peer(0).data) + b;
    std::copy(first, first + m, scratch.begin());
    for (int r = 1; r < n; ++r) {
      const T* src = static_cast<const T*>(peer(r).data) + b;
      for (std::size_t i = 0; i < m; ++i) scratch[i] = op(scratch[i], src[i]);
    }
    team_->arrive_and_wait(rank_);  // every chunk is reduced, and nobody reads the inputs any more
    for (int r = 0; r < n; ++r) {
      const T* chunk = static_cast<const T*>(peer(r).reduced);
      std::copy(chunk, chunk + (chunk_begin(r + 1) - chunk_begin(r)),
                data.begin() + static_cast<std::ptrdiff_t>(chunk_begin(r)));
    }
    team_->arrive_and_wait(rank_);  // nobody reuses its chunk while others still copy it
  }
  template <class T>
  std::vector<T>& scratch_for() {
    if constexpr (std::is_same_v<T, float>)
      return scratch_f_;
    else
      return scratch_d_;
  }

  // What a rank posts for alltoallv: its blocks, their sizes and their offsets.
  struct block_post {
    const std::byte* data = nullptr;
    const std::size_t* sizes = nullptr;
    std::vector<std::size_t> offsets;
  };
  const block_post& peer_post(int r) { return *static_cast<const block_post*>(team_->slot(r)); }
  // What a rank posts for a reduction: its buffer, and the chunk it reduces for everyone.
  struct reduce_post {
    const void* data = nullptr;
    const void* reduced = nullptr;
  };

  thread_team* team_;
  int rank_;
  block_post post_;
  reduce_post reduce_post_;
  std::vector<float> scratch_f_;
  std::vector<double> scratch_d_;
};
static_assert(Communicator<thread_communicator>);

//! Runs \p body(comm) on \p n ranks, one thread each, and waits for all of them.
//! If a rank throws, the team is aborted so the others stop too, and the first
//! failure is rethrown here (the original exception of the rank that failed first).
template <class Body>
void run_ranks(int n, Body&& body, std::chrono::milliseconds timeout = std::chrono::minutes(5)) {
  thread_team team(n, timeout);
  std::vector<std::exception_ptr> failures(static_cast<std::size_t>(n));
  std::vector<std::thread> threads;
  threads.reserve(static_cast<std::size_t>(n));
  std::mutex first_mutex;
  std::exception_ptr first;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      thread_communicator comm(team, r);
      try {
        body(comm);
      } catch (const std::exception& e) {
        {
          std::lock_guard lock(first_mutex);
          if (!first) first = std::current_exception();
        }
        team.abort(r, e.what());
      } catch (...) {
        {
          std::lock_guard lock(first_mutex);
          if (!first) first = std::current_exception();
        }
        team.abort(r, "unknown exception");
      }
    });
  }
  for (auto& t : threads) t.join();
  if (first) std::rethrow_exception(first);
}

}  // namespace gravac
