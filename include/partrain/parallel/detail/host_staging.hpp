// partrain/parallel/detail/host_staging.hpp: what the policies that keep their state on the host
// (post-local SGD's averages, DiLoCo's outer step, DDP's small agreements) need to serve CUDA
// models and device-only backends too:
//   host_values<M>    the parameters as host memory: host parameters are viewed where they are;
//                     CUDA parameters are copied into a host mirror (pull) and back (push) on the
//                     model's stream, once per average or outer step, so the copies cost little
//                     beside the steps in between;
//   host_collective   one collective on host memory over any communicator: directly where the
//                     backend takes host memory, else (NCCL) through a device copy, synchronously.
#pragma once

#include <concepts>
#include <cstddef>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <partrain/config.hpp>
#include <partrain/core/device.hpp>
#include <partrain/core/error.hpp>
#include <partrain/core/memory_space.hpp>
#include <partrain/core/tensor_view.hpp>
#include <partrain/model/concepts.hpp>
#include <partrain/model/traits.hpp>

#if PARTRAIN_HAS_CUDA
#include <partrain/cuda/device_buffer.hpp>
#include <partrain/parallel/detail/ddp_staging.hpp>
#endif

namespace partrain::inline v0::detail {

template <model M>
class host_values {
  using P = param_t<M>;
  using T = param_element_t<P>;
  using S = param_space_t<P>;

 public:
  static constexpr bool mirrored = !std::same_as<S, host>;

  explicit host_values(M& m) : model_(&m) {
    if constexpr (mirrored) {
      static_assert(std::same_as<S, cuda>, "partrain: parameters must be in host or CUDA memory");
#if !PARTRAIN_HAS_CUDA
      static_assert(!mirrored, "partrain: CUDA parameters need the CUDA runtime: link partrain::cuda (or use nvcc)");
#endif
      std::size_t total = 0;
      for (auto&& p : m.parameters()) total += p.value().size();
      mirror_.resize(total);
      std::size_t at = 0;
      for (auto&& p : m.parameters()) {
        views_.emplace_back(mirror_.data() + at, p.value().shape());
        at += p.value().size();
      }
    } else {
      for (auto&& p : m.parameters()) views_.push_back(p.value());
    }
  }
  host_values(const host_values&) = delete;
  host_values& operator=(const host_values&) = delete;

  // Host views of every parameter, in the model's order: its own (host) or the mirror's (CUDA).
  [[nodiscard]] std::span<const tensor_view<T>> views() const noexcept { return views_; }
  [[nodiscard]] std::size_t size() const noexcept { return views_.size(); }

  // CUDA: the parameters' current values into the mirror, after the work queued on the model's
  // stream (its inner optimizer's steps). Host: nothing to do.
  void pull() {
    if constexpr (mirrored) {
#if PARTRAIN_HAS_CUDA
      std::size_t k = 0;
      for (auto&& p : model_->parameters()) {
        const auto v = p.value();
        ddp::staged_copy(views_[k].data(), v.data(), v.size_bytes(), cudaMemcpyDeviceToHost, model_stream(*model_),
                         "cudaMemcpyAsync (parameters to the host mirror)");
        ++k;
      }
#endif
    }
  }
  // CUDA: the mirror back into the parameters, ordered on the model's stream. Host: nothing.
  void push() {
    if constexpr (mirrored) {
#if PARTRAIN_HAS_CUDA
      std::size_t k = 0;
      for (auto&& p : model_->parameters()) {
        auto v = p.value();
        ddp::staged_copy(v.data(), views_[k].data(), v.size_bytes(), cudaMemcpyHostToDevice, model_stream(*model_),
                         "cudaMemcpyAsync (host mirror to the parameters)");
        ++k;
      }
#endif
    }
  }

 private:
  M* model_;
  std::vector<T> mirror_;  // CUDA parameters only
  std::vector<tensor_view<T>> views_;
};

// Whether comm's collectives take host memory (a communicator without accepts() is assumed to).
template <class C>
[[nodiscard]] bool takes_host_memory(const C& comm) {
  if constexpr (requires { comm.accepts(device_kind::cpu); }) {
    return comm.accepts(device_kind::cpu);
  } else {
    return true;
  }
}

// op(view) issues one collective on `data` and returns its work; wait(work) waits for it (and
// names its errors). On a backend that takes only CUDA memory the collective runs on a device
// copy on the backend's device, and both copies are finished on return.
template <class C, class E, class Op, class Wait>
void host_collective(C& comm, std::span<E> data, Op&& op, Wait&& wait) {
  if (data.empty()) return;
  if (takes_host_memory(comm)) {
    wait(op(tensor_view<E>(data.data(), data.size())));
    return;
  }
#if PARTRAIN_HAS_CUDA
  int device = -1;
  if constexpr (requires { comm.cuda_device_index(); }) device = comm.cuda_device_index();
  device_buffer<E> dev(data.size(), device >= 0 ? device : 0);
  dev.copy_from(tensor_view<const E>(data.data(), data.size()));
  wait(op(dev.view()));
  dev.copy_to(tensor_view<E>(data.data(), data.size()));
#else
  (void)op;
  (void)wait;
  throw config_error("rank " + std::to_string(comm.rank()) +
                     ": the backend takes neither host nor (in this build) CUDA memory");
#endif
}

}  // namespace partrain::inline v0::detail
