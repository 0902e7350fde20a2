// expect: sums values at shared indices, and this compressor's values cannot be summed
// AR-Topk (allreduce_compatible) sums values at shared indices: a compressor whose packets
// cannot be summed that way must be rejected at compile time with a readable message.
#include "gravac/collective/allreduce_compatible.hpp"
#include "gravac/gravac.hpp"

// A complete Compressor that declares its values not summable by index.
struct not_summable : gravac::identity {
  using gravac::identity::identity;
  static constexpr bool summable_by_index = false;
};
static_assert(gravac::Compressor<not_summable>);

int main() {
  gravac::thread_team team(1);
  gravac::thread_communicator comm(team, 0);
  gravac::trainer<not_summable, gravac::allreduce_compatible, gravac::fixed_policy> t(comm, gravac::layout::flat(4),
                                                                                      {});
}
