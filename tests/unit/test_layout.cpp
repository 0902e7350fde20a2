#include <catch2/catch.hpp>

#include "gravac_test_util.hpp"

using namespace gravac;

TEST_CASE("layout packs tensors back to back with stable ids", "[layout]") {
  auto l = test::mixed_layout();
  REQUIRE(l.size() == 6);
  CHECK(l[0].offset == 0);
  CHECK(l[0].numel == 8 * 3 * 3 * 3);
  CHECK(l[1].offset == l[0].numel);
  CHECK(l[3].numel == 0);
  CHECK(l.numel() == 216 + 8 + 33 * 17 + 0 + 330 + 13);
  CHECK(l[2].rows() == 33);
  CHECK(l[2].cols() == 17);
  // Ids depend on the name only, so they survive reordering and runs.
  layout other;
  other.add("fc1.weight", {33, 17}, layer_kind::dense);
  CHECK(other[0].id == l[2].id);
  CHECK(l.find(l[4].id) == 4);
  CHECK(l.find(12345) == l.size());
}

TEST_CASE("layout hash changes with any field", "[layout]") {
  auto a = test::mixed_layout();
  auto b = test::mixed_layout();
  CHECK(a.hash() == b.hash());
  layout c;
  c.add("conv1.weight", {8, 3, 3, 3}, layer_kind::dense);  // kind differs
  layout d;
  d.add("conv1.weight", {8, 3, 9}, layer_kind::conv);  // same numel, other shape
  layout e;
  e.add("conv1.weight", {8, 3, 3, 3}, layer_kind::conv);
  CHECK(c.hash() != e.hash());
  CHECK(d.hash() != e.hash());
  CHECK(a.hash() != e.hash());
}

TEST_CASE("layout rejects bad tensors with a clear error", "[layout][errors]") {
  layout l;
  l.add("w", {4}, layer_kind::dense);
  CHECK_THROWS_WITH(l.add("w", {4}, layer_kind::dense), Catch::Contains("duplicate layer name 'w'"));
  CHECK_THROWS_WITH(l.add("", {4}, layer_kind::dense), Catch::Contains("needs a name"));
  CHECK_THROWS_WITH(l.add("x", {}, layer_kind::dense), Catch::Contains("needs a shape"));
  try {
    l.add("w", {1}, layer_kind::dense);
    FAIL("no throw");
  } catch (const gravac::error& e) {
    CHECK(e.code() == status::invalid_argument);
  }
}

TEST_CASE("kept_count rounds and clamps", "[step]") {
  CHECK(kept_count(1000, 0.01) == 10);
  CHECK(kept_count(1000, 0.0) == 0);
  CHECK(kept_count(10, 0.001) == 1);  // positive fraction keeps at least one
  CHECK(kept_count(0, 0.5) == 0);
  CHECK(kept_count(7, 1.0) == 7);
  CHECK(kept_count(7, 2.0) == 7);
  CHECK(kept_count(3, 0.5) == 2);
}
