// The explicit opt-in of composition.hpp: GraVAC's kept fractions with QSGD, which ignores
// them, is refused by default (compile_fail/policy_decisions_ignored shows a refusal) and
// compiles and runs once allow_ignored_decisions says so.
#include <catch2/catch.hpp>

#include "gravac/gravac.hpp"
#include "gravac_test_util.hpp"

using namespace gravac;

template <>
inline constexpr bool gravac::allow_ignored_decisions<qsgd, gravac_policy> = true;

TEST_CASE("composition: the explicit opt-in compiles and runs (GraVAC with QSGD)", "[composition]") {
  STATIC_REQUIRE(decisions_reach_v<qsgd, gravac_policy>);
  STATIC_REQUIRE_FALSE(decisions_reach_v<terngrad, gravac_policy>);  // the opt-in is for that pair only
  const auto lay = test::mixed_layout();
  run_ranks(2, [&](thread_communicator& comm) {
    trainer<qsgd, allgather, gravac_policy> t(comm, lay, {.policy = {.time = {time_source::simulated, 0.0, false}}});
    for (int s = 0; s < 3; ++s) {
      auto g = test::make_data(lay.numel(), 5 * s + comm.rank());
      t.step(g);
    }
    CHECK(t.steps() == 3);
  });
}
