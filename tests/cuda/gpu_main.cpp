// Catch2 main for the GPU tests: exits with 77 (ctest SKIP_RETURN_CODE) and says why when this
// machine has no CUDA device, so ctest reports "Skipped", never a false pass or a failure.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <cuda_runtime.h>

#include <cstdio>

int main(int argc, char** argv) {
  int devices = 0;
  const cudaError_t rc = cudaGetDeviceCount(&devices);
  if (rc != cudaSuccess || devices == 0) {
    std::printf("skipped: no CUDA device (cudaGetDeviceCount: %s, %d devices)\n",
                rc == cudaSuccess ? "ok" : cudaGetErrorString(rc), devices);
    return 77;
  }
  return Catch::Session().run(argc, argv);
}
