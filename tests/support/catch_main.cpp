// The main of the single-process tests, compiled once and shared (Catch2 itself is in
// catch_session.cpp).
#include "catch_session.hpp"

int main(int argc, char** argv) { return gravac_test::run_catch_session(argc, argv); }
