// The Catch2 main of the single-process tests, compiled once and shared.
#define CATCH_CONFIG_MAIN
#include <catch2/catch.hpp>
