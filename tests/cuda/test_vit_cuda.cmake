# The CUDA ViT against the host ViT: the host side needs OpenBLAS (left out without it).
include(${PROJECT_SOURCE_DIR}/models/openblas.cmake)
if(PARTRAIN_EXAMPLE_HAVE_OPENBLAS)
  partrain_add_gpu_test(test_vit_cuda ${src} LIBS partrain_example_openblas)
  target_include_directories(test_vit_cuda PRIVATE ${PROJECT_SOURCE_DIR}/models)
endif()
