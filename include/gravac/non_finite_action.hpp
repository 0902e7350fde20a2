#pragma once
// The public path of gravac/core/non_finite_action.hpp (the core layer's own folder: docs/architecture.md).
#include "gravac/core/non_finite_action.hpp"
