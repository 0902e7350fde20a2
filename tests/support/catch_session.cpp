// Catch2's implementation, compiled once for every test main (plain, MPI, CUDA, NCCL):
// CATCH_CONFIG_RUNNER compiles it without a main(). It was compiled into each of the four
// mains before, about 20 s of CPU apiece in every build of the tests.
#define CATCH_CONFIG_RUNNER
#include "catch_session.hpp"

#include <catch2/catch.hpp>

int gravac_test::run_catch_session(int argc, char** argv) { return Catch::Session().run(argc, argv); }
