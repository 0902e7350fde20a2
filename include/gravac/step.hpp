#pragma once
// The public path of gravac/core/step.hpp (the core layer's own folder: docs/architecture.md).
#include "gravac/core/step.hpp"
