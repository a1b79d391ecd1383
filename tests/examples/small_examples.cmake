# The small examples (examples/<name>/, one idea each) as tests: each program runs at its own small
# size and must exit 0 and print the lines that prove it worked (a final loss below a threshold,
# ranks that agree bit for bit, ...). None of them needs OpenBLAS. Included by CMakeLists.txt here.
# Each also answers --help with its usage (exit 0) and refuses an argument it does not take by
# name, saying what it takes (exit 2), before it trains anything.
if(NOT PARTRAIN_BUILD_EXAMPLES)
  return()  # ends this file only
endif()

# small_example_test(name LABELS ... [PROGRAM exe] [ARGS ...] REGEX first second)
function(small_example_test name)
  cmake_parse_arguments(ARG "" "PROGRAM" "LABELS;ARGS;REGEX" ${ARGN})
  if(NOT ARG_PROGRAM)
    set(ARG_PROGRAM $<TARGET_FILE:${name}>)
  endif()
  list(GET ARG_REGEX 0 regex1)
  list(GET ARG_REGEX 1 regex2)
  add_test(NAME example_${name}
           COMMAND ${CMAKE_COMMAND} -DPROGRAM=${ARG_PROGRAM} "-DARGS=${ARG_ARGS}" -DEXPECT_RC=0
                   "-DEXPECT_REGEX=${regex1}" "-DEXPECT_REGEX2=${regex2}"
                   -P ${CMAKE_CURRENT_FUNCTION_LIST_DIR}/run_example.cmake)
  set_tests_properties(example_${name} PROPERTIES LABELS "examples;${ARG_LABELS}" TIMEOUT 120)
  if(COMMAND partrain_register_test_target)  # CI builds a label's executables
    partrain_register_test_target(${name} ${ARG_LABELS})
  endif()
  add_test(NAME example_${name}_help
           COMMAND ${CMAKE_COMMAND} -DPROGRAM=${ARG_PROGRAM} -DARGS=--help -DEXPECT_RC=0
                   "-DEXPECT_REGEX=^usage: ${name} " "-DEXPECT_REGEX2=build/examples/${name}/${name}"
                   -P ${CMAKE_CURRENT_FUNCTION_LIST_DIR}/run_example.cmake)
  add_test(NAME example_${name}_unknown_argument
           COMMAND ${CMAKE_COMMAND} -DPROGRAM=${ARG_PROGRAM} -DARGS=--no-such-option -DEXPECT_RC=2
                   "-DEXPECT_REGEX=^${name}: unknown argument '--no-such-option' \\(it takes [^)]+\\)"
                   -P ${CMAKE_CURRENT_FUNCTION_LIST_DIR}/run_example.cmake)
  set_tests_properties(example_${name}_help example_${name}_unknown_argument PROPERTIES
                       LABELS "examples;${ARG_LABELS}" TIMEOUT 30)
endfunction()

small_example_test(ddp LABELS threads
  REGEX "final loss 0\\.000[0-9]+" "parameters bit-identical on all 2 ranks")
small_example_test(zero LABELS threads
  REGEX "rank 0 keeps momentum for 2 of the 5 parameter values; step over shared memory"
        "final loss 0\\.000[0-9]+, parameters bit-identical on all 2 ranks")
small_example_test(data_parallel LABELS threads
  REGEX "final loss 0\\.000[0-9]+ on 2 devices" "largest difference from one device")
small_example_test(pipeline LABELS threads
  REGEX "stage 0: F0 F1 B0 F2 B1 F3 B2 B3" "final loss 0\\.0[0-4][0-9]* \\(from [1-9]")
small_example_test(one_model LABELS threads
  REGEX "fsdp +test_accuracy [01]\\.[0-9]+" "lowest test_accuracy (0\\.9[5-9][0-9]|1\\.000) over 7 mode")
# Its modes are checked before the first one trains.
add_test(NAME example_one_model_unknown_mode
         COMMAND ${CMAKE_COMMAND} -DPROGRAM=$<TARGET_FILE:one_model> "-DARGS=ddp;fsdpp" -DEXPECT_RC=2
                 "-DEXPECT_REGEX=^one_model: unknown argument 'fsdpp' \\(it takes modes: ddp zero2 fsdp pipeline dp local-sgd diloco; or --help\\)"
                 -P ${CMAKE_CURRENT_LIST_DIR}/run_example.cmake)
set_tests_properties(example_one_model_unknown_mode PROPERTIES LABELS "examples;threads" TIMEOUT 30)
small_example_test(mixed_precision LABELS threads precision
  REGEX "step +0 +skipped: a gradient overflowed fp16 at scale 65536, scale now 32768"
        "final loss 0\\.000[0-9]+, loss scale [0-9]+, [1-9][0-9]* step\\(s\\) skipped")

# Under mpirun with no other variables: one job of 3 ranks over Gloo (detect_launch), the store on
# this host at a port from Open MPI's job id; not three jobs of 2 threads each (which print "all 2").
if(TARGET partrain::gloo AND MPIEXEC_EXECUTABLE)
  set(_mpi_args "${PARTRAIN_MPIEXEC_FLAGS};-np;3;$<TARGET_FILE:ddp>")
  add_test(NAME example_ddp_mpirun
           COMMAND ${CMAKE_COMMAND} -DPROGRAM=${MPIEXEC_EXECUTABLE} "-DARGS=${_mpi_args}" -DEXPECT_RC=0
                   "-DEXPECT_REGEX=final loss 0\\.000[0-9]+"
                   "-DEXPECT_REGEX2=parameters bit-identical on all 3 ranks"
                   -P ${CMAKE_CURRENT_LIST_DIR}/run_example.cmake)
  set_tests_properties(example_ddp_mpirun PROPERTIES LABELS "examples;processes;mpi" TIMEOUT 120)
endif()

# The same program as two processes started by the launcher, as a user runs it.
if(TARGET partrain::gloo AND TARGET partrun)
  add_test(NAME example_ddp_partrun
           COMMAND ${CMAKE_COMMAND} -DPROGRAM=$<TARGET_FILE:partrun>
                   "-DARGS=--standalone;--nproc-per-node;2;$<TARGET_FILE:ddp>" -DEXPECT_RC=0
                   "-DEXPECT_REGEX=\\[rank 0\\] final loss 0\\.000[0-9]+"
                   "-DEXPECT_REGEX2=parameters bit-identical on all 2 ranks"
                   -P ${CMAKE_CURRENT_LIST_DIR}/run_example.cmake)
  set_tests_properties(example_ddp_partrun PROPERTIES LABELS "examples;processes" TIMEOUT 120)
  if(COMMAND partrain_register_test_target)
    partrain_register_test_target(partrun processes)
  endif()
else()
  message(STATUS "partrain: example_ddp_partrun left out (it needs Gloo and the partrun launcher)")
endif()

# The CUDA skeleton: Skipped, never Passed, where no GPU answers (the program says so and exits 77).
if(TARGET custom_cuda_model)
  small_example_test(custom_cuda_model LABELS gpu
    REGEX "final loss 0\\.000[0-9]+" "rank\\(s\\) over (local|nccl|gloo)")
  set_tests_properties(example_custom_cuda_model PROPERTIES
    SKIP_REGULAR_EXPRESSION "no CUDA-capable device|driver version is insufficient")
endif()
