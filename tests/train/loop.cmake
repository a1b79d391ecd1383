# The loop pieces (task, views::epochs/steps/every); included by tests/train/CMakeLists.txt.
partrain_add_test(test_train_loop SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_task.cpp ${CMAKE_CURRENT_LIST_DIR}/test_loop.cpp
                  LABELS train threads)
# The trainer (fit) over the three policies.
partrain_add_test(test_train_trainer SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_trainer.cpp LABELS train threads)
# One layer description (sequential) through fit under every mode, against one process.
partrain_add_test(test_train_one_model SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_one_model.cpp LABELS train threads)
target_include_directories(test_train_one_model PRIVATE ${PROJECT_SOURCE_DIR}/models)
