// partrain/cuda/check.hpp: CUDA runtime errors as partrain errors. PARTRAIN_CUDA_CHECK(call)
// throws cuda_error naming the call, the file and line, and CUDA's own name and text of the code.
#pragma once

#include <partrain/config.hpp>

#if !PARTRAIN_HAS_CUDA
#error "partrain/cuda/check.hpp needs the CUDA runtime: link partrain::cuda (or compile with nvcc)"
#endif

#include <cuda_runtime.h>

#include <string>
#include <string_view>

#include <partrain/core/error.hpp>

namespace partrain::inline v0 {

// A CUDA runtime call failed. kind() is internal; code() is the runtime's error.
class cuda_error : public error {
 public:
  cuda_error(cudaError_t code, const std::string& what) : error(error_kind::internal, what), code_(code) {}
  [[nodiscard]] cudaError_t code() const noexcept { return code_; }

 private:
  cudaError_t code_;
};

namespace detail {

[[nodiscard]] inline std::string cuda_failure_message(cudaError_t rc, std::string_view call, std::string_view file,
                                                      int line) {
  return "CUDA call '" + std::string(call) + "' failed at " + std::string(file) + ":" + std::to_string(line) + ": " +
         cudaGetErrorName(rc) + " (" + cudaGetErrorString(rc) + ")";
}

inline void cuda_check(cudaError_t rc, const char* call, const char* file, int line) {
  if (rc != cudaSuccess) {
    // Clear the sticky "last error" of a non-fatal failure so later calls report their own.
    (void)cudaGetLastError();
    throw cuda_error(rc, cuda_failure_message(rc, call, file, line));
  }
}

}  // namespace detail

}  // namespace partrain::inline v0

// Throws partrain::cuda_error when the CUDA runtime call does not return cudaSuccess.
#define PARTRAIN_CUDA_CHECK(call) ::partrain::detail::cuda_check((call), #call, __FILE__, __LINE__)
