// partrain/parallel/detail/ddp_staging.hpp: DDP with parameters in CUDA memory over a host backend (local,
// gloo): gradients are copied into the host bucket as they become final and copied back after
// the reduction, on the model's stream; parameter broadcasts go through a host copy too. Needs the
// CUDA runtime.
#pragma once

#include <partrain/config.hpp>

#if !PARTRAIN_HAS_CUDA
#error "partrain/parallel/detail/ddp_staging.hpp needs the CUDA runtime: link partrain::cuda (or compile with nvcc)"
#endif

#include <cuda_runtime.h>

#include <cstddef>
#include <vector>

#include <partrain/core/memory_space.hpp>
#include <partrain/core/tensor_view.hpp>
#include <partrain/core/for_each_index.hpp>
#include <partrain/cuda/check.hpp>
#include <partrain/parallel/detail/ddp_elements.hpp>

namespace partrain::inline v0::detail::ddp {

// The copies are queued on `stream`, the model's (model_stream; null: the legacy default stream),
// so they are ordered after the kernels that made the gradients, then that stream is synchronised:
// the host bucket is read (or the gradient used) only after the copy finished.
inline void staged_copy(void* dst, const void* src, std::size_t bytes, cudaMemcpyKind kind, void* stream,
                        const char* what) {
  const cudaStream_t s = stream ? static_cast<cudaStream_t>(stream) : cudaStreamLegacy;
  cuda_check(cudaMemcpyAsync(dst, src, bytes, kind, s), what, __FILE__, __LINE__);
  cuda_check(cudaStreamSynchronize(s), what, __FILE__, __LINE__);
}

// dst (host) = g, or dst += g when `add`; tmp is reused scratch.
template <class T>
void stage_in(T* dst, tensor_view<const T, cuda> g, bool add, std::vector<T>& tmp, void* stream) {
  if (g.empty()) return;
  if (!add) {
    staged_copy(dst, g.data(), g.size_bytes(), cudaMemcpyDeviceToHost, stream, "cudaMemcpyAsync (DDP gradient to host)");
    return;
  }
  tmp.resize(g.size());
  staged_copy(tmp.data(), g.data(), g.size_bytes(), cudaMemcpyDeviceToHost, stream, "cudaMemcpyAsync (DDP gradient to host)");
  for_each_index(host_exec{}, g.size(), accumulate_fn<T>{dst, tmp.data()});
}

// g = src (host).
template <class T>
void stage_out(tensor_view<T, cuda> g, const T* src, void* stream) {
  if (g.empty()) return;
  staged_copy(g.data(), src, g.size_bytes(), cudaMemcpyHostToDevice, stream, "cudaMemcpyAsync (DDP gradient to device)");
}

}  // namespace partrain::inline v0::detail::ddp
