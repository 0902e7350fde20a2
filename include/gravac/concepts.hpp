#pragma once
// The public path of gravac/concepts/concepts.hpp (the concepts layer's own folder: docs/architecture.md).
#include "gravac/concepts/concepts.hpp"
