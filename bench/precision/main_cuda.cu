// The same benchmark compiled by nvcc: adds the CUDA rows (mlp_cuda on GPU 0).
#include "main.cpp"
