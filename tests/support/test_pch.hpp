#pragma once
// The unit tests' precompiled header (tests/CMakeLists.txt, GRAVAC_TEST_PCH): Catch2 and
// gravac's core headers, which nearly every unit test includes. Parsing them was about 4 s
// of each test's compile on CI's two cores, in each of the three builds of the tests (the
// main one, ASan, TSan). Tests still include what they use: a build with GRAVAC_TEST_PCH=OFF
// must compile too. A test that defines a macro gravac's headers read before including them
// (test_fused_topk_portable) does not use this header.
#include <catch2/catch.hpp>

#include "gravac/gravac.hpp"
