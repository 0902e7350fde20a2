#pragma once
// A fixture for tests/headers/check_layers.cmake, never compiled: a core header.
