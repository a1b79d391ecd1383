# Observability (progress, metrics, trace, logging, plots); included by tests/train/CMakeLists.txt.
partrain_add_test(test_obs SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_progress.cpp ${CMAKE_CURRENT_LIST_DIR}/test_metrics.cpp
                  ${CMAKE_CURRENT_LIST_DIR}/test_trace.cpp ${CMAKE_CURRENT_LIST_DIR}/test_log.cpp
                  LIBS util LABELS train threads)

# The merged trace read back by a JSON parser that is not ours: the hidden [trace_sample] case writes
# it where PARTRAIN_TRACE says, then python3 -m json.tool must accept it.
find_package(Python3 COMPONENTS Interpreter QUIET)
set(_obs_trace ${CMAKE_CURRENT_BINARY_DIR}/obs_sample_trace.json)
add_test(NAME obs_trace_sample_write COMMAND test_obs "[trace_sample]")
set_tests_properties(obs_trace_sample_write PROPERTIES ENVIRONMENT "PARTRAIN_TRACE=${_obs_trace}"
                     FIXTURES_SETUP obs_trace_sample LABELS "train;threads" TIMEOUT 60)
if(Python3_Interpreter_FOUND)
  add_test(NAME obs_trace_json_tool COMMAND ${Python3_EXECUTABLE} -m json.tool ${_obs_trace})
  set_tests_properties(obs_trace_json_tool PROPERTIES FIXTURES_REQUIRED obs_trace_sample LABELS "train" TIMEOUT 60)
  # The plot tool: a sample metrics file becomes a PNG of the asked size (skipped without gnuplot).
  add_test(NAME obs_plot_metrics
           COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_LIST_DIR}/check_plot.py ${PROJECT_SOURCE_DIR}/tools/plot_metrics.py
                   ${CMAKE_CURRENT_BINARY_DIR}/obs_plot)
  set_tests_properties(obs_plot_metrics PROPERTIES LABELS "tools" SKIP_RETURN_CODE 77 TIMEOUT 60)
endif()
