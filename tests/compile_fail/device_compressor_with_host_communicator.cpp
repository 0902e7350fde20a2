// expect: communicator's memory space differs from the compressor's
// A compressor over device memory cannot run on a host-memory communicator. (The
// compressor here is a unit-test mock: it only declares device memory.)
#include "fake_device_topk.hpp"
#include "gravac/gravac.hpp"

int main() {
  gravac::thread_team team(1);
  gravac::thread_communicator comm(team, 0);
  auto lay = gravac::layout::flat(4);
  gravac::trainer<fake_device_topk, gravac::allgather, gravac::fixed_policy> t(comm, lay, {});
}
