// expect: the policy is not a gravac::Policy: it has no opt-in member
// A type that does not opt in as a Policy: the first error names the missing tag.
#include "gravac/gravac.hpp"

struct not_a_policy {
  struct options {};
};

int main() {
  gravac::thread_team team(1);
  gravac::thread_communicator comm(team, 0);
  gravac::trainer<gravac::topk, gravac::allgather, not_a_policy> t(comm, gravac::layout::flat(4), {});
}
