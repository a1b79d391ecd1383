# deterministic_data_parallel: the same bits at any world size (the example's MLP and ViT layers,
# so OpenBLAS).
include(${PROJECT_SOURCE_DIR}/models/openblas.cmake)
if(PARTRAIN_EXAMPLE_HAVE_OPENBLAS)
  partrain_add_test(test_deterministic SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_deterministic.cpp
                    LIBS partrain_example_openblas LABELS "parallel;threads")
  target_include_directories(test_deterministic PRIVATE ${PROJECT_SOURCE_DIR}/models)
endif()
if(PARTRAIN_EXAMPLE_HAVE_OPENBLAS)
  partrain_add_test(test_deterministic_fsdp SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_deterministic_fsdp.cpp
                    LIBS partrain_example_openblas LABELS "parallel;threads")
  target_include_directories(test_deterministic_fsdp PRIVATE ${PROJECT_SOURCE_DIR}/models)
endif()
