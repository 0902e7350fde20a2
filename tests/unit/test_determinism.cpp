// Determinism on threads: for every compressor (PowerSGD: test_determinism_powersgd.cpp),
// every collective that accepts it and every policy, the same 20-step training on 6 thread
// ranks (run_ranks over thread_communicator, more ranks than cores), run twice in one
// process with another training in between, gives bit-identical outputs, decisions and
// residuals on every rank (tests/support/determinism_checks.hpp). Policies and collectives
// that could decide on measured time run on a clock that does not measure.
#include <catch2/catch.hpp>

#include "determinism_checks.hpp"
#include "gravac/compress/adacomp.hpp"
#include "gravac/compress/cast16.hpp"
#include "gravac/compress/identity.hpp"
#include "gravac/compress/qsgd.hpp"
#include "gravac/compress/randomk.hpp"
#include "gravac/compress/sign.hpp"
#include "gravac/compress/terngrad.hpp"
#include "gravac/compress/threshold.hpp"
#include "gravac/compress/topk.hpp"

using namespace gravac;

TEST_CASE("determinism: top-k repeats bit for bit", "[determinism]") { test::check_determinism_all<topk>(); }
TEST_CASE("determinism: threshold repeats bit for bit", "[determinism]") { test::check_determinism_all<threshold>(); }
TEST_CASE("determinism: random-k repeats bit for bit", "[determinism]") { test::check_determinism_all<randomk>(); }
TEST_CASE("determinism: identity repeats bit for bit", "[determinism]") { test::check_determinism_all<identity>(); }
TEST_CASE("determinism: AdaComp repeats bit for bit", "[determinism]") { test::check_determinism_all<adacomp>(); }
TEST_CASE("determinism: QSGD repeats bit for bit", "[determinism]") { test::check_determinism_all<qsgd>(); }
TEST_CASE("determinism: TernGrad repeats bit for bit", "[determinism]") { test::check_determinism_all<terngrad>(); }
TEST_CASE("determinism: EF-sign repeats bit for bit", "[determinism]") { test::check_determinism_all<sign>(); }
TEST_CASE("determinism: cast16 repeats bit for bit", "[determinism]") { test::check_determinism_all<cast16>(); }
