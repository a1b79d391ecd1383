# Fuzzing the TCP store's message parser (rendezvous/detail/store_protocol.hpp) with libFuzzer.
# Included by tests/fuzz/CMakeLists.txt (its own project, clang only):
#   CC=clang CXX=clang++ cmake -S tests/fuzz -B build-fuzz -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo
#   cmake --build build-fuzz --target store_message_fuzz
#   mkdir -p /tmp/store-corpus && cp tests/fuzz/corpus/store/* /tmp/store-corpus/
#   build-fuzz/store_message_fuzz -max_total_time=60 -max_len=4096 -rss_limit_mb=2048 \
#       -dict=tests/fuzz/store.dict /tmp/store-corpus
# The target `store_message_fuzz_run` does the 60-second run on a scratch copy of the seed corpus.
# The normal test suite replays the seed corpus through the same code (test_store_fuzz_replay).
if(CMAKE_CXX_COMPILER_ID MATCHES "Clang")
  add_executable(store_message_fuzz ${CMAKE_CURRENT_LIST_DIR}/store_message_fuzz.cpp)
  target_link_libraries(store_message_fuzz PRIVATE partrain::partrain)
  if(TARGET partrain_warnings)
    target_link_libraries(store_message_fuzz PRIVATE partrain_warnings)
  endif()
  target_compile_options(store_message_fuzz PRIVATE -fsanitize=fuzzer,address,undefined -fno-omit-frame-pointer
                                                    -fno-sanitize-recover=all)
  target_link_options(store_message_fuzz PRIVATE -fsanitize=fuzzer,address,undefined)
  set(_store_corpus_work ${CMAKE_CURRENT_BINARY_DIR}/store_fuzz_corpus)
  add_custom_target(store_message_fuzz_run
    COMMAND ${CMAKE_COMMAND} -E copy_directory ${CMAKE_CURRENT_LIST_DIR}/corpus/store ${_store_corpus_work}
    COMMAND $<TARGET_FILE:store_message_fuzz> -max_total_time=60 -max_len=4096 -rss_limit_mb=2048
            -dict=${CMAKE_CURRENT_LIST_DIR}/store.dict ${_store_corpus_work}
    DEPENDS store_message_fuzz
    USES_TERMINAL
    COMMENT "Fuzzing the store message parser for 60 s")
else()
  message(STATUS "partrain: store_message_fuzz needs clang (-fsanitize=fuzzer); left out")
endif()
