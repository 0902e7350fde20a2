// Determinism with PowerSGD: for every collective that accepts it and every policy, the
// same 20-step training on 6 thread ranks (run_ranks over thread_communicator), run twice
// in one process with another training in between, gives bit-identical outputs, decisions
// and residuals on every rank (tests/support/determinism_checks.hpp).
#include <catch2/catch.hpp>

#include "determinism_checks.hpp"
#include "gravac/compress/powersgd.hpp"

using namespace gravac;

TEST_CASE("determinism: PowerSGD repeats bit for bit", "[determinism]") { test::check_determinism_all<powersgd>(); }
