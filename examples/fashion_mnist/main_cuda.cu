// examples/fashion_mnist/main_cuda.cu: the same program compiled by nvcc, so that `--device cuda`
// can train the CUDA MLP (mlp_cuda.cuh); the host path is unchanged.
#include "main.cpp"
