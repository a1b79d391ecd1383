// tests/cpu_tier/tier.hpp: what the element-functor tests need from the place they run. g++
// builds them for the host tier (ctest label cpu_tier), where exec() is Thrust's sequential host
// system: the thrust::for_each_n and thrust::transform_reduce calls the GPU makes
// (core/detail/thrust_index.hpp), on host vectors; where Thrust's headers are missing, the plain
// host loop. nvcc builds the same test files into tests/cuda/test_cpu_tier_cuda.cu, where exec()
// is a CUDA stream and vec<T> managed memory (label gpu). The references the tests compare with
// are written in the tests, never the functors under test.
#pragma once

#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include <partrain/core/for_each_index.hpp>

#if defined(__CUDACC__)
#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

#include <partrain/cuda/launch.cuh>
#elif defined(PARTRAIN_THRUST_HOST)
#include <partrain/core/detail/thrust_index.hpp>
#endif

namespace tier {

#if defined(__CUDACC__)
inline constexpr const char* name = "cuda";
inline partrain::detail::cuda_exec exec() { return {cudaStreamLegacy, 0}; }
inline void finish() {
  const cudaError_t rc = cudaDeviceSynchronize();
  if (rc != cudaSuccess) throw std::runtime_error(std::string("cudaDeviceSynchronize: ") + cudaGetErrorString(rc));
}
// Managed memory: the test writes and reads it on the host, the kernels on the device.
template <class T>
class vec {
 public:
  explicit vec(std::size_t n, T fill = T{}) : n_(n) {
    if (cudaMallocManaged(reinterpret_cast<void**>(&p_), (n ? n : 1) * sizeof(T)) != cudaSuccess) {
      throw std::runtime_error("cudaMallocManaged failed");
    }
    for (std::size_t i = 0; i < n; ++i) p_[i] = fill;
  }
  vec(const vec&) = delete;
  vec& operator=(const vec&) = delete;
  ~vec() { cudaFree(p_); }
  T* data() { return p_; }
  const T* data() const { return p_; }
  std::size_t size() const { return n_; }
  T& operator[](std::size_t i) { return p_[i]; }
  const T& operator[](std::size_t i) const { return p_[i]; }

 private:
  T* p_ = nullptr;
  std::size_t n_;
};
// The device may fuse a multiply and an add (nvcc's default --fmad=true): a few ulps apart.
inline constexpr float float_rel = 4e-7f * 4;
#else
#if defined(PARTRAIN_THRUST_HOST)
inline constexpr const char* name = "thrust-host";
inline partrain::detail::thrust_host_exec exec() { return {}; }
#else
inline constexpr const char* name = "host";
inline partrain::detail::host_exec exec() { return {}; }
#endif
inline void finish() {}
template <class T>
class vec {
 public:
  explicit vec(std::size_t n, T fill = T{}) : v_(n, fill) {}
  T* data() { return v_.data(); }
  const T* data() const { return v_.data(); }
  std::size_t size() const { return v_.size(); }
  T& operator[](std::size_t i) { return v_[i]; }
  const T& operator[](std::size_t i) const { return v_[i]; }

 private:
  std::vector<T> v_;
};
// The host does the reference's operations in the reference's order: no rounding apart.
inline constexpr float float_rel = 0;
#endif

// Sizes that are not multiples of any block size or vector width, and 0.
inline const std::vector<std::size_t> ragged_sizes{0, 1, 3, 7, 255, 256, 257, 1023, 4099, 70001};

// got within rel of want, where rel counts against |want| plus `scale`: the size of the terms
// that made want. A fused multiply-add rounds once where the reference rounds twice, so when the
// terms nearly cancel (v - lr * d) the result differs by an ulp of the terms, not of the result
// (seen on an H200). On the host tier rel is 0 and this is equality.
template <class T>
bool close(T got, T want, T rel, T scale = 0) {
  if (std::isnan(want)) return std::isnan(got);
  if (std::isinf(want)) return got == want;
  return std::fabs(got - want) <= rel * (std::fabs(want) + std::fabs(scale)) + std::numeric_limits<T>::denorm_min();
}

// Values with every exponent, both signs, and the special ones mixed in.
inline std::vector<float> awkward_floats(std::size_t n, std::uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> u(-2.0f, 2.0f);
  const float specials[] = {0.0f, -0.0f, std::numeric_limits<float>::denorm_min(), -1e-40f, 6e-8f, -3e-5f,
                            65504.0f, 65520.0f, -70000.0f, 1e30f};
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = i % 17 == 5 ? specials[(i / 17) % 10] : u(gen);
  return v;
}

}  // namespace tier
