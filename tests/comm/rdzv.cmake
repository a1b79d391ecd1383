# Rendezvous: stores, init_process_group, spawn (included by tests/comm/CMakeLists.txt).
partrain_add_test(test_comm_store ${CMAKE_CURRENT_LIST_DIR}/test_store.cpp LABELS "comm;processes")
partrain_add_test(test_comm_spawn ${CMAKE_CURRENT_LIST_DIR}/test_spawn.cpp LABELS "comm;processes")
if(TARGET partrain::gloo)
  partrain_add_test(test_comm_init ${CMAKE_CURRENT_LIST_DIR}/test_init.cpp LIBS partrain::gloo LABELS "comm;processes")
else()
  partrain_add_test(test_comm_init ${CMAKE_CURRENT_LIST_DIR}/test_init.cpp LABELS "comm;processes")
endif()
# The fuzz target's seed corpus, replayed through the same code with any compiler.
add_executable(test_store_fuzz_replay ${CMAKE_CURRENT_LIST_DIR}/../fuzz/store_message_fuzz.cpp)
target_compile_definitions(test_store_fuzz_replay PRIVATE PARTRAIN_FUZZ_REPLAY_MAIN)
target_link_libraries(test_store_fuzz_replay PRIVATE partrain::partrain partrain_warnings)
add_test(NAME test_store_fuzz_replay COMMAND test_store_fuzz_replay ${CMAKE_CURRENT_LIST_DIR}/../fuzz/corpus/store)
set_tests_properties(test_store_fuzz_replay PROPERTIES LABELS "comm" TIMEOUT 60)
