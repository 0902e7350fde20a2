#pragma once
// The public path of gravac/concepts/composition.hpp (the concepts layer's own folder: docs/architecture.md).
#include "gravac/concepts/composition.hpp"
