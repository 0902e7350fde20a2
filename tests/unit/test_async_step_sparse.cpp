// The asynchronous step gives the synchronous step's bits (tests/support/bucket_checks.hpp)
// for the sparsifiers, with every collective that accepts them and every policy whose
// decisions reach them, in one bucket per layer and in buckets of a few layers.
#include <catch2/catch.hpp>

#include "bucket_checks.hpp"
#include "gravac/compress/adacomp.hpp"
#include "gravac/compress/randomk.hpp"
#include "gravac/compress/threshold.hpp"
#include "gravac/compress/topk.hpp"

using namespace gravac;

TEST_CASE("async step: top-k matches the synchronous step", "[buckets][async]") { test::check_async_all<topk>(); }
TEST_CASE("async step: threshold matches the synchronous step", "[buckets][async]") {
  test::check_async_all<threshold>();
}
TEST_CASE("async step: random-k matches the synchronous step", "[buckets][async]") { test::check_async_all<randomk>(); }
TEST_CASE("async step: AdaComp matches the synchronous step", "[buckets][async]") { test::check_async_all<adacomp>(); }
