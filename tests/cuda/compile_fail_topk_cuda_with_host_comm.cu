// expect: communicator's memory space differs from the compressor's
// A device compressor (topk_cuda) cannot run on a host-memory communicator (MPI): the
// trainer rejects the combination at compile time with a readable message.
#include "gravac/comm/mpi_communicator.hpp"
#include "gravac/cuda/topk_cuda.hpp"
#include "gravac/gravac.hpp"

int main() {
  gravac::mpi_communicator comm;
  auto lay = gravac::layout::flat(4);
  gravac::trainer<gravac::topk_cuda, gravac::allgather, gravac::fixed_policy> t(comm, lay, {});
}
