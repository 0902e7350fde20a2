// The translation unit that gravac_test_pch compiles its precompiled header (test_pch.hpp) in.
