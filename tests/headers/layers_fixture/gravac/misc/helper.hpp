#pragma once
// A fixture for tests/headers/check_layers.cmake, never compiled: a header in a folder the
// table of layers does not list.
#include "gravac/core/error.hpp"
