#pragma once
// A one-process device communicator for the double-only tests of the device collectives.
#include <catch2/catch.hpp>
#include <cstddef>
#include <span>
#include <vector>

#include "gravac/concepts/concepts.hpp"
#include "gravac/cuda/cuda_error.hpp"
#include "gravac/cuda/device_buffer.hpp"

// Rank 0 of `ranks` in one process, device memory, whose peers contribute nothing: a sum
// or a maximum is this rank's values, a gather holds only this rank's bytes, a broadcast
// from rank 0 leaves the buffer as it is. With one rank, AR-Topk calls no collective; with
// more, VAR's norms (one control slot per rank) make its control plane as large as a big
// job's, and its root stays rank 0 (the only non-zero norm).
namespace gravac::test {

struct lone_rank_device_comm {
  using communicator_tag = void;
  using memory_space = gravac::cuda_space;
  using byte_buffer = gravac::device_byte_buffer;
  int ranks = 1;
  int rank() const { return 0; }
  int size() const { return ranks; }
  void allreduce_sum(std::span<float>) {}
  void allreduce_sum(std::span<double>) {}
  void allreduce_max(std::span<double>) {}
  void allgatherv(std::span<const std::byte> in, byte_buffer& out, std::vector<std::size_t>& sizes) {
    out.resize(in.size());
    if (!in.empty()) GRAVAC_TRY_CUDA(cudaMemcpy(out.data(), in.data(), in.size(), cudaMemcpyDefault));
    sizes.assign(static_cast<std::size_t>(ranks), 0);
    sizes[0] = in.size();
  }
  void broadcast(std::span<std::byte>, int root) { REQUIRE(root == 0); }
  void barrier() {}
};
static_assert(gravac::Communicator<lone_rank_device_comm>);

}  // namespace gravac::test
