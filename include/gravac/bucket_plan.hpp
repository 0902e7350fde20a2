#pragma once
// The public path of gravac/core/bucket_plan.hpp (the core layer's own folder: docs/architecture.md).
#include "gravac/core/bucket_plan.hpp"
