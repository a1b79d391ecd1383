// partrain/parallel/detail/zero_space.hpp: where sharded data parallel keeps its own buffers (the
// shard's reduced gradient, fp32 masters, bucket slots, optimizer state) and how it moves elements
// among them and the model's tensors: in the parameters' memory space, through a `place`.
// place<host> is here; place<cuda> (device_buffers, the same functors as kernels, copies queued on
// the communicator's input stream) is parallel/detail/zero_kernels.cuh, nvcc only. The element
// loops are functors run through for_each_index, so the host path and the CPU tier run the code
// a GPU runs.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <string>
#include <vector>

#include <partrain/core/buffer.hpp>
#include <partrain/core/for_each_index.hpp>
#include <partrain/core/memory_space.hpp>
#include <partrain/core/tensor_view.hpp>

namespace partrain::inline v0::detail::zero {

template <class S>
struct place;

template <>
struct place<host> {
  template <class U>
  using buffer = std::vector<U>;

  // A rank's place (its parameters and communicator, for the CUDA twin's choice): the host's.
  template <class C, class ForEach>
  [[nodiscard]] static place make(C& /*comm*/, ForEach&& /*for_each_param*/, const std::string& /*where*/,
                                  const char* /*advice*/) noexcept {
    return {};
  }

  [[nodiscard]] host_exec exec() const noexcept { return {}; }
  // The stream the optimizer's element loops queue on (the CUDA twin's); none on the host.
  [[nodiscard]] void* stream() const noexcept { return nullptr; }
  [[nodiscard]] int device() const noexcept { return -1; }

  // n zeros (a buffer's old contents are dropped).
  template <class U>
  void allocate(std::vector<U>& b, std::size_t n) const {
    b.assign(n, U(0));
  }
  template <class U>
  void release(std::vector<U>& b) const {
    std::vector<U>().swap(b);
  }
  // Within the place.
  template <class U>
  void copy(U* dst, const U* src, std::size_t n) const {
    if (n) std::memcpy(dst, src, n * sizeof(U));
  }
  template <class U>
  void fill_zero(U* dst, std::size_t n) const {
    std::fill(dst, dst + n, U(0));
  }
  // Between the place and host memory, finished on return.
  template <class U>
  void to_host(U* dst, const U* src, std::size_t n) const {
    copy(dst, src, n);
  }
  template <class U>
  void from_host(U* dst, const U* src, std::size_t n) const {
    copy(dst, src, n);
  }
  // A shaped tensor for a model's own compute (fully sharded data parallel's activations), zeros
  // in stream order of `stream` (the model's).
  template <class U>
  using tensor = host_buffer<U>;
  template <class U>
  [[nodiscard]] host_buffer<U> make_tensor(const shape& s, void* /*stream*/) const {
    return host_buffer<U>(s);
  }
  // Orders the place's next work after what `stream` (the model's) has queued.
  void after(void* /*stream*/) const noexcept {}
  // Orders what `stream` (the model's) queues next after the place's work.
  void ahead_of(void* /*stream*/) const noexcept {}
  // Waits for everything queued on the place.
  void finish() const noexcept {}
};

}  // namespace partrain::inline v0::detail::zero
