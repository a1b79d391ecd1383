// partrain/parallel/detail/ddp_kernels.cuh: the element work of DDP's device buckets (used when the
// parameters are in CUDA memory and the backend reduces CUDA memory, i.e. NCCL): division
// before the all_reduce, accumulation for no_sync, and the 16-bit casts of the compression
// hooks; the functors of parallel/detail/ddp_elements.hpp (the host buckets and the CPU tier run
// the same code) launched through partrain/cuda/launch.cuh. Every function takes the stream to
// queue on: DDP passes the communicator's input stream (nccl_group::set_input_stream), which the
// group orders its collectives after, so the bucket work is ordered after the gradients the model
// made there and before the all_reduce. The caller makes the bucket's device current. nvcc only.
#pragma once

#if !defined(__CUDACC__)
#error "partrain/parallel/detail/ddp_kernels.cuh must be compiled by nvcc"
#endif

#include <cuda_runtime.h>

#include <concepts>
#include <cstddef>
#include <string>
#include <type_traits>

#include <partrain/comm/process_group.hpp>
#include <partrain/core/dtype.hpp>
#include <partrain/core/error.hpp>
#include <partrain/core/half.hpp>
#include <partrain/core/tensor_view.hpp>
#include <partrain/cuda/check.hpp>
#include <partrain/cuda/device_guard.hpp>
#include <partrain/cuda/launch.cuh>
#include <partrain/parallel/detail/ddp_elements.hpp>

namespace partrain::inline v0::detail::ddp {

template <class F>
void visit_device_float(raw_tensor t, const char* who, F&& f) {
  visit_dtype(t.type, [&]<class T>(std::type_identity<T>) {
    if constexpr (std::same_as<T, float> || std::same_as<T, double>) {
      f(static_cast<T*>(t.data));
    } else {
      throw invalid_argument_error(std::string(who) + ": bucket holds " + std::string(to_string(t.type)) +
                                   ", expected float32 or float64");
    }
  });
}

inline void device_divide(raw_tensor t, double d, cudaStream_t stream) {
  if (t.count == 0) return;
  visit_device_float(t, "device_divide", [&](auto* p) {
    using T = std::remove_pointer_t<decltype(p)>;
    divide_elements(cuda_exec{stream, -1}, t.count, p, static_cast<T>(d));
  });
}

// dst (device bucket) = g, or += g.
template <class T>
void device_stage_in(T* dst, tensor_view<const T, cuda> g, bool add, cudaStream_t stream) {
  if (g.empty()) return;
  if (add) {
    for_each_index(cuda_exec{stream, -1}, g.size(), accumulate_fn<T>{dst, g.data()});
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

// src (float/double bucket) -> dst 16-bit (divided by d), and back.
inline void device_to_16(raw_tensor src, void* dst, dtype h, float d, cudaStream_t stream) {
  visit_device_float(src, "fp16/bf16 hook", [&](auto* p) {
    using T = std::remove_pointer_t<decltype(p)>;
    const cuda_exec exec{stream, -1};
    if (h == dtype::float16) {
      for_each_index(exec, src.count, compress_16_fn<T, half>{p, static_cast<half*>(dst), d});
    } else {
      for_each_index(exec, src.count, compress_16_fn<T, bfloat16>{p, static_cast<bfloat16*>(dst), d});
    }
  });
}
inline void device_from_16(const void* src, raw_tensor dst, dtype h, cudaStream_t stream) {
  visit_device_float(dst, "fp16/bf16 hook", [&](auto* p) {
    using T = std::remove_pointer_t<decltype(p)>;
    const cuda_exec exec{stream, -1};
    if (h == dtype::float16) {
      for_each_index(exec, dst.count, decompress_16_fn<half, T>{static_cast<const half*>(src), p});
    } else {
      for_each_index(exec, dst.count, decompress_16_fn<bfloat16, T>{static_cast<const bfloat16*>(src), p});
    }
  });
}

}  // namespace partrain::inline v0::detail::ddp
