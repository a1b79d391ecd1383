# DistributedDataParallel (owned by the ddp area; included from tests/parallel/CMakeLists.txt).
partrain_add_test(test_ddp SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_ddp.cpp LABELS "parallel;threads")
if(TARGET partrain::gloo)
  partrain_add_test(test_ddp_gloo SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_ddp_gloo.cpp LIBS partrain::gloo
                    LABELS "parallel;processes")
endif()
if(PARTRAIN_HAVE_CUDA)
  # Compiled wherever nvcc is; runs (label gpu) where a GPU is, and skips itself elsewhere.
  set(_ddp_cuda_libs partrain::cuda)
  if(TARGET partrain::nccl)
    set(_ddp_cuda_libs partrain::nccl)  # adds the NCCL world-size-1 test
  endif()
  include(${PROJECT_SOURCE_DIR}/tests/cuda/gpu_test.cmake)
  partrain_add_gpu_test(test_ddp_cuda SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_ddp_cuda.cu LIBS ${_ddp_cuda_libs}
                        LABELS parallel gpu)
endif()

# Concept failures read as one sentence: each snippet must fail to compile with its message first.
foreach(case_and_message
    "sgd_int_parameters|optimizers and clipping update float or double parameters"
    "ddp_evaluate_without_eval_step|evaluate needs `eval_result eval_step\\(const Batch&\\)`")
  string(REPLACE "|" ";" _pair "${case_and_message}")
  list(GET _pair 0 _case)
  list(GET _pair 1 _message)
  partrain_compile_fail_test(ddp_compile_fail_${_case} ${CMAKE_CURRENT_LIST_DIR}/compile_fail/${_case}.cpp
                             "${_message}" parallel optim)
endforeach()
