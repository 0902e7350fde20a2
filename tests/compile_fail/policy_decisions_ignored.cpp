// expect: the policy's decisions would be ignored
// AdaComp chooses per bin by itself and never reads a kept fraction or a rank: Accordion's
// decisions would change nothing, so the composition is refused (composition.hpp) unless
// allow_ignored_decisions opts in (test_composition shows the opt-in compiles and runs).
#include "gravac/gravac.hpp"

int main() {
  gravac::thread_team team(1);
  gravac::thread_communicator comm(team, 0);
  gravac::trainer<gravac::adacomp, gravac::allgather, gravac::accordion_policy> t(comm, gravac::layout::flat(4), {});
}
