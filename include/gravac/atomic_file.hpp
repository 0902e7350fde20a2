#pragma once
// The public path of gravac/core/atomic_file.hpp (the core layer's own folder: docs/architecture.md).
#include "gravac/core/atomic_file.hpp"
