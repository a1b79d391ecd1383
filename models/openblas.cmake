# OpenBLAS for the example's host MLP (and bench_ddp): target partrain_example_openblas, or
# PARTRAIN_EXAMPLE_HAVE_OPENBLAS OFF with one line saying so. Debian's libopenblas-dev puts the
# OpenBLAS cblas.h (the one declaring openblas_set_num_threads) under openblas-pthread/.
if(NOT TARGET partrain_example_openblas)
  find_path(PARTRAIN_OPENBLAS_INCLUDE NAMES openblas_config.h
            PATH_SUFFIXES openblas-pthread openblas x86_64-linux-gnu/openblas-pthread aarch64-linux-gnu/openblas-pthread)
  find_library(PARTRAIN_OPENBLAS_LIBRARY NAMES openblas)
  if(PARTRAIN_OPENBLAS_INCLUDE AND PARTRAIN_OPENBLAS_LIBRARY)
    add_library(partrain_example_openblas INTERFACE)
    target_include_directories(partrain_example_openblas INTERFACE ${PARTRAIN_OPENBLAS_INCLUDE})
    target_link_libraries(partrain_example_openblas INTERFACE ${PARTRAIN_OPENBLAS_LIBRARY})
    set(PARTRAIN_EXAMPLE_HAVE_OPENBLAS ON)
  else()
    set(PARTRAIN_EXAMPLE_HAVE_OPENBLAS OFF)
    message(STATUS "partrain: OpenBLAS not found, the Fashion-MNIST example and bench_ddp are left out (install libopenblas-dev)")
  endif()
elseif(NOT DEFINED PARTRAIN_EXAMPLE_HAVE_OPENBLAS)
  set(PARTRAIN_EXAMPLE_HAVE_OPENBLAS ON)
endif()
