// partrain/parallel/detail/ddp_kernels.cuh: the element work of DDP's device buckets (used when the
// parameters are in CUDA memory and the backend reduces CUDA memory, i.e. NCCL): division
// before the all_reduce, accumulation for no_sync, and the 16-bit casts of the compression
// hooks. Every function takes the stream to queue on: DDP passes the communicator's input stream
// (nccl_group::set_input_stream), which the group orders its collectives after, so the bucket
// work is ordered after the gradients the model made there and before the all_reduce. The
// caller makes the bucket's device current. nvcc only.
#pragma once

#if !defined(__CUDACC__)
#error "partrain/parallel/detail/ddp_kernels.cuh must be compiled by nvcc"
#endif

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <memory>
#include <string>

#include <partrain/comm/process_group.hpp>
#include <partrain/core/dtype.hpp>
#include <partrain/core/error.hpp>
#include <partrain/core/tensor_view.hpp>
#include <partrain/cuda/check.hpp>
#include <partrain/cuda/device_guard.hpp>

namespace partrain::inline v0::detail {

inline constexpr unsigned ddp_block = 256;

[[nodiscard]] inline unsigned ddp_blocks(std::size_t n) {
  const std::size_t b = (n + ddp_block - 1) / ddp_block;
  return static_cast<unsigned>(b == 0 ? 1 : (b < 4096 ? b : 4096));
}

#define PARTRAIN_DDP_GRID_LOOP(i, n)                                                                      \
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < (n); \
       i += static_cast<std::size_t>(blockDim.x) * gridDim.x)

template <class T>
__global__ void ddp_divide_kernel(T* x, std::size_t n, T d) {
  PARTRAIN_DDP_GRID_LOOP(i, n) x[i] = x[i] / d;
}
template <class T>
__global__ void ddp_add_kernel(T* dst, const T* src, std::size_t n) {
  PARTRAIN_DDP_GRID_LOOP(i, n) dst[i] = dst[i] + src[i];
}
// buffer.to(fp16).div_(world_size), as the host hook does.
template <class T>
__global__ void ddp_to_half_kernel(const T* x, __half* h, std::size_t n, float d) {
  PARTRAIN_DDP_GRID_LOOP(i, n) h[i] = __float2half_rn(__half2float(__float2half_rn(static_cast<float>(x[i]))) / d);
}
template <class T>
__global__ void ddp_from_half_kernel(const __half* h, T* x, std::size_t n) {
  PARTRAIN_DDP_GRID_LOOP(i, n) x[i] = static_cast<T>(__half2float(h[i]));
}
template <class T>
__global__ void ddp_to_bf16_kernel(const T* x, __nv_bfloat16* h, std::size_t n, float d) {
  PARTRAIN_DDP_GRID_LOOP(i, n) {
    h[i] = __float2bfloat16_rn(__bfloat162float(__float2bfloat16_rn(static_cast<float>(x[i]))) / d);
  }
}
template <class T>
__global__ void ddp_from_bf16_kernel(const __nv_bfloat16* h, T* x, std::size_t n) {
  PARTRAIN_DDP_GRID_LOOP(i, n) x[i] = static_cast<T>(__bfloat162float(h[i]));
}

#undef PARTRAIN_DDP_GRID_LOOP

inline void ddp_launch_check(const char* what) { cuda_check(cudaGetLastError(), what, __FILE__, __LINE__); }

template <class F>
void visit_device_float(raw_tensor t, const char* who, F&& f) {
  switch (t.type) {
    case dtype::float32: f(static_cast<float*>(t.data)); return;
    case dtype::float64: f(static_cast<double*>(t.data)); return;
    default:
      throw invalid_argument_error(std::string(who) + ": bucket holds " + std::string(to_string(t.type)) +
                                   ", expected float32 or float64");
  }
}

inline void device_divide(raw_tensor t, double d, cudaStream_t stream) {
  if (t.count == 0) return;
  visit_device_float(t, "device_divide", [&](auto* p) {
    using T = std::remove_pointer_t<decltype(p)>;
    ddp_divide_kernel<T><<<ddp_blocks(t.count), ddp_block, 0, stream>>>(p, t.count, static_cast<T>(d));
    ddp_launch_check("ddp_divide_kernel launch");
  });
}

// dst (device bucket) = g, or += g.
template <class T>
void device_stage_in(T* dst, tensor_view<const T, cuda> g, bool add, cudaStream_t stream) {
  if (g.empty()) return;
  if (add) {
    ddp_add_kernel<T><<<ddp_blocks(g.size()), ddp_block, 0, stream>>>(dst, g.data(), g.size());
    ddp_launch_check("ddp_add_kernel launch");
  } else {
    cuda_check(cudaMemcpyAsync(dst, g.data(), g.size_bytes(), cudaMemcpyDeviceToDevice, stream),
               "cudaMemcpyAsync (gradient to bucket)", __FILE__, __LINE__);
  }
}
template <class T>
void device_stage_out(tensor_view<T, cuda> g, const T* src, cudaStream_t stream) {
  if (g.empty()) return;
  cuda_check(cudaMemcpyAsync(g.data(), src, g.size_bytes(), cudaMemcpyDeviceToDevice, stream),
             "cudaMemcpyAsync (bucket to gradient)", __FILE__, __LINE__);
}

// Device memory on device `device_index`, owned through a shared_ptr (what a hook keeps in
// grad_bucket::hook_state()).
[[nodiscard]] inline std::shared_ptr<void> device_alloc(std::size_t bytes, int device_index) {
  cuda_device_guard guard(device_index);
  void* p = nullptr;
  cuda_check(cudaMalloc(&p, bytes ? bytes : 1), "cudaMalloc (hook scratch)", __FILE__, __LINE__);
  return std::shared_ptr<void>(p, [](void* q) { cudaFree(q); });
}

// src (float/double bucket) -> dst 16-bit (divided by d), and back.
inline void device_to_16(raw_tensor src, void* dst, dtype h, float d, cudaStream_t stream) {
  visit_device_float(src, "fp16/bf16 hook", [&](auto* p) {
    using T = std::remove_pointer_t<decltype(p)>;
    if (h == dtype::float16) {
      ddp_to_half_kernel<T><<<ddp_blocks(src.count), ddp_block, 0, stream>>>(p, static_cast<__half*>(dst), src.count, d);
    } else {
      ddp_to_bf16_kernel<T><<<ddp_blocks(src.count), ddp_block, 0, stream>>>(p, static_cast<__nv_bfloat16*>(dst),
                                                                              src.count, d);
    }
    ddp_launch_check("16-bit cast kernel launch");
  });
}
inline void device_from_16(const void* src, raw_tensor dst, dtype h, cudaStream_t stream) {
  visit_device_float(dst, "fp16/bf16 hook", [&](auto* p) {
    using T = std::remove_pointer_t<decltype(p)>;
    if (h == dtype::float16) {
      ddp_from_half_kernel<T><<<ddp_blocks(dst.count), ddp_block, 0, stream>>>(static_cast<const __half*>(src), p,
                                                                              dst.count);
    } else {
      ddp_from_bf16_kernel<T><<<ddp_blocks(dst.count), ddp_block, 0, stream>>>(static_cast<const __nv_bfloat16*>(src), p,
                                                                              dst.count);
    }
    ddp_launch_check("16-bit cast kernel launch");
  });
}

}  // namespace partrain::inline v0::detail
