#pragma once
// A fixture for tests/headers/check_layers.cmake, never compiled: one of two headers that
// share a name (trainer/detail/step_settings.hpp is the other).
