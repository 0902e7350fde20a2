#pragma once
// A fixture for tests/headers/check_layers.cmake, never compiled: a packet header that
// includes the trainer (an arrow that points up).
#include "gravac/trainer.hpp"
