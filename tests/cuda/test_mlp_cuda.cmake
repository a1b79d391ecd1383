# test_mlp_cuda.cu is built by tests/examples/CMakeLists.txt (it needs the example's folder and
# OpenBLAS); this file keeps tests/cuda/CMakeLists.txt from adding it a second time.
