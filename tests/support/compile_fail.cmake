# Runs a compile-fail case: the compiler must refuse SOURCE, and the FIRST error it prints must
# match EXPECT (a partrain sentence, not constraint notes). Called by partrain_compile_fail_test.
#   cmake -DCOMPILER=c++ "-DFLAGS=-std=c++20|-I..." -DSOURCE=case.cpp -DEXPECT=regex -P compile_fail.cmake
string(REPLACE "|" ";" FLAGS "${FLAGS}")
execute_process(COMMAND ${COMPILER} ${FLAGS} -fsyntax-only ${SOURCE} RESULT_VARIABLE rc OUTPUT_VARIABLE out
                ERROR_VARIABLE err)
if(rc EQUAL 0)
  message(FATAL_ERROR "${SOURCE} compiled; it must not")
endif()
string(REGEX MATCH "[^\n]*error:[^\n]*" first "${err}")
if(NOT first)
  message(FATAL_ERROR "${SOURCE}: the compiler failed without an error line:\n${err}")
endif()
if(NOT first MATCHES "${EXPECT}")
  message(FATAL_ERROR "${SOURCE}: the first error is\n  ${first}\nexpected it to match\n  ${EXPECT}\nwhole output:\n${err}")
endif()
message(STATUS "first error: ${first}")
