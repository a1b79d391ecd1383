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
#include <partrain/optim/optimizer.hpp>

#if PARTRAIN_HAS_CUDA
#include <partrain/cuda/device_buffer.hpp>
#include <partrain/cuda/device_guard.hpp>
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
  // stream (its inner optimizer's steps). Host: the views are the parameters themselves. Either
  // way the parameters must still be the ones seen at construction (`who` names the policy).
  void pull(const char* who) {
    std::size_t k = 0;
    for (auto&& p : model_->parameters()) {
      const auto v = p.value();
      if (k >= views_.size() || v.size() != views_[k].size() || (!mirrored && v.data() != views_[k].data())) {
        throw invalid_argument_error(std::string(who) + ": parameter #" + std::to_string(k) +
                                     " is not the one it was at construction (moved, resized or added; the model's "
                                     "parameters must not change while the policy holds them)");
      }
      if constexpr (mirrored) {
#if PARTRAIN_HAS_CUDA
        ddp::staged_copy(views_[k].data(), v.data(), v.size_bytes(), cudaMemcpyDeviceToHost, model_stream(*model_),
                         "cudaMemcpyAsync (parameters to the host mirror)");
#endif
      }
      ++k;
    }
    if (k != views_.size()) {
      throw invalid_argument_error(std::string(who) + ": the model now has " + std::to_string(k) +
                                   " parameters, it had " + std::to_string(views_.size()) + " at construction");
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

// Whether comm's collectives take memory of kind k; a communicator without accepts() is taken to
// reduce host memory only.
template <class C>
[[nodiscard]] bool takes_memory(const C& comm, device_kind k) {
  if constexpr (requires { comm.accepts(k); }) {
    return comm.accepts(k);
  } else {
    return k == device_kind::cpu;
  }
}
template <class C>
[[nodiscard]] bool takes_host_memory(const C& comm) {
  return takes_memory(comm, device_kind::cpu);
}

#if PARTRAIN_HAS_CUDA
// The CUDA device a communicator is bound to (nccl_group), else -1.
template <class C>
[[nodiscard]] int comm_cuda_device(const C& comm) {
  if constexpr (requires { { comm.cuda_device_index() } -> std::convertible_to<int>; }) {
    return comm.cuda_device_index();
  } else {
    return -1;
  }
}

// Where a device-only backend's staging copies go: `device` when the caller knows it (>= 0),
// else the backend's, else the current one; never device 0 by omission (on rank N that is
// another GPU than the backend's).
template <class C>
[[nodiscard]] int staging_device(const C& comm, int device) {
  if (device >= 0) return device;
  if (const int d = comm_cuda_device(comm); d >= 0) return d;
  return cuda_current_device();
}

// The one CUDA device a rank's parameters are on, asked of their memory (the model concepts
// expose no device, and the memory is what every model has): every non-empty value must be on
// it, and on the communicator's device if that is bound to one. for_each_param(fn) calls fn(p)
// for each parameter in order. -1 when none is in CUDA memory. Errors start with `where`.
template <class C, class ForEach>
[[nodiscard]] int parameters_cuda_device(const C& comm, ForEach&& for_each_param, const std::string& where) {
  int dev = -1;
  std::size_t index = 0;
  std::string first;
  for_each_param([&](auto&& p) {
    const auto v = p.value();
    if (!v.empty()) {
      const int d = cuda_device_of(v.data(), "parameter placement").index;
      if (dev < 0) {
        dev = d;
        first = param_name(p, index);
      } else if (d != dev) {
        throw config_error(where + "parameter " + param_name(p, index) + " is on cuda:" + std::to_string(d) + " but " +
                           first + " on cuda:" + std::to_string(dev) + " (expected every parameter of a rank on one device)");
      }
    }
    ++index;
  });
  const int comm_dev = comm_cuda_device(comm);
  if (dev >= 0 && comm_dev >= 0 && dev != comm_dev) {
    throw config_error(where + "the parameters are on cuda:" + std::to_string(dev) + " but the communicator runs on cuda:" +
                       std::to_string(comm_dev) + " (expected the same device: make the group with the model's device)");
  }
  return dev;
}
#endif
template <class C>
[[noreturn]] void no_memory_for(const C& comm) {
  throw config_error("rank " + std::to_string(comm.rank()) +
                     ": the backend takes neither host nor (in this build) CUDA memory");
}

// op(view) issues one collective on `data` and returns its work; wait(work) waits for it (and
// names its errors). On a backend that takes only CUDA memory the collective runs on a device
// copy (on `device`, see staging_device), and both copies are finished on return.
template <class C, class E, class Op, class Wait>
void host_collective(C& comm, std::span<E> data, Op&& op, Wait&& wait, int device = -1) {
  if (data.empty()) return;
  if (takes_host_memory(comm)) {
    wait(op(tensor_view<E>(data.data(), data.size())));
    return;
  }
#if PARTRAIN_HAS_CUDA
  device_buffer<E> dev(data.size(), staging_device(comm, device));
  dev.copy_from(tensor_view<const E>(data.data(), data.size()));
  wait(op(dev.view()));
  dev.copy_to(tensor_view<E>(data.data(), data.size()));
#else
  (void)op;
  (void)wait;
  (void)device;
  no_memory_for(comm);
#endif
}

// The same for a collective with an input and an output (all_gather): op(in_view, out_view).
template <class C, class E, class F, class Op, class Wait>
void host_collective(C& comm, std::span<const E> in, std::span<F> out, Op&& op, Wait&& wait, int device = -1) {
  if (takes_host_memory(comm)) {
    wait(op(tensor_view<const E>(in.data(), in.size()), tensor_view<F>(out.data(), out.size())));
    return;
  }
#if PARTRAIN_HAS_CUDA
  device_buffer<E> din(in.size(), staging_device(comm, device));
  device_buffer<F> dout(out.size(), staging_device(comm, device));
  din.copy_from(tensor_view<const E>(in.data(), in.size()));
  wait(op(tensor_view<const E, cuda>(din.view()), dout.view()));
  dout.copy_to(tensor_view<F>(out.data(), out.size()));
#else
  (void)op;
  (void)wait;
  (void)device;
  no_memory_for(comm);
#endif
}

}  // namespace partrain::inline v0::detail
