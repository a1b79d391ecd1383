// The CPU tier's tests (tests/cpu_tier), compiled by nvcc: tier.hpp then runs every element
// functor through partrain/cuda/launch.cuh on device 0 over managed memory, against the same
// scalar references. Where a GPU is, this proves the device runs what the CPU tier checked.
#include "../cpu_tier/test_launch_cpu_tier.cpp"
#include "../cpu_tier/test_optim_cpu_tier.cpp"
#include "../cpu_tier/test_precision_cpu_tier.cpp"
#include "../cpu_tier/test_ddp_cpu_tier.cpp"
#include "../cpu_tier/test_mlp_cpu_tier.cpp"
