# examples/fault_tolerant (replica_group): processes under partrun --spares (fixed world,
# bit-identical) and --min-replicas with a replacement (dynamic world); by hand it says how to start it.
if(NOT PARTRAIN_BUILD_EXAMPLES OR NOT TARGET fault_tolerant)
  return()
endif()
if(COMMAND partrain_register_test_target)
  partrain_register_test_target(fault_tolerant processes)
endif()
set(_run ${CMAKE_CURRENT_LIST_DIR}/run_example.cmake)
add_test(NAME example_fault_tolerant_by_hand
         COMMAND ${CMAKE_COMMAND} -DPROGRAM=$<TARGET_FILE:fault_tolerant> -DEXPECT_RC=2
                 "-DEXPECT_REGEX=start it with partrun --spares N" -P ${_run})
set_tests_properties(example_fault_tolerant_by_hand PROPERTIES LABELS examples TIMEOUT 60)
add_test(NAME example_fault_tolerant_bad_argument
         COMMAND ${CMAKE_COMMAND} -DPROGRAM=$<TARGET_FILE:fault_tolerant> -DARGS=--lose -DEXPECT_RC=2
                 "-DEXPECT_REGEX=unknown argument '--lose'" -P ${_run})
set_tests_properties(example_fault_tolerant_bad_argument PROPERTIES LABELS examples TIMEOUT 60)
add_test(NAME example_fault_tolerant_bad_value
         COMMAND ${CMAKE_COMMAND} -DPROGRAM=$<TARGET_FILE:fault_tolerant> "-DARGS=--steps;12x" -DEXPECT_RC=2
                 "-DEXPECT_REGEX=--steps '12x': expected an integer from 1" -P ${_run})
set_tests_properties(example_fault_tolerant_bad_value PROPERTIES LABELS examples TIMEOUT 60)
if(TARGET partrun)
  add_test(NAME example_fault_tolerant_partrun_spares
           COMMAND ${CMAKE_COMMAND} -DPARTRUN=$<TARGET_FILE:partrun> -DPROGRAM=$<TARGET_FILE:fault_tolerant>
                   -P ${CMAKE_CURRENT_LIST_DIR}/fault_tolerant_runs.cmake)
  set_tests_properties(example_fault_tolerant_partrun_spares PROPERTIES LABELS "examples;processes" TIMEOUT 180)
  add_test(NAME example_fault_tolerant_partrun_replacement
           COMMAND ${CMAKE_COMMAND} -DPROGRAM=$<TARGET_FILE:partrun>
                   "-DARGS=--standalone;--nproc-per-node;3;--min-replicas;2;--max-replacements;1;$<TARGET_FILE:fault_tolerant>;--lose-rank;1;--at-step;10;--step-ms;10"
                   -DEXPECT_RC=0 "-DEXPECT_REGEX=rank 1 \\(pid [0-9]+\\) was killed by signal SIGKILL[^\n]*started a replacement"
                   "-DEXPECT_REGEX2=the job finished \\(1 failure\\(s\\) absorbed, 1 replacement\\(s\\) started\\)" -P ${_run})
  set_tests_properties(example_fault_tolerant_partrun_replacement PROPERTIES LABELS "examples;processes" TIMEOUT 180)
  add_test(NAME example_fault_tolerant_partrun_refusals
           COMMAND ${CMAKE_COMMAND} -DPROGRAM=$<TARGET_FILE:partrun>
                   "-DARGS=--spares;1;--min-replicas;2;$<TARGET_FILE:fault_tolerant>" -DEXPECT_RC=2
                   "-DEXPECT_REGEX=--spares \\(a fixed world\\) and --min-replicas \\(a dynamic one\\) exclude each other" -P ${_run})
  set_tests_properties(example_fault_tolerant_partrun_refusals PROPERTIES LABELS "examples;processes" TIMEOUT 60)
endif()
