# Fuzzing the safetensors reader (train/safetensors.hpp) with libFuzzer. Included by
# tests/fuzz/CMakeLists.txt (its own project, clang only):
#   CC=clang CXX=clang++ cmake -S tests/fuzz -B build-fuzz -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo
#   cmake --build build-fuzz --target safetensors_fuzz
#   mkdir -p /tmp/st-corpus && cp tests/fuzz/corpus/safetensors/* /tmp/st-corpus/
#   build-fuzz/safetensors_fuzz -max_total_time=60 -max_len=4096 -rss_limit_mb=2048 \
#       -dict=tests/fuzz/safetensors.dict /tmp/st-corpus
# The target `safetensors_fuzz_run` does the 60-second run on a scratch copy of the seed corpus.
# The normal test suite replays the seed corpus through the same code (test_safetensors_fuzz_replay).
if(CMAKE_CXX_COMPILER_ID MATCHES "Clang")
  add_executable(safetensors_fuzz ${CMAKE_CURRENT_LIST_DIR}/safetensors_fuzz.cpp)
  target_link_libraries(safetensors_fuzz PRIVATE partrain::partrain)
  if(TARGET partrain_warnings)
    target_link_libraries(safetensors_fuzz PRIVATE partrain_warnings)
  endif()
  target_compile_options(safetensors_fuzz PRIVATE -fsanitize=fuzzer,address,undefined -fno-omit-frame-pointer
                                                  -fno-sanitize-recover=all)
  target_link_options(safetensors_fuzz PRIVATE -fsanitize=fuzzer,address,undefined)
  set(_st_corpus_work ${CMAKE_CURRENT_BINARY_DIR}/safetensors_fuzz_corpus)
  add_custom_target(safetensors_fuzz_run
    COMMAND ${CMAKE_COMMAND} -E copy_directory ${CMAKE_CURRENT_LIST_DIR}/corpus/safetensors ${_st_corpus_work}
    COMMAND $<TARGET_FILE:safetensors_fuzz> -max_total_time=60 -max_len=4096 -rss_limit_mb=2048
            -dict=${CMAKE_CURRENT_LIST_DIR}/safetensors.dict ${_st_corpus_work}
    DEPENDS safetensors_fuzz
    USES_TERMINAL
    COMMENT "Fuzzing the safetensors reader for 60 s")
else()
  message(STATUS "partrain: safetensors_fuzz needs clang (-fsanitize=fuzzer); left out")
endif()
