# The loop pieces (task, views::epochs/steps/every); included by tests/train/CMakeLists.txt.
partrain_add_test(test_train_loop SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_task.cpp ${CMAKE_CURRENT_LIST_DIR}/test_loop.cpp
                  LABELS train threads)
# The trainer (fit) over the three policies.
partrain_add_test(test_train_trainer SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_trainer.cpp LABELS train threads)
# One layer description (sequential) through fit under every mode, against one process.
partrain_add_test(test_train_one_model SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_one_model.cpp LABELS train threads)
target_include_directories(test_train_one_model PRIVATE ${PROJECT_SOURCE_DIR}/models)
include(${PROJECT_SOURCE_DIR}/models/openblas.cmake)
if(PARTRAIN_EXAMPLE_HAVE_OPENBLAS)  # the CNN's convolutions are OpenBLAS GEMMs
  target_link_libraries(test_train_one_model PRIVATE partrain_example_openblas)
  target_compile_definitions(test_train_one_model PRIVATE PARTRAIN_TEST_HAVE_OPENBLAS=1)
endif()
