// Fuzzes the compressed allreduce's chunk decoder: a QSGD packet of one shard (shard 1 of 3
// of the tests' mixed layout: pieces of every layer, an empty one among them), validated
// and decoded by a compressor over the shard's own layout, as the reduce-scatter does.
#include "fuzz_packet.hpp"
#include "gravac/collective/detail/shard_plan.hpp"

namespace {
const gravac::layout& shard_layout() {
  static const gravac::detail::shard_plan plan(gravac::test::mixed_layout(), 3);
  return plan.shard_layout(1);
}
}  // namespace

GRAVAC_FUZZ_COMPRESSOR_ON(gravac::qsgd, (gravac::qsgd_options{.levels = 127, .bucket = 64}), shard_layout())
