// expect: Collective requirement: void aggregate
// A collective that opts in and accepts every compressor but has no aggregate(): the first
// error names the operation the trainer calls (CollectiveFor), not a failure deep inside it.
#include "gravac/gravac.hpp"

struct no_aggregate {
  using collective_tag = void;
  struct options {};
  template <class C>
  static constexpr bool accepts = true;
  no_aggregate(const gravac::layout&, const options&) {}
  template <class C>
  void prepare(const C&) {}
};

int main() {
  gravac::thread_team team(1);
  gravac::thread_communicator comm(team, 0);
  gravac::trainer<gravac::topk, no_aggregate, gravac::fixed_policy> t(comm, gravac::layout::flat(4), {});
}
