// partrain/parallel/detail/reducer.hpp: DDP's gradient reducer. Gradients are copied into flat
// per-bucket buffers as they become final; a bucket whose last gradient arrived is handed to
// the comm hook, strictly in bucket order so every rank issues the same all_reduces in the same
// order; at the end of the step the averaged buckets are copied back into the gradients.
#pragma once

#include <algorithm>
#include <chrono>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include <partrain/comm/process_group.hpp>
#include <partrain/core/buffer.hpp>
#include <partrain/core/error.hpp>
#include <partrain/core/for_each_index.hpp>
#include <partrain/core/tensor_view.hpp>
#include <partrain/core/work.hpp>
#include <partrain/parallel/comm_hooks.hpp>
#include <partrain/parallel/ddp_stats.hpp>
#include <partrain/parallel/detail/buckets.hpp>
#include <partrain/parallel/detail/ddp_elements.hpp>

#if PARTRAIN_HAS_CUDA
#include <partrain/cuda/device_buffer.hpp>
#include <partrain/cuda/device_guard.hpp>
#include <partrain/parallel/detail/ddp_staging.hpp>
#endif
#if defined(__CUDACC__)
#include <partrain/parallel/detail/ddp_kernels.cuh>
#endif

namespace partrain::inline v0::detail::ddp {

// Gradients to and from the host buckets (the CUDA overloads are in parallel/detail/ddp_staging.hpp).
// `stream` (the model's, for CUDA gradients) is unused on the host.
template <class T>
void stage_in(T* dst, tensor_view<const T, host> g, bool add, std::vector<T>&, void* /*stream*/) {
  if (add) {
    for_each_index(host_exec{}, g.size(), accumulate_fn<T>{dst, g.data()});
  } else if (!g.empty()) {
    std::memcpy(dst, g.data(), g.size_bytes());
  }
}
template <class T>
void stage_out(tensor_view<T, host> g, const T* src, void* /*stream*/) {
  if (!g.empty()) std::memcpy(g.data(), src, g.size_bytes());
}

// The communicator's all_reduce behind the type-erased signature hooks use. A process_group takes
// the bucket's dtype-tagged buffer as it is (one type erasure from bucket to backend); any other
// communicator gets it back as a typed view.
template <class C>
[[nodiscard]] grad_bucket::all_reduce_fn make_all_reduce_fn(C& comm) {
  return [&comm](raw_tensor t) -> work {
    if constexpr (requires { comm.all_reduce(t, reduce_op::sum); }) {
      return comm.all_reduce(t, reduce_op::sum);
    } else {
      return visit_dtype(t.type, [&]<class E>(std::type_identity<E>) -> work {
        if (t.on_cuda) return comm.all_reduce(tensor_view<E, cuda>(static_cast<E*>(t.data), t.count), reduce_op::sum);
        return comm.all_reduce(tensor_view<E>(static_cast<E*>(t.data), t.count), reduce_op::sum);
      });
    }
  };
}

// The communicator's all_reduce_divided where it has one (process_group), else empty: the
// bucket then divides before its all_reduce.
template <class C>
[[nodiscard]] grad_bucket::all_reduce_divided_fn make_all_reduce_divided_fn(C& comm) {
  if constexpr (requires(raw_tensor t) { comm.all_reduce_divided(t, 2.0); }) {
    return [&comm](raw_tensor t, double divisor) -> work { return comm.all_reduce_divided(t, divisor); };
  } else {
    return {};
  }
}

// Device mode: the buckets live in CUDA memory on device `index` (where the parameters are), and
// their copies and kernels are queued on the stream `stream()` returns (a cudaStream_t,
// type-erased: the communicator's input stream, asked at each step since it may change).
struct device_placement {
  int index = -1;                 // -1: host buckets
  std::function<void*()> stream;  // empty: the default stream
  // Host buckets with CUDA gradients: the model's stream (model_stream), which the gradients are
  // copied to and from the buckets on; null: the legacy default stream.
  void* staging_stream = nullptr;
};

// Buckets live in host memory (CUDA gradients are staged through it), or, in device mode (CUDA
// parameters and a backend that reduces CUDA memory, i.e. NCCL), in CUDA memory.
// In place (`in_place`: host gradients and the built-in allreduce hook, which only needs the
// bucket's elements, not their order): a bucket whose gradients lie back to back in the model's
// memory is divided and reduced right there, with no copy in or out (PyTorch's
// gradient_as_bucket_view); the same arithmetic on the same elements, so the same bits. Checked
// at each launch (the model may hand out other views); a step after no_sync micro-steps adds into
// the buckets, so it copies.
template <class T, class S = host>
class reducer {
  using clock = std::chrono::steady_clock;

 public:
  reducer(std::vector<std::size_t> numels, std::size_t first_bytes, std::size_t cap_bytes, comm_hook hook,
          grad_bucket::all_reduce_fn all_reduce, int rank, int world_size, ddp_stats& stats,
          device_placement placement = {}, std::function<void(const work&, std::size_t)> on_launch = {},
          bool in_place = false, grad_bucket::all_reduce_divided_fn all_reduce_divided = {})
      : numels_(std::move(numels)), hook_(std::move(hook)), on_launch_(std::move(on_launch)), rank_(rank),
        stats_(&stats), placement_(std::move(placement)), device_(placement_.index >= 0),
        in_place_capable_(in_place && std::same_as<S, host> && !device_) {
    if (!hook_) throw invalid_argument_error("ddp_options::hook is empty (expected a comm_hook, e.g. comm_hooks::allreduce())");
#if !defined(__CUDACC__)
    if (device_) {
      throw config_error("rank " + std::to_string(rank) + " DDP: CUDA parameters on a backend that reduces CUDA "
                         "memory need the kernels of partrain/parallel/detail/ddp_kernels.cuh: compile the translation unit that "
                         "constructs the DDP with nvcc");
    }
#endif
    const auto layout = assign_buckets(numels_, sizeof(T), first_bytes, cap_bytes);
    bucket_of_.resize(numels_.size());
    offset_of_.resize(numels_.size());
    ready_.assign(numels_.size(), 0);
    ready_grads_.resize(numels_.size());
    for (std::size_t b = 0; b < layout.size(); ++b) {
      auto& bk = buckets_.emplace_back();
      bk.info = layout[b];
#if PARTRAIN_HAS_CUDA
      if (device_) {
        bk.dev = device_buffer<T>(bk.info.elements, placement_.index);
      } else {
        bk.data = host_buffer<T>(bk.info.elements);
      }
#else
      bk.data = host_buffer<T>(bk.info.elements);
#endif
      std::size_t off = 0;
      for (std::size_t p : bk.info.params) {
        bucket_of_[p] = b;
        offset_of_[p] = off;
        off += numels_[p];
      }
      bk.own = raw_tensor{bucket_ptr(bk), bk.info.elements, dtype_of<T>, device_};
      bk.gb = std::make_unique<grad_bucket>(b, bk.own, all_reduce, world_size, all_reduce_divided);
    }
    refresh_stream();
    stats_->buckets = layout;
  }
  reducer(const reducer&) = delete;
  reducer& operator=(const reducer&) = delete;
  ~reducer() { drain(); }

  [[nodiscard]] std::size_t size() const noexcept { return numels_.size(); }

  // Tells every bucket the shapes of its parameters (in bucket memory order), for the hooks.
  void set_param_shapes(const std::vector<shape>& shapes) {
    for (auto& b : buckets_) {
      std::vector<shape> mine;
      for (std::size_t p : b.info.params) mine.push_back(shapes.at(p));
      b.gb->set_param_shapes(std::move(mine));
    }
  }

  // Starts a synchronizing step. `add`: the buckets already hold accumulated micro-steps.
  void begin(double divisor, bool add) {
    divisor_ = divisor;
    add_ = add;
    next_ = 0;
    refresh_stream();
    std::fill(ready_.begin(), ready_.end(), 0);
    for (auto& b : buckets_) {
      b.pending = b.info.params.size();
      b.done.reset();
      b.in_place = false;
    }
  }

  // Parameter i's gradient is final: copy it into its bucket; launch whatever is now launchable.
  void mark_ready(std::size_t i, tensor_view<const T, S> g) {
    check_grad_ready("DDP ", i, numels_.size(), i < numels_.size() && ready_[i]);
    if (g.size() != numels_[i]) {
      throw invalid_argument_error("DDP: parameter " + std::to_string(i) + "'s gradient has " +
                                   std::to_string(g.size()) + " elements, it had " + std::to_string(numels_[i]) +
                                   " at construction");
    }
    ready_[i] = 1;
    auto& b = buckets_[bucket_of_[i]];
    if (in_place_capable_) {
      ready_grads_[i] = g;  // copied (or reduced in place) when its bucket launches
    } else {
      copy_in(bucket_ptr(b) + offset_of_[i], g, add_);
    }
    if (--b.pending == 0) launch_ready();
  }

  // End of the model's step: gradients never reported are taken now (last parameter first),
  // then every bucket is waited for and copied back into the gradients.
  void finish(const std::vector<tensor_view<T, S>>& grads) {
    for (std::size_t k = numels_.size(); k-- > 0;) {
      if (!ready_[k]) mark_ready(k, grads[k]);
    }
    if (buckets_.empty()) return;
    const auto t0 = clock::now();
    wait_all_buckets("gradient all_reduce");
    const auto t1 = clock::now();
    clock::time_point first = buckets_.front().launched, last = buckets_.front().finished;
    for (auto& b : buckets_) {
      first = std::min(first, b.launched);
      last = std::max(last, b.finished);
    }
    stats_->record(std::chrono::duration<double>(last - first).count(), std::chrono::duration<double>(t1 - t0).count());
    for (std::size_t p = 0; p < numels_.size(); ++p) {
      auto& b = buckets_[bucket_of_[p]];
      if (!b.in_place) copy_out(grads[p], bucket_ptr(b) + offset_of_[p]);
    }
#if PARTRAIN_HAS_CUDA
    if (device_) {
      // The step returns with the gradients in place, as on the host: the optimizer (or any
      // stream) may read them without knowing which stream the copies ran on.
      cuda_device_guard guard(placement_.index);
      cuda_check(cudaStreamSynchronize(stream()), "cudaStreamSynchronize (DDP buckets to gradients)", __FILE__,
                 __LINE__);
    }
#endif
  }

  // A no_sync micro-step: the gradients are added into the buckets, nothing is communicated.
  void accumulate(const std::vector<tensor_view<T, S>>& grads, bool add) {
    refresh_stream();
    for (std::size_t p = 0; p < numels_.size(); ++p) {
      copy_in(bucket_ptr(buckets_[bucket_of_[p]]) + offset_of_[p], tensor_view<const T, S>(grads[p]), add);
    }
  }

  // A joined rank's part of an active rank's step: zero buckets through the hook, in order.
  void shadow(double divisor) {
    begin(divisor, false);
    for (auto& b : buckets_) {
#if PARTRAIN_HAS_CUDA
      if (device_) {
        if (b.info.elements) {
          cuda_device_guard guard(placement_.index);
          cuda_check(cudaMemsetAsync(b.dev.data(), 0, b.dev.size_bytes(), stream()), "cudaMemsetAsync (shadow bucket)",
                     __FILE__, __LINE__);
        }
      } else {
        std::fill(b.data.begin(), b.data.end(), T(0));
      }
#else
      std::fill(b.data.begin(), b.data.end(), T(0));
#endif
      b.pending = 0;
      b.shadow = true;  // the zeros in its own buffer, never the model's gradients
    }
    launch_ready();
    for (auto& b : buckets_) b.shadow = false;
    wait_all_buckets("gradient all_reduce (shadowing for ranks that still have data)");
  }

  // Waits for whatever is in flight, ignoring errors (used when a step is abandoned).
  void drain() noexcept {
    for (auto& b : buckets_) {
      if (b.done) {
        try {
          b.done->wait();
        } catch (...) {
        }
        b.done.reset();
      }
    }
  }

 private:
  struct bucket {
    ddp_bucket_info info;
    host_buffer<T> data;
#if PARTRAIN_HAS_CUDA
    device_buffer<T> dev;  // device mode only
#endif
    std::unique_ptr<grad_bucket> gb;  // stable address: hook callbacks may hold it
    raw_tensor own{};                 // the bucket's own buffer, as the hook sees it
    bool in_place = false;            // this step: reduced in the model's gradient memory
    bool shadow = false;              // a joined rank's zero bucket
    std::size_t pending = 0;
    std::optional<work> done;
    clock::time_point launched{}, finished{};
  };

  // Asks the placement for the stream now (set_input_stream may have changed it) and tells the
  // hooks' buckets.
  void refresh_stream() {
    if (!device_) return;
    stream_ = placement_.stream ? placement_.stream() : nullptr;
    for (auto& b : buckets_) b.gb->set_cuda_placement(placement_.index, stream_);
  }
#if PARTRAIN_HAS_CUDA
  [[nodiscard]] cudaStream_t stream() const noexcept { return static_cast<cudaStream_t>(stream_); }
#endif

  [[nodiscard]] T* bucket_ptr(bucket& b) noexcept {
#if PARTRAIN_HAS_CUDA
    if (device_) return b.dev.data();
#endif
    return b.data.data();
  }
  void copy_in(T* dst, tensor_view<const T, S> g, bool add) {
#if defined(__CUDACC__)
    if constexpr (std::same_as<S, cuda>) {
      if (device_) {
        cuda_device_guard guard(placement_.index);
        device_stage_in(dst, g, add, stream());
        return;
      }
    }
#endif
    stage_in(dst, g, add, tmp_, placement_.staging_stream);
  }
  void copy_out(tensor_view<T, S> g, const T* src) {
#if defined(__CUDACC__)
    if constexpr (std::same_as<S, cuda>) {
      if (device_) {
        cuda_device_guard guard(placement_.index);
        device_stage_out(g, src, stream());
        return;
      }
    }
#endif
    stage_out(g, src, placement_.staging_stream);
  }

  void launch_ready() {
    while (next_ < buckets_.size() && buckets_[next_].pending == 0) {
      auto& b = buckets_[next_++];
      if (b.shadow) {
        b.gb->rebind(b.own);  // the zeros, never the model's gradients of an earlier in-place step
      } else if (in_place_capable_) {
        stage_bucket(b);
      }
      b.gb->set_divisor(divisor_);
      b.launched = clock::now();
      work w = hook_(*b.gb);
      b.done = then_work(w, [&b] { b.finished = clock::now(); });
      // The observer sees b.done: its callbacks run before the step's wait returns.
      if (on_launch_) on_launch_(*b.done, next_ - 1);
    }
  }

  // In-place mode, at launch: the bucket's gradients as one span of the model's memory if they
  // lie back to back (in any order, each starting where another ends, none overlapping), else
  // copied into the bucket's own buffer as mark_ready would have.
  void stage_bucket(bucket& b) {
    // Addresses as integers: the views may come from separate allocations.
    spans_.clear();
    for (std::size_t p : b.info.params) {
      const auto& g = ready_grads_[p];
      if (!g.empty()) spans_.emplace_back(reinterpret_cast<std::uintptr_t>(g.data()), g.size_bytes());
    }
    std::sort(spans_.begin(), spans_.end());
    bool back_to_back = !add_ && !spans_.empty();
    std::size_t bytes = 0;
    for (std::size_t k = 0; back_to_back && k < spans_.size(); ++k) {
      back_to_back = k == 0 || spans_[k].first == spans_[k - 1].first + spans_[k - 1].second;
      bytes += spans_[k].second;
    }
    // The model's own (mutable) gradients: mark_ready's views are const only by type.
    T* first = back_to_back ? reinterpret_cast<T*>(spans_.front().first) : nullptr;
    b.in_place = back_to_back && bytes == b.info.elements * sizeof(T);
    if (b.in_place) {
      b.gb->rebind(raw_tensor{first, b.info.elements, dtype_of<T>, false});
      ++stats_->in_place_buckets;
      return;
    }
    b.gb->rebind(b.own);
    for (std::size_t p : b.info.params) copy_in(bucket_ptr(b) + offset_of_[p], ready_grads_[p], add_);
    ++stats_->copied_buckets;
  }

  void wait_all_buckets(std::string_view what) {
    std::exception_ptr first;
    std::size_t failed = 0;
    for (std::size_t k = 0; k < buckets_.size(); ++k) {
      auto& b = buckets_[k];
      if (!b.done) continue;
      try {
        b.done->wait();
      } catch (...) {
        if (!first) {
          first = std::current_exception();
          failed = k;
        }
      }
      b.done.reset();
    }
    if (!first) return;
    try {
      std::rethrow_exception(first);
    } catch (const aborted_error& e) {
      // Stays an echo of the failed rank.
      throw aborted_error(describe(what, failed, "aborted"), e, site_of(e));
    } catch (const timeout_error& e) {
      throw timeout_error(describe(what, failed, e.what()) +
                              ". If ranks run out of batches at different steps, construct DDP with "
                              "ddp_options{.join = true} and call join() on a rank once its data ends",
                          site_of(e));
    } catch (const communication_error& e) {
      throw communication_error(describe(what, failed, e.what()) +
                                    ". (If a rank stopped because it ran out of batches, use ddp_options{.join = true} "
                                    "and join())",
                                site_of(e));
    }
  }

  [[nodiscard]] std::string describe(std::string_view what, std::size_t bucket, std::string_view inner) const {
    return "rank " + std::to_string(rank_) + " DDP " + std::string(what) + " of bucket " + std::to_string(bucket) +
           " (of " + std::to_string(buckets_.size()) + ") failed: " + detail::unprefixed(inner);
  }
  // The backend's fields (its peer, its deadline) forwarded; this rank and "all_reduce" where
  // the hook's error knew none.
  [[nodiscard]] error_site site_of(const error& e) const { return detail::site_or(e, rank_, "all_reduce"); }

  std::vector<std::size_t> numels_;
  comm_hook hook_;
  std::function<void(const work&, std::size_t)> on_launch_;  // ddp_options::on_bucket_launch
  int rank_;
  ddp_stats* stats_;
  std::vector<bucket> buckets_;
  std::vector<std::size_t> bucket_of_, offset_of_;
  std::vector<char> ready_;
  std::size_t next_ = 0;
  double divisor_ = 1;
  bool add_ = false;
  device_placement placement_;
  bool device_ = false;  // placement_.index >= 0
  bool in_place_capable_ = false;
  std::vector<tensor_view<const T, S>> ready_grads_;  // in-place mode: this step's reported gradients
  std::vector<std::pair<std::uintptr_t, std::size_t>> spans_;  // stage_bucket's scratch
  void* stream_ = nullptr;
  std::vector<T> tmp_;
};

}  // namespace partrain::inline v0::detail::ddp
