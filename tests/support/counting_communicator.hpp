#pragma once
// A test decorator around any host communicator that counts the collectives each rank
// makes, by kind. The control-plane tests use it to prove that a trainer step makes no
// collective besides the gradient's own.

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "gravac/concepts.hpp"

namespace gravac::test {

//! Collectives made so far, by kind.
struct collective_counts {
  std::uint64_t allreduce = 0;  //!< allreduce_sum and allreduce_max, any element type
  std::uint64_t allgather = 0;  //!< allgatherv
  std::uint64_t alltoall = 0;   //!< alltoallv
  std::uint64_t broadcast = 0;  //!< broadcast
  std::uint64_t barrier = 0;    //!< barrier
  //! All of them.
  [[nodiscard]] std::uint64_t total() const noexcept { return allreduce + allgather + alltoall + broadcast + barrier; }
  friend collective_counts operator-(collective_counts a, const collective_counts& b) noexcept {
    a.allreduce -= b.allreduce;
    a.allgather -= b.allgather;
    a.alltoall -= b.alltoall;
    a.broadcast -= b.broadcast;
    a.barrier -= b.barrier;
    return a;
  }
};

//! Forwards every call to \p Inner and counts it.
template <Communicator Inner>
class counting_communicator {
 public:
  using communicator_tag = void;
  using memory_space = typename Inner::memory_space;
  using byte_buffer = typename Inner::byte_buffer;

  explicit counting_communicator(Inner& inner) : inner_(inner) {}
  [[nodiscard]] int rank() const { return inner_.rank(); }
  [[nodiscard]] int size() const { return inner_.size(); }
  void allreduce_sum(std::span<float> d) {
    ++counts_.allreduce;
    inner_.allreduce_sum(d);
  }
  void allreduce_sum(std::span<double> d) {
    ++counts_.allreduce;
    inner_.allreduce_sum(d);
  }
  void allreduce_max(std::span<double> d) {
    ++counts_.allreduce;
    inner_.allreduce_max(d);
  }
  void allgatherv(std::span<const std::byte> in, byte_buffer& out, std::vector<std::size_t>& sizes) {
    ++counts_.allgather;
    inner_.allgatherv(in, out, sizes);
  }
  void alltoallv(std::span<const std::byte> in, std::span<const std::size_t> send_sizes, byte_buffer& out,
                 std::vector<std::size_t>& recv_sizes) requires AlltoallCommunicator<Inner> {
    ++counts_.alltoall;
    inner_.alltoallv(in, send_sizes, out, recv_sizes);
  }
  void broadcast(std::span<std::byte> d, int root) {
    ++counts_.broadcast;
    inner_.broadcast(d, root);
  }
  void barrier() {
    ++counts_.barrier;
    inner_.barrier();
  }
  //! The counts so far.
  [[nodiscard]] const collective_counts& counts() const noexcept { return counts_; }

 private:
  Inner& inner_;
  collective_counts counts_;
};

}  // namespace gravac::test
