#pragma once
// The public path of gravac/core/memory.hpp (the core layer's own folder: docs/architecture.md).
#include "gravac/core/memory.hpp"
