# The mpi backend's tests: only where MPI was found (partrain::mpi exists). The collective tests
# run under mpirun at 1, 2 and 3 ranks (3 on a 2-core machine needs --oversubscribe); the fault
# tests start their own jobs (PARTRAIN_MPIEXEC_FLAGS: see cmake/partrain_backends.cmake).
if(NOT TARGET partrain::mpi OR NOT MPIEXEC_EXECUTABLE)
  return()
endif()
set(partrain_mpiexec_flags ${PARTRAIN_MPIEXEC_FLAGS})

add_executable(test_comm_mpi ${CMAKE_CURRENT_LIST_DIR}/test_mpi.cpp ${CMAKE_CURRENT_LIST_DIR}/mpi_keep_modules.cpp)
target_link_libraries(test_comm_mpi PRIVATE partrain::mpi ${PARTRAIN_CATCH_MAIN} partrain_warnings
                                    partrain_test_flags partrain_test_sanitizers)
target_include_directories(test_comm_mpi PRIVATE ${PROJECT_SOURCE_DIR}/tests/support)
foreach(np 1 2 3)
  add_test(NAME mpi_collectives_np${np}
           COMMAND ${MPIEXEC_EXECUTABLE} ${partrain_mpiexec_flags} -np ${np} $<TARGET_FILE:test_comm_mpi> -w NoAssertions)
  set_tests_properties(mpi_collectives_np${np} PROPERTIES LABELS "comm;mpi;processes" TIMEOUT 120)
endforeach()

add_executable(mpi_fault_rank ${CMAKE_CURRENT_LIST_DIR}/mpi_fault_rank.cpp ${CMAKE_CURRENT_LIST_DIR}/mpi_keep_modules.cpp)
target_link_libraries(mpi_fault_rank PRIVATE partrain::mpi partrain_warnings partrain_test_flags partrain_test_sanitizers)
list(JOIN partrain_mpiexec_flags " " partrain_mpiexec_flags_text)
partrain_add_test(test_comm_mpi_faults ${CMAKE_CURRENT_LIST_DIR}/test_mpi_faults.cpp LABELS "comm;mpi;processes")
add_dependencies(test_comm_mpi_faults mpi_fault_rank)
target_compile_definitions(test_comm_mpi_faults PRIVATE
  PARTRAIN_MPIEXEC="${MPIEXEC_EXECUTABLE}"
  PARTRAIN_MPIEXEC_FLAGS="${partrain_mpiexec_flags_text}"
  PARTRAIN_MPI_FAULT_RANK="$<TARGET_FILE:mpi_fault_rank>")
partrain_register_test_target(test_comm_mpi mpi)

# Under AddressSanitizer: Open MPI's known leaks are suppressed (.ci/lsan-mpi.supp); the slow
# unwinder gives whole stacks (the fast one stops inside Open MPI's frame-pointer-less code, so a
# suppression sometimes cannot see which library leaked).
if(PARTRAIN_TESTS_UNDER_ASAN)
  set(partrain_mpi_lsan "LSAN_OPTIONS=suppressions=${PROJECT_SOURCE_DIR}/.ci/lsan-mpi.supp:fast_unwind_on_malloc=0")
  set_tests_properties(mpi_collectives_np1 mpi_collectives_np2 mpi_collectives_np3 PROPERTIES ENVIRONMENT "${partrain_mpi_lsan}")
  set_property(DIRECTORY APPEND PROPERTY TEST_INCLUDE_FILES ${CMAKE_CURRENT_BINARY_DIR}/test_comm_mpi_faults_lsan.cmake)
  file(WRITE ${CMAKE_CURRENT_BINARY_DIR}/test_comm_mpi_faults_lsan.cmake
    "foreach(t IN LISTS test_comm_mpi_faults_TESTS)\n  set_tests_properties(\"\${t}\" PROPERTIES ENVIRONMENT \"${partrain_mpi_lsan}\")\nendforeach()\n")
endif()
