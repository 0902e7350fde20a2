// The asynchronous step gives the synchronous step's bits (tests/support/bucket_checks.hpp)
// for PowerSGD, with every collective that accepts it and every policy whose decisions
// reach it, in one bucket per layer and in buckets of a few layers.
#include <catch2/catch.hpp>

#include "bucket_checks.hpp"
#include "gravac/compress/powersgd.hpp"

using namespace gravac;

TEST_CASE("async step: PowerSGD matches the synchronous step", "[buckets][async]") {
  test::check_async_all<powersgd>();
}
