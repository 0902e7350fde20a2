// expect: communicator's memory space differs from the compressor's
// A compressor over device memory cannot run on a host-memory communicator. (The
// compressor here is a unit-test mock: it only declares device memory.)
#include "gravac/gravac.hpp"

struct fake_device_compressor : gravac::topk {
  using memory_space = gravac::cuda_space;
  using topk::topk;
  std::size_t compress(gravac::grad_view<gravac::cuda_space>, gravac::grad_view<gravac::cuda_space>,
                       const gravac::step_params&, std::span<std::byte>, gravac::compress_stats&) {
    return 0;
  }
  void decompress_add(std::span<const std::byte>, gravac::grad_view<gravac::cuda_space>, float) const {}
};
static_assert(gravac::Compressor<fake_device_compressor>);

int main() {
  gravac::thread_team team(1);
  gravac::thread_communicator comm(team, 0);
  auto lay = gravac::layout::flat(4);
  gravac::trainer<fake_device_compressor, gravac::allgather, gravac::fixed_policy> t(comm, lay, {});
}
