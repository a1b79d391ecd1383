// Catch2 main for every gpu-labelled test executable (tests/cuda/gpu_test.cmake): exits with 77
// (ctest SKIP_RETURN_CODE, reported as Skipped) and says why when this machine has no usable CUDA
// device or driver, so a test never passes with nothing checked. Test cases do not check for a
// GPU themselves: once main runs them, a CUDA failure is a failure.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <cuda_runtime.h>

#include <cstdio>

#include <partrain/launch/process.hpp>

// Whether CUDA was initialised before main's first CUDA call (test_cuda_raii.cu checks it was not:
// loading a program with device code must not count as initialising CUDA, or spawn refuses).
bool partrain_test_cuda_initialised_at_start = false;

int main(int argc, char** argv) {
  partrain_test_cuda_initialised_at_start = partrain::detail::launch::cuda_initialised();
  int devices = 0;
  cudaError_t rc = cudaGetDeviceCount(&devices);  // an old driver answers cudaErrorInsufficientDriver
  if (rc != cudaSuccess || devices == 0) {
    std::printf("skipped: no usable CUDA device (cudaGetDeviceCount: %s, %d devices)\n",
                rc == cudaSuccess ? "ok" : cudaGetErrorString(rc), devices);
    return 77;
  }
  // A device that is listed but cannot take a context (exclusive mode taken, MIG without an
  // instance, a driver/runtime mismatch) is not usable either: creating the context says so.
  rc = cudaSetDevice(0);
  if (rc == cudaSuccess) rc = cudaFree(nullptr);
  if (rc != cudaSuccess) {
    std::printf("skipped: CUDA device 0 is listed but unusable (%s: %s)\n", cudaGetErrorName(rc),
                cudaGetErrorString(rc));
    return 77;
  }
  return Catch::Session().run(argc, argv);
}
