// The control plane of a step with PowerSGD: its two Allreduces (P, then Q with the
// control values) and nothing else, for every collective and policy that accepts it.
#include <catch2/catch.hpp>

#include "control_plane_checks.hpp"
#include "gravac/compress/powersgd.hpp"

using namespace gravac;

TEST_CASE("control plane: PowerSGD makes only the gradient's collectives", "[control_plane]") {
  test::check_control_plane_all<powersgd>();
}
