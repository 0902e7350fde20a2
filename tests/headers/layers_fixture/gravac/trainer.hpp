#pragma once
// A fixture for tests/headers/check_layers.cmake, never compiled: an include through a
// macro, which would hide its arrow from the check.
#define GRAVAC_FIXTURE_HIDDEN "gravac/packet/format.hpp"
#include GRAVAC_FIXTURE_HIDDEN
