// expect: allreduce_compatible .AR-Topk. on device memory needs the device form
// A summable device compressor with only the host form of the index hook, with AR-Topk: the
// message names the real cause (the hook's device form is missing), not "not summable".
// (The compressor is a unit-test mock: a top-k that only declares device memory, and a
// communicator mock over device memory that is never run, so this test compiles without a
// CUDA compiler.)
#include "fake_device_topk.hpp"
#include "gravac/gravac.hpp"

// Declarations only: the composition must be refused before anything would call them.
struct fake_device_communicator {
  using communicator_tag = void;
  using memory_space = gravac::cuda_space;
  using byte_buffer = std::vector<std::byte>;
  int rank() const;
  int size() const;
  void allreduce_sum(std::span<float>);
  void allreduce_sum(std::span<double>);
  void allreduce_max(std::span<double>);
  void allgatherv(std::span<const std::byte>, byte_buffer&, std::vector<std::size_t>&);
  void broadcast(std::span<std::byte>, int);
  void barrier();
};
static_assert(gravac::Communicator<fake_device_communicator>);

int main() {
  fake_device_communicator comm;
  gravac::trainer<fake_device_topk, gravac::allreduce_compatible, gravac::fixed_policy> t(comm, gravac::layout::flat(4),
                                                                                          {});
}
