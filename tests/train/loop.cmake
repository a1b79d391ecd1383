# The loop pieces (task, views::epochs/steps/every); included by tests/train/CMakeLists.txt.
partrain_add_test(test_train_loop SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_task.cpp ${CMAKE_CURRENT_LIST_DIR}/test_loop.cpp
                  LABELS train threads)
# The trainer (fit) over the three policies.
partrain_add_test(test_train_trainer SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_trainer.cpp LABELS train threads)
