// expect: is not a gravac::Compressor: it has no opt-in member
// A type that does not opt in as a Compressor cannot be a trainer's compressor.
#include "gravac/gravac.hpp"

struct not_a_compressor {};

int main() {
  gravac::thread_team team(1);
  gravac::thread_communicator comm(team, 0);
  gravac::trainer<not_a_compressor, gravac::allgather, gravac::fixed_policy> t(comm, gravac::layout::flat(4), {});
}
