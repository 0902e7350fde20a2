// The asynchronous step gives the synchronous step's bits (tests/support/bucket_checks.hpp)
// for the quantizers, cast16 and identity (PowerSGD: test_async_step_powersgd.cpp), with
// every collective that accepts them and every policy whose decisions reach them, in one
// bucket per layer and in buckets of a few layers.
#include <catch2/catch.hpp>

#include "bucket_checks.hpp"
#include "gravac/compress/cast16.hpp"
#include "gravac/compress/identity.hpp"
#include "gravac/compress/qsgd.hpp"
#include "gravac/compress/sign.hpp"
#include "gravac/compress/terngrad.hpp"

using namespace gravac;

TEST_CASE("async step: identity matches the synchronous step", "[buckets][async]") {
  test::check_async_all<identity>();
}
TEST_CASE("async step: QSGD matches the synchronous step", "[buckets][async]") { test::check_async_all<qsgd>(); }
TEST_CASE("async step: TernGrad matches the synchronous step", "[buckets][async]") {
  test::check_async_all<terngrad>();
}
TEST_CASE("async step: EF-sign matches the synchronous step", "[buckets][async]") { test::check_async_all<sign>(); }
TEST_CASE("async step: cast16 matches the synchronous step", "[buckets][async]") { test::check_async_all<cast16>(); }
