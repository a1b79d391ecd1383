# The CPU tier's test files on CUDA (label gpu): they include the example's mlp_elements.hpp.
partrain_add_gpu_test(test_cpu_tier_cuda ${src} LABELS gpu cpu_tier_cuda)
target_include_directories(test_cpu_tier_cuda PRIVATE ${PROJECT_SOURCE_DIR}/models)
