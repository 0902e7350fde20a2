#pragma once
// A fixture for tests/headers/check_layers.cmake, never compiled: the second header named
// step_settings.hpp (it holds code of its own, so it does not forward to the first).
#include "gravac/compress/step_settings.hpp"
struct fixture_step_settings_slice {};
