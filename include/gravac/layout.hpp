#pragma once
// The public path of gravac/core/layout.hpp (the core layer's own folder: docs/architecture.md).
#include "gravac/core/layout.hpp"
