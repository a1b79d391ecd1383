# Communication-efficient training (issue 18): post-local SGD, DiLoCo, PowerSGD, on the local
# (threads) backend. Included from tests/parallel/CMakeLists.txt.
partrain_add_test(test_local_sgd SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_local_sgd.cpp LABELS "parallel;threads")
partrain_add_test(test_diloco SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_diloco.cpp LABELS "parallel;threads")
partrain_add_test(test_powersgd SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_powersgd.cpp LABELS "parallel;threads")
if(PARTRAIN_HAVE_CUDA)
  # CUDA parameters (host mirrors); compiled wherever nvcc is, runs (label gpu) where a GPU is.
  set(_ce_cuda_libs partrain::cuda)
  if(TARGET partrain::nccl)
    set(_ce_cuda_libs partrain::nccl)  # adds the NCCL world-size-1 case
  endif()
  include(${PROJECT_SOURCE_DIR}/tests/cuda/gpu_test.cmake)
  partrain_add_gpu_test(test_comm_efficient_cuda SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_comm_efficient_cuda.cu
                        LIBS ${_ce_cuda_libs} LABELS parallel gpu)
endif()
