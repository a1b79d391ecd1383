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

// The compiled mode (CMake option PARTRAIN_COMPILED, which defines PARTRAIN_COMPILED=1 for every
// user of partrain::partrain and links the partrain_compiled library): a few large non-template
// entry points (init_process_group, the thread and process starters behind run_local and spawn)
// are only declared in the headers and compiled once, in that library, instead of in each of the
// user's translation units (fmt's and spdlog's choice). Header-only otherwise.
//   PARTRAIN_DEFINITIONS  1 where those functions' bodies are compiled: header-only, or the library
//   PARTRAIN_LINKAGE      their linkage: inline header-only, external in the compiled mode
#ifndef PARTRAIN_COMPILED
#define PARTRAIN_COMPILED 0
#endif
#if PARTRAIN_COMPILED && !defined(PARTRAIN_COMPILED_SOURCE)
#define PARTRAIN_DEFINITIONS 0
#else
#define PARTRAIN_DEFINITIONS 1
#endif
#if PARTRAIN_COMPILED
#define PARTRAIN_LINKAGE
#else
#define PARTRAIN_LINKAGE inline
#endif
