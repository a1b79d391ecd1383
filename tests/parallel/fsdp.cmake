# Fully sharded data parallel, ZeRO-3 (owned by the fsdp area; included from tests/parallel/CMakeLists.txt).
partrain_add_test(test_fsdp SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_fsdp.cpp LABELS "parallel;threads")
if(TARGET partrain::gloo)
  partrain_add_test(test_fsdp_gloo SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_fsdp_gloo.cpp LIBS partrain::gloo
                    LABELS "parallel;processes")
endif()
if(PARTRAIN_HAVE_CUDA)
  # CUDA layers (models/mlp_layers_device.hpp): compiled wherever nvcc is; runs (label gpu) where a
  # GPU is, and skips itself elsewhere. With NCCL it adds the world-size-1 runs.
  set(_fsdp_cuda_libs partrain::cuda)
  if(TARGET partrain::nccl)
    set(_fsdp_cuda_libs partrain::nccl)
  endif()
  include(${PROJECT_SOURCE_DIR}/tests/cuda/gpu_test.cmake)
  partrain_add_gpu_test(test_fsdp_cuda SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_fsdp_cuda.cu LIBS ${_fsdp_cuda_libs}
                        LABELS parallel gpu)
endif()
# The layered MLP FSDP shards is the example's (a user model).
foreach(t test_fsdp test_fsdp_gloo test_fsdp_cuda)
  if(TARGET ${t})
    target_include_directories(${t} PRIVATE ${PROJECT_SOURCE_DIR}/models)
  endif()
endforeach()

# Concept failures read as one sentence: each snippet must fail to compile with its message first.
foreach(case_and_message
    "fsdp_cuda_layers|fully_sharded_data_parallel with CUDA layers must be compiled by nvcc")
  string(REPLACE "|" ";" _pair "${case_and_message}")
  list(GET _pair 0 _case)
  list(GET _pair 1 _message)
  partrain_compile_fail_test(fsdp_compile_fail_${_case} ${CMAKE_CURRENT_LIST_DIR}/compile_fail/${_case}.cpp
                             "${_message}" parallel)
endforeach()
