#pragma once
// The public path of gravac/core/error.hpp (the core layer's own folder: docs/architecture.md).
#include "gravac/core/error.hpp"
