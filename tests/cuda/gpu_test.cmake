# partrain_add_gpu_test(name SOURCES... [LIBS ...] [LABELS ...]): one GPU test executable with
# the main of tests/cuda/gpu_main.cpp, which exits 77 when no usable CUDA device and driver are
# present; ctest reports that as Skipped (SKIP_RETURN_CODE), never as a pass with nothing
# checked. One ctest per executable (no Catch discovery: listing would need no GPU, running
# does). Every gpu-labelled executable is made with it, in whichever area folder it lives.
include_guard(GLOBAL)

if(NOT TARGET partrain_gpu_main)
  add_library(partrain_gpu_main STATIC ${CMAKE_CURRENT_LIST_DIR}/gpu_main.cpp)
  target_link_libraries(partrain_gpu_main PUBLIC Catch2::Catch2 partrain::cuda PRIVATE partrain_warnings)
endif()

function(partrain_add_gpu_test name)
  cmake_parse_arguments(ARG "" "" "SOURCES;LIBS;LABELS" ${ARGN})
  if(NOT ARG_LABELS)
    set(ARG_LABELS gpu)
  endif()
  if(NOT "gpu" IN_LIST ARG_LABELS)
    list(APPEND ARG_LABELS gpu)
  endif()
  add_executable(${name} ${ARG_SOURCES} ${ARG_UNPARSED_ARGUMENTS})
  target_link_libraries(${name} PRIVATE partrain::cuda ${ARG_LIBS} partrain_gpu_main partrain_warnings)
  target_include_directories(${name} PRIVATE ${PROJECT_SOURCE_DIR}/tests/support ${PROJECT_SOURCE_DIR}/examples)
  add_test(NAME ${name} COMMAND ${name} -w NoAssertions)  # a case that checks nothing fails
  set_tests_properties(${name} PROPERTIES LABELS "${ARG_LABELS}" SKIP_RETURN_CODE 77 TIMEOUT 300)
  partrain_register_test_target(${name} ${ARG_LABELS})
endfunction()
