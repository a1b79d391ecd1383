# Fuzzing the IDX reader with libFuzzer (clang only). Include this file from a CMake project that
# has partrain (e.g. `include(tests/fuzz/idx.cmake)` in tests/CMakeLists.txt) and configure
# with clang:
#   cmake -S . -B build-fuzz -G Ninja -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_BUILD_TYPE=RelWithDebInfo
#   cmake --build build-fuzz --target idx_fuzz
#   build-fuzz/tests/idx_fuzz -max_total_time=60 -max_len=65536 -rss_limit_mb=2048 \
#       -dict=tests/fuzz/idx.dict tests/fuzz/corpus/idx   (corpus is read, new inputs go to a copy)
# The target `idx_fuzz_run` does the 60-second run on a scratch copy of the seed corpus.
if(CMAKE_CXX_COMPILER_ID MATCHES "Clang" AND TARGET partrain::data)
  add_executable(idx_fuzz ${CMAKE_CURRENT_LIST_DIR}/idx_fuzz.cpp)
  target_link_libraries(idx_fuzz PRIVATE partrain::data)
  if(TARGET partrain_warnings)
    target_link_libraries(idx_fuzz PRIVATE partrain_warnings)
  endif()
  target_compile_options(idx_fuzz PRIVATE -fsanitize=fuzzer,address,undefined -fno-omit-frame-pointer
                                          -fno-sanitize-recover=all)
  target_link_options(idx_fuzz PRIVATE -fsanitize=fuzzer,address,undefined)
  set(_idx_corpus_work ${CMAKE_CURRENT_BINARY_DIR}/idx_fuzz_corpus)
  add_custom_target(idx_fuzz_run
    COMMAND ${CMAKE_COMMAND} -E copy_directory ${CMAKE_CURRENT_LIST_DIR}/corpus/idx ${_idx_corpus_work}
    COMMAND $<TARGET_FILE:idx_fuzz> -max_total_time=60 -max_len=65536 -rss_limit_mb=2048
            -dict=${CMAKE_CURRENT_LIST_DIR}/idx.dict ${_idx_corpus_work}
    DEPENDS idx_fuzz
    USES_TERMINAL
    COMMENT "Fuzzing the IDX reader for 60 s")
else()
  message(STATUS "partrain: idx_fuzz needs clang (-fsanitize=fuzzer) and zlib; left out")
endif()
