# data_parallel tests (included from tests/parallel/CMakeLists.txt).
partrain_add_test(test_data_parallel ${CMAKE_CURRENT_LIST_DIR}/test_data_parallel.cpp LABELS "parallel;threads")
if(PARTRAIN_HAVE_CUDA)
  include(${PROJECT_SOURCE_DIR}/tests/cuda/gpu_test.cmake)
  partrain_add_gpu_test(test_data_parallel_cuda ${CMAKE_CURRENT_LIST_DIR}/test_data_parallel_cuda.cu LABELS parallel gpu)
endif()
