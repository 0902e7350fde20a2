#pragma once
// The entry point into Catch2 for the test mains. Catch2 2.x declares Catch::Session only
// in the translation unit that compiles its implementation (catch_session.cpp, once for
// every main), so the mains call this instead.

namespace gravac_test {

//! Runs the registered test cases with the command line \p argc / \p argv; returns
//! Catch2's exit code (0 when every case passed).
int run_catch_session(int argc, char** argv);

}  // namespace gravac_test
