# Mixed precision on the GPU against the host path. The kernels' part needs nothing more; the
# model's part compares with the example's host MLP, so it needs OpenBLAS (left out without it).
include(${PROJECT_SOURCE_DIR}/models/openblas.cmake)
if(PARTRAIN_EXAMPLE_HAVE_OPENBLAS)
  partrain_add_gpu_test(test_precision_cuda ${src} LIBS partrain_example_openblas)
  target_compile_definitions(test_precision_cuda PRIVATE PARTRAIN_TEST_WITH_MLP=1)
  target_include_directories(test_precision_cuda PRIVATE ${PROJECT_SOURCE_DIR}/models)
else()
  partrain_add_gpu_test(test_precision_cuda ${src})
endif()
