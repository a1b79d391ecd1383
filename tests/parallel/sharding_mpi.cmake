# ZeRO and FSDP on the mpi backend: only where MPI was found. Run under mpirun at 2 and 3 ranks
# (3 on a 2-core machine needs --oversubscribe, which PARTRAIN_MPIEXEC_FLAGS carries).
if(NOT TARGET partrain::mpi OR NOT MPIEXEC_EXECUTABLE)
  return()
endif()
add_executable(test_sharding_mpi ${CMAKE_CURRENT_LIST_DIR}/test_sharding_mpi.cpp
                                 ${PROJECT_SOURCE_DIR}/tests/comm/mpi_keep_modules.cpp)
target_link_libraries(test_sharding_mpi PRIVATE partrain::mpi ${PARTRAIN_CATCH_MAIN} partrain_warnings
                                        partrain_test_flags partrain_test_sanitizers)
target_include_directories(test_sharding_mpi PRIVATE ${PROJECT_SOURCE_DIR}/tests/support ${PROJECT_SOURCE_DIR}/models)
foreach(np 2 3)
  add_test(NAME sharding_mpi_np${np}
           COMMAND ${MPIEXEC_EXECUTABLE} ${PARTRAIN_MPIEXEC_FLAGS} -np ${np} $<TARGET_FILE:test_sharding_mpi> -w NoAssertions)
  set_tests_properties(sharding_mpi_np${np} PROPERTIES LABELS "parallel;mpi;processes" TIMEOUT 120)
  if(PARTRAIN_TESTS_UNDER_ASAN)
    set_tests_properties(sharding_mpi_np${np} PROPERTIES ENVIRONMENT
      "LSAN_OPTIONS=suppressions=${PROJECT_SOURCE_DIR}/.ci/lsan-mpi.supp:fast_unwind_on_malloc=0")
  endif()
endforeach()
partrain_register_test_target(test_sharding_mpi mpi)
