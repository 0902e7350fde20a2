// expect: needs two dependent Allreduces
// PowerSGD needs two dependent allreduces (P, then Q); allgather compresses once and
// gathers, so the pairing must not compile (allgather::accepts excludes LowRankCompressor).
#include "gravac/compress/powersgd.hpp"
#include "gravac/gravac.hpp"

int main() {
  gravac::thread_team team(1);
  gravac::thread_communicator comm(team, 0);
  gravac::layout lay;
  lay.add("w", {8, 8}, gravac::layer_kind::dense);
  gravac::trainer<gravac::powersgd, gravac::allgather, gravac::fixed_policy> t(comm, lay, {});
}
