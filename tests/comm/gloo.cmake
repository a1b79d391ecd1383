# The gloo backend's tests: only where Gloo was found (partrain::gloo exists).
if(TARGET partrain::gloo)
  partrain_add_test(test_comm_gloo ${CMAKE_CURRENT_LIST_DIR}/test_gloo.cpp LIBS partrain::gloo LABELS "comm;processes")
endif()
