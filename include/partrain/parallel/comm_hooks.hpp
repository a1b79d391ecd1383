// partrain/parallel/comm_hooks.hpp: how DDP reduces one gradient bucket (PyTorch's DDP
// communication hooks). A hook gets the bucket, divides and communicates, and returns a work
// that completes once the bucket holds the averaged gradient. Like PyTorch's built-in hooks,
// ours divide BEFORE the all_reduce (keeps fp16 sums in range).
#pragma once

#include <concepts>
#include <cstddef>
#include <cstring>
#include <exception>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <partrain/comm/detail/host_reduce.hpp>
#include <partrain/comm/process_group.hpp>
#include <partrain/core/dtype.hpp>
#include <partrain/core/error.hpp>
#include <partrain/core/for_each_index.hpp>
#include <partrain/core/half.hpp>
#include <partrain/core/memory_space.hpp>
#include <partrain/core/tensor_view.hpp>
#include <partrain/core/work.hpp>
#include <partrain/parallel/detail/ddp_elements.hpp>

#if defined(__CUDACC__)
#include <partrain/cuda/device_buffer.hpp>
#include <partrain/cuda/device_guard.hpp>
#include <partrain/parallel/detail/ddp_kernels.cuh>
#endif

namespace partrain::inline v0 {

// One bucket as a hook sees it: a flat buffer of gradients (host memory, or CUDA memory when a
// CUDA model meets a backend that reduces CUDA memory), the number to divide by, and the
// all_reduce of the DDP's communicator. It lives as long as the DDP, so a hook's completion
// callbacks may refer to it.
class grad_bucket {
 public:
  using all_reduce_fn = std::function<work(raw_tensor)>;
  // The communicator's all_reduce_divided (process_group's), where it has one.
  using all_reduce_divided_fn = std::function<work(raw_tensor, double)>;

  grad_bucket(std::size_t index, raw_tensor buffer, all_reduce_fn all_reduce, int world_size,
              all_reduce_divided_fn all_reduce_divided = {})
      : index_(index), buffer_(buffer), all_reduce_(std::move(all_reduce)),
        all_reduce_divided_(std::move(all_reduce_divided)), world_size_(world_size) {}

  [[nodiscard]] std::size_t index() const noexcept { return index_; }
  [[nodiscard]] raw_tensor buffer() const noexcept { return buffer_; }
  [[nodiscard]] bool on_cuda() const noexcept { return buffer_.on_cuda; }
  // A CUDA bucket's device, and the stream its device work must be queued on (a cudaStream_t,
  // type-erased; the communicator's input stream, which its collectives start after). A hook
  // makes that device current itself: its then() callbacks may run on another thread.
  // -1 and nullptr for a host bucket.
  [[nodiscard]] int cuda_device() const noexcept { return cuda_device_; }
  [[nodiscard]] void* cuda_stream() const noexcept { return cuda_stream_; }
  // The bucket as a typed view; asking for the wrong type or memory space is an error naming both.
  template <element_type T, memory_space Space = host>
  [[nodiscard]] tensor_view<T, Space> buffer_as() const {
    if (buffer_.type != dtype_of<T> || buffer_.on_cuda != std::same_as<Space, cuda>) {
      throw invalid_argument_error("grad_bucket " + std::to_string(index_) + ": buffer holds " +
                                   std::string(to_string(buffer_.type)) + " in " + (buffer_.on_cuda ? "cuda" : "host") +
                                   " memory, asked for " + std::string(to_string(dtype_of<T>)) + " in " +
                                   std::string(Space::name) + " memory");
    }
    return {static_cast<T*>(buffer_.data), buffer_.count};
  }
  // What the sum over ranks must be divided by: the world size (or the active ranks under
  // join), times the accumulated micro-steps when no_sync averages them.
  [[nodiscard]] double divisor() const noexcept { return divisor_; }
  [[nodiscard]] int world_size() const noexcept { return world_size_; }
  // The shapes of the bucket's parameters, in the order they lie in buffer() (DDP sets them), so
  // a hook can see matrices where the buffer is flat (PowerSGD). Empty: the owner did not say.
  [[nodiscard]] std::span<const shape> param_shapes() const noexcept { return param_shapes_; }
  void set_param_shapes(std::vector<shape> s) { param_shapes_ = std::move(s); }
  // Host memory the hook may keep across the asynchronous operation (e.g. a 16-bit copy).
  [[nodiscard]] std::vector<std::byte>& scratch() noexcept { return scratch_; }
  // Anything else a hook keeps from step to step (device scratch, error feedback, ...).
  [[nodiscard]] std::shared_ptr<void>& hook_state() noexcept { return hook_state_; }

  // The DDP's communicator's all_reduce (sum) on any view (the bucket, or a scratch copy).
  template <element_type T, memory_space Space>
  [[nodiscard]] work all_reduce(tensor_view<T, Space> t) const {
    return all_reduce_(erase(t));
  }
  [[nodiscard]] work all_reduce(raw_tensor t) const { return all_reduce_(t); }
  // A host float or double buffer divided by `divisor`, then all_reduced (sum): in one call
  // where the communicator folds the division into its reduction (process_group's
  // all_reduce_divided), else the division here first. The same bits either way.
  [[nodiscard]] work all_reduce_divided(raw_tensor t, double divisor) const {
    if (t.on_cuda) {
      throw invalid_argument_error("grad_bucket " + std::to_string(index_) + ": all_reduce_divided takes host memory "
                                   "(a CUDA bucket is divided on its stream, then all_reduced)");
    }
    if (all_reduce_divided_) return all_reduce_divided_(t, divisor);
    if (divisor != 1.0) {
      if (t.type != dtype::float32 && t.type != dtype::float64) {
        throw invalid_argument_error("grad_bucket " + std::to_string(index_) + ": all_reduce_divided takes float32 or "
                                     "float64, got " + std::string(to_string(t.type)));
      }
      // The division process_group's default makes before its sum, with the same bits.
      detail::host_add_divided(t.data, t.data, t.count, t.type, divisor, true);
    }
    return all_reduce_(t);
  }

  void set_divisor(double d) noexcept { divisor_ = d; }
  // DDP points the built-in hook's bucket at the model's own gradients when they lie back to back.
  void rebind(raw_tensor buffer) noexcept { buffer_ = buffer; }
  void set_cuda_placement(int device_index, void* stream) noexcept {
    cuda_device_ = device_index;
    cuda_stream_ = stream;
  }

 private:
  std::size_t index_;
  raw_tensor buffer_;
  all_reduce_fn all_reduce_;
  all_reduce_divided_fn all_reduce_divided_;
  int world_size_;
  double divisor_ = 1;
  int cuda_device_ = -1;
  void* cuda_stream_ = nullptr;
  std::vector<std::byte> scratch_;
  std::shared_ptr<void> hook_state_;
  std::vector<shape> param_shapes_;
};

using comm_hook = std::function<work(grad_bucket&)>;

namespace detail {

// A work that completes after `w` did and `after` ran (on w's completing thread); an error of
// w or of after completes it with that error. Waiting on it waits on w: if w's executor lets a
// waiter run w (see executor), this thread does, then `after`.
[[nodiscard]] inline work then_work(const work& w, std::function<void()> after) {
  work out;
  // Weak: w's callbacks hold out's state until w completes; a strong pointer back would be a cycle.
  out.state()->set_runner([src = std::weak_ptr<detail::work_state>(w.state())](detail::work_state&) {
    if (auto s = src.lock()) s->run_here_if_waiting();
  });
  w.then([src = w.state(), dst = out.state(), after = std::move(after)]() mutable {
    std::exception_ptr err = src->error();
    if (!err && after) {
      try {
        after();
      } catch (...) {
        err = std::current_exception();
      }
    }
    after = nullptr;
    dst->complete(err);
  });
  return out;
}

}  // namespace detail

namespace detail::ddp {

template <class F>
decltype(auto) visit_float_bucket(const grad_bucket& b, F&& f) {
  using R = decltype(f(b.buffer_as<float>()));
  return visit_dtype(b.buffer().type, [&]<class T>(std::type_identity<T>) -> R {
    if constexpr (std::same_as<T, float> || std::same_as<T, double>) {
      return f(b.buffer_as<T>());
    } else {
      throw invalid_argument_error("comm hook: bucket " + std::to_string(b.index()) + " holds " +
                                   std::string(to_string(b.buffer().type)) + ", expected float32 or float64");
    }
  });
}

[[noreturn]] inline void needs_nvcc(const grad_bucket& b, const char* hook) {
  throw invalid_argument_error(std::string("comm hook ") + hook + ": bucket " + std::to_string(b.index()) +
                               " is in CUDA memory; the translation unit that constructs the DDP must be compiled by "
                               "nvcc (the kernels are in partrain/parallel/detail/ddp_kernels.cuh)");
}

template <class H>
work compressed_all_reduce(grad_bucket& b) {
  if (b.on_cuda()) {
#if defined(__CUDACC__)
    const raw_tensor buf = b.buffer();
    const int dev = b.cuda_device();
    const auto stream = static_cast<cudaStream_t>(b.cuda_stream());
    cuda_device_guard guard(dev);
    auto& state = b.hook_state();
    // The 16-bit copy is a device_buffer on the bucket's device kept in hook_state; its zero
    // fill is queued on the bucket's stream, ahead of the cast that overwrites it.
    using scratch = device_buffer<H>;
    auto* s = static_cast<scratch*>(state.get());
    if (!s || s->size() != buf.count) {
      state = std::make_shared<scratch>(shape{buf.count}, dev, stream);
      s = static_cast<scratch*>(state.get());
    }
    void* h = s->data();
    device_to_16(buf, h, dtype_of<H>, static_cast<float>(b.divisor()), stream);
    work w = b.all_reduce(tensor_view<H, cuda>(static_cast<H*>(h), buf.count));
    // Runs on the thread that completes w (NCCL's watchdog), whose current device is not ours.
    return then_work(w, [buf, h, dev, stream] {
      cuda_device_guard cb_guard(dev);
      device_from_16(h, buf, dtype_of<H>, stream);
    });
#else
    needs_nvcc(b, "fp16/bf16 compress");
#endif
  }
  return visit_float_bucket(b, [&b](auto buf) {
    using T = typename decltype(buf)::value_type;
    auto& s = b.scratch();
    s.resize(buf.size() * sizeof(H));
    auto* h = reinterpret_cast<H*>(s.data());
    const float div = static_cast<float>(b.divisor());
    for_each_index(host_exec{}, buf.size(), compress_16_fn<T, H>{buf.data(), h, div});
    work w = b.all_reduce(tensor_view<H>(h, buf.size()));
    return then_work(w, [buf, h] { for_each_index(host_exec{}, buf.size(), decompress_16_fn<H, T>{h, buf.data()}); });
  });
}

}  // namespace detail::ddp

namespace comm_hooks {

// PyTorch's allreduce_hook: divide the bucket in place, then all_reduce (sum) it.
[[nodiscard]] inline comm_hook allreduce() {
  return [](grad_bucket& b) {
    if (b.on_cuda()) {
#if defined(__CUDACC__)
      if (b.divisor() != 1.0) {
        cuda_device_guard guard(b.cuda_device());
        detail::ddp::device_divide(b.buffer(), b.divisor(), static_cast<cudaStream_t>(b.cuda_stream()));
      }
      return b.all_reduce(b.buffer());
#else
      detail::ddp::needs_nvcc(b, "allreduce");
#endif
    }
    // Host: one call, so a backend that can fold the division into its reduction does (local).
    return detail::ddp::visit_float_bucket(b, [&b](auto buf) {
      if (b.divisor() == 1.0) return b.all_reduce(buf);
      return b.all_reduce_divided(erase(buf), b.divisor());
    });
  };
}

// PyTorch's fp16_compress_hook: the bucket travels as IEEE half (half the bytes), then is cast
// back. Gradients above 65504 / world size overflow; use bf16 for those.
[[nodiscard]] inline comm_hook fp16_compress() {
  return [](grad_bucket& b) { return detail::ddp::compressed_all_reduce<half>(b); };
}

// PyTorch's bf16_compress_hook: float's range with 8 bits of mantissa.
[[nodiscard]] inline comm_hook bf16_compress() {
  return [](grad_bucket& b) { return detail::ddp::compressed_all_reduce<bfloat16>(b); };
}

}  // namespace comm_hooks

}  // namespace partrain::inline v0
