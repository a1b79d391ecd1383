// The translation unit that builds the tests' precompiled header (tests/CMakeLists.txt,
// partrain_test_pch): Catch2's header, reused by every C++ test.
