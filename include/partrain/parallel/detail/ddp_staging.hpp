// partrain/parallel/detail/ddp_staging.hpp: DDP with parameters in CUDA memory over a host backend (local,
// gloo): gradients are copied into the host bucket as they become final and copied back after
// the reduction; parameter broadcasts go through a host copy too. Needs the CUDA runtime.
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

namespace partrain::inline v0::detail {

// dst (host) = g, or dst += g when `add`; tmp is reused scratch.
template <class T>
void stage_in(T* dst, tensor_view<const T, cuda> g, bool add, std::vector<T>& tmp) {
  if (g.empty()) return;
  if (!add) {
    cuda_check(cudaMemcpy(dst, g.data(), g.size_bytes(), cudaMemcpyDeviceToHost), "cudaMemcpy (DDP gradient to host)",
               __FILE__, __LINE__);
    return;
  }
  tmp.resize(g.size());
  cuda_check(cudaMemcpy(tmp.data(), g.data(), g.size_bytes(), cudaMemcpyDeviceToHost),
             "cudaMemcpy (DDP gradient to host)", __FILE__, __LINE__);
  for_each_index(host_exec{}, g.size(), accumulate_fn<T>{dst, tmp.data()});
}

// g = src (host).
template <class T>
void stage_out(tensor_view<T, cuda> g, const T* src) {
  if (g.empty()) return;
  cuda_check(cudaMemcpy(g.data(), src, g.size_bytes(), cudaMemcpyHostToDevice), "cudaMemcpy (DDP gradient to device)",
             __FILE__, __LINE__);
}

}  // namespace partrain::inline v0::detail
