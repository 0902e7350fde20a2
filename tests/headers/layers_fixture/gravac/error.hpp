#pragma once
// A fixture for tests/headers/check_layers.cmake, never compiled: the old public path of
// core/error.hpp, which shares its name without being a second header.
#include "gravac/core/error.hpp"
