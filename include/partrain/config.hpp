// partrain/config.hpp: the one place that decides compiler-dependent macros.
#pragma once

#define PARTRAIN_VERSION_MAJOR 0
#define PARTRAIN_VERSION_MINOR 1
#define PARTRAIN_VERSION_PATCH 0

// Host/device annotations: real only when nvcc (or clang-cuda) compiles the file.
#if defined(__CUDACC__)
#define PARTRAIN_HOST_DEVICE __host__ __device__
#define PARTRAIN_DEVICE __device__
#else
#define PARTRAIN_HOST_DEVICE
#define PARTRAIN_DEVICE
#endif

// A function object called from device code must be __device__ constexpr under nvcc 13;
// a plain inline constexpr is "undefined in device code".
#if defined(__CUDA_ARCH__)
#define PARTRAIN_GLOBAL_CONSTANT __device__ constexpr
#else
#define PARTRAIN_GLOBAL_CONSTANT inline constexpr
#endif

// CUDA runtime available to host code (set by the partrain::cuda CMake target or by nvcc).
#if defined(PARTRAIN_WITH_CUDA) || defined(__CUDACC__)
#define PARTRAIN_HAS_CUDA 1
#else
#define PARTRAIN_HAS_CUDA 0
#endif
