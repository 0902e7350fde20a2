// expect: low_rank_allreduce drives PowerSGD
// low_rank_allreduce drives the project / factor / reconstruct protocol; a compressor that
// does not model LowRankCompressor (top-k) must not compile with it.
#include "gravac/collective/low_rank_allreduce.hpp"
#include "gravac/gravac.hpp"

int main() {
  gravac::thread_team team(1);
  gravac::thread_communicator comm(team, 0);
  gravac::trainer<gravac::topk, gravac::low_rank_allreduce, gravac::fixed_policy> t(comm, gravac::layout::flat(8), {});
}
