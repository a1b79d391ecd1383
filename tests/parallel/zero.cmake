# Sharded data parallel, ZeRO-1/2 (owned by the zero area; included from tests/parallel/CMakeLists.txt).
partrain_add_test(test_zero SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_zero.cpp LABELS "parallel;threads")
# zero_policy under fit() and the sharded checkpoints (train layer, threads backend); 16-bit
# parameters with their fp32 masters sharded (one translation unit: they share its headers).
partrain_add_test(test_zero_checkpoint SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_zero_checkpoint.cpp
                  LABELS "parallel;train;threads")
if(TARGET partrain::gloo)
  partrain_add_test(test_zero_gloo SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_zero_gloo.cpp LIBS partrain::gloo
                    LABELS "parallel;processes")
endif()

# Concept failures read as one sentence: each snippet must fail to compile with its message first.
foreach(case_and_message
    "zero_batch_not_trainable|has no `double train_step\\(const Batch&\\)` for this batch type"
    "zero_cuda_parameters|sharded_data_parallel with CUDA parameters must be compiled by nvcc")
  string(REPLACE "|" ";" _pair "${case_and_message}")
  list(GET _pair 0 _case)
  list(GET _pair 1 _message)
  partrain_compile_fail_test(zero_compile_fail_${_case} ${CMAKE_CURRENT_LIST_DIR}/compile_fail/${_case}.cpp
                             "${_message}" parallel)
endforeach()
