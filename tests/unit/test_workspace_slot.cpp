// workspace_slot: a collective's workspace for another memory space is held by type; using
// it before prepare(), or as another type than it was prepared as, is an error, not a read
// of the wrong memory.
#include <catch2/catch.hpp>
#include <vector>

#include "gravac/collective/workspace_slot.hpp"

using namespace gravac;

TEST_CASE("workspace_slot: checked access by type", "[collective][workspace]") {
  workspace_slot slot;
  CHECK_FALSE(slot.has_value());
  CHECK_THROWS_WITH(slot.get<std::vector<float>>("allgather"), Catch::Contains("prepare() was not called"));
  auto& v = slot.emplace<std::vector<float>>(3, 1.5f);
  CHECK(slot.has_value());
  CHECK(&slot.get<std::vector<float>>("allgather") == &v);
  CHECK(slot.get<std::vector<float>>("allgather").size() == 3);
  CHECK_THROWS_WITH(slot.get<std::vector<double>>("dense_allreduce"),
                    Catch::Contains("dense_allreduce: the workspace was prepared for another"));
  auto& w = slot.emplace<std::vector<double>>(2);  // prepared again for another compressor
  CHECK(&slot.get<std::vector<double>>("x") == &w);
  CHECK_THROWS_AS(slot.get<std::vector<float>>("x"), error);
}
