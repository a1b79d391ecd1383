# Communication-efficient training (issue 18): post-local SGD, DiLoCo, PowerSGD, on the local
# (threads) backend. Included from tests/parallel/CMakeLists.txt.
partrain_add_test(test_local_sgd SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_local_sgd.cpp LABELS "parallel;threads")
partrain_add_test(test_diloco SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_diloco.cpp LABELS "parallel;threads")
partrain_add_test(test_powersgd SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_powersgd.cpp LABELS "parallel;threads")
