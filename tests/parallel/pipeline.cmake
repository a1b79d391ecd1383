# Pipeline parallelism (owned by the pipeline area; included from tests/parallel/CMakeLists.txt).
partrain_add_test(test_pipeline_schedule SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_pipeline_schedule.cpp
  LABELS "parallel;pipeline")
partrain_add_test(test_pipeline_threads SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_pipeline_threads.cpp
  LABELS "parallel;pipeline;threads")
if(TARGET partrain::gloo)
  partrain_add_test(test_pipeline_gloo SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_pipeline_gloo.cpp LIBS partrain::gloo
    LABELS "parallel;pipeline;processes")
endif()
# The layered MLP the tests split into stages is the example's (a user model).
foreach(t test_pipeline_threads test_pipeline_gloo)
  if(TARGET ${t})
    target_include_directories(${t} PRIVATE ${PROJECT_SOURCE_DIR}/models)
  endif()
endforeach()
