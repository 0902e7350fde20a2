// The control plane of a step with the other compressors (dense, AdaComp, the quantizers):
// no collective besides the gradient's own for every collective and policy, counted by a
// test decorator around the thread communicator.
#include <catch2/catch.hpp>

#include "control_plane_checks.hpp"
#include "gravac/compress/adacomp.hpp"
#include "gravac/compress/cast16.hpp"
#include "gravac/compress/identity.hpp"
#include "gravac/compress/qsgd.hpp"
#include "gravac/compress/sign.hpp"
#include "gravac/compress/terngrad.hpp"

using namespace gravac;

TEST_CASE("control plane: identity makes only the gradient's collectives", "[control_plane]") {
  test::check_control_plane_all<identity>();
}
TEST_CASE("control plane: AdaComp makes only the gradient's collectives", "[control_plane]") {
  test::check_control_plane_all<adacomp>();
}
TEST_CASE("control plane: QSGD makes only the gradient's collectives", "[control_plane]") {
  test::check_control_plane_all<qsgd>();
}
TEST_CASE("control plane: TernGrad makes only the gradient's collectives", "[control_plane]") {
  test::check_control_plane_all<terngrad>();
}
TEST_CASE("control plane: EF-sign makes only the gradient's collectives", "[control_plane]") {
  test::check_control_plane_all<sign>();
}
TEST_CASE("control plane: cast16 makes only the gradient's collectives", "[control_plane]") {
  test::check_control_plane_all<cast16>();
}
