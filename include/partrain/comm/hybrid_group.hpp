// partrain/comm/hybrid_group.hpp: one group over two backends of the same ranks: host memory
// travels on one (gloo, local), device memory on the other (nccl). What a fault-tolerant quorum
// of CUDA replicas needs: the gradients go over NCCL, while the step agreement and the state a
// joining replica receives are host bytes. torch.distributed keeps a gloo group beside an NCCL one
// for the same reason (its "cpu:gloo,cuda:nccl" backend string).
//
//   auto groups = hybrid_groups_by_id(gloo_groups_by_id(store), nccl_groups_by_id(store, device::cuda(0)));
//   replica_group rg(control, groups, state, {.replica = r});   // a new NCCL communicator per quorum
#pragma once

#include <concepts>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>

#include <partrain/comm/process_group.hpp>
#include <partrain/core/dtype.hpp>
#include <partrain/core/error.hpp>
#include <partrain/core/memory_space.hpp>
#include <partrain/core/tensor_view.hpp>
#include <partrain/core/work.hpp>

namespace partrain::inline v0 {

class hybrid_group final : public process_group {
 public:
  // host_memory: a group that takes host memory; device_memory: one of the same ranks that takes
  // CUDA memory. Both are owned; the device group is destroyed first.
  hybrid_group(std::unique_ptr<process_group> host_memory, std::unique_ptr<process_group> device_memory)
      : hybrid_group(checked(host_memory, device_memory), std::move(host_memory), std::move(device_memory)) {}

  [[nodiscard]] std::string_view backend() const noexcept override { return name_; }
  [[nodiscard]] bool accepts(device_kind) const noexcept override { return true; }
  [[nodiscard]] int cuda_device_index() const noexcept override { return device_->cuda_device_index(); }
  [[nodiscard]] void* input_stream() const noexcept override { return device_->input_stream(); }
  [[nodiscard]] process_group& host_group() noexcept { return *host_; }
  [[nodiscard]] process_group& device_group() noexcept { return *device_; }

 protected:
  work do_all_reduce(raw_tensor t, reduce_op op) override {
    return routed(t, [&](process_group& g, auto v) { return g.all_reduce(v, op); });
  }
  work do_all_reduce_divided(raw_tensor t, double divisor) override {
    return host_->all_reduce_divided(t, divisor);  // host memory only (process_group checked it)
  }
  work do_broadcast(raw_tensor t, int root) override {
    return routed(t, [&](process_group& g, auto v) { return g.broadcast(v, root); });
  }
  work do_reduce(raw_tensor t, int root, reduce_op op) override {
    return routed(t, [&](process_group& g, auto v) { return g.reduce(v, root, op); });
  }
  work do_all_gather(raw_tensor in, raw_tensor out) override {
    return routed(in, [&](process_group& g, auto v) { return g.all_gather(v, like(v, out)); });
  }
  work do_reduce_scatter(raw_tensor in, raw_tensor out, reduce_op op) override {
    return routed(in, [&](process_group& g, auto v) { return g.reduce_scatter(v, like(v, out), op); });
  }
  work do_barrier() override { return host_->barrier(); }
  work do_send(raw_tensor t, int dst, int tag) override {
    return routed(t, [&](process_group& g, auto v) { return g.send(v, dst, tag); });
  }
  work do_recv(raw_tensor t, int src, int tag) override {
    return routed(t, [&](process_group& g, auto v) { return g.recv(v, src, tag); });
  }

 private:
  // The groups, checked before anything reads them (the references are moved from only after).
  hybrid_group(const process_group& checked_host, std::unique_ptr<process_group>&& host_memory,
               std::unique_ptr<process_group>&& device_memory)
      : process_group(checked_host.rank(), checked_host.size(), checked_host.options()),
        host_(std::move(host_memory)), device_(std::move(device_memory)),
        name_(std::string(host_->backend()) + "+" + std::string(device_->backend())) {}

  // The host group, once both are known to fit; else a config_error naming what does not.
  static const process_group& checked(const std::unique_ptr<process_group>& host,
                                      const std::unique_ptr<process_group>& device) {
    if (!host || !device) throw invalid_argument_error("hybrid_group: a group is null (expected a host group and a device group)");
    if (!host->accepts(device_kind::cpu)) {
      throw config_error("hybrid_group: the host group (" + std::string(host->backend()) +
                         ") does not take host memory (expected gloo or local)");
    }
    if (!device->accepts(device_kind::cuda)) {
      throw config_error("hybrid_group: the device group (" + std::string(device->backend()) +
                         ") does not take CUDA memory (expected nccl)");
    }
    if (host->rank() != device->rank() || host->size() != device->size()) {
      throw config_error("hybrid_group: the host group is rank " + std::to_string(host->rank()) + " of " +
                         std::to_string(host->size()) + " and the device group rank " + std::to_string(device->rank()) +
                         " of " + std::to_string(device->size()) + " (expected the same ranks)");
    }
    return *host;
  }

  // Host memory to the host group, CUDA memory to the device group, through their typed calls (so
  // each keeps its own count of operations for its errors).
  template <class F>
  work routed(raw_tensor t, F&& f) {
    return visit_dtype(t.type, [&]<class T>(std::type_identity<T>) -> work {
      if (t.on_cuda) return f(*device_, tensor_view<T, cuda>(static_cast<T*>(t.data), t.count));
      return f(*host_, tensor_view<T, host>(static_cast<T*>(t.data), t.count));
    });
  }
  // `out` as a view of v's element type and memory.
  template <class T, class S>
  static tensor_view<T, S> like(tensor_view<T, S>, raw_tensor out) noexcept {
    return tensor_view<T, S>(static_cast<T*>(out.data), out.count);
  }

  std::unique_ptr<process_group> host_;
  std::unique_ptr<process_group> device_;
  std::string name_;
};

// A replica_group factory of hybrid groups: quorum `id`'s host group from host_groups, its device
// group from device_groups (each, e.g., under a store prefix of the id's own), so every quorum
// gets a new communicator of each.
template <class HostFactory, class DeviceFactory>
  requires std::invocable<HostFactory&, std::int64_t, int, int> && std::invocable<DeviceFactory&, std::int64_t, int, int>
[[nodiscard]] auto hybrid_groups_by_id(HostFactory host_groups, DeviceFactory device_groups) {
  return [host_groups = std::move(host_groups), device_groups = std::move(device_groups)](
             std::int64_t id, int rank, int size) mutable -> std::unique_ptr<process_group> {
    std::unique_ptr<process_group> h = host_groups(id, rank, size);
    std::unique_ptr<process_group> d = device_groups(id, rank, size);
    return std::make_unique<hybrid_group>(std::move(h), std::move(d));
  };
}

}  // namespace partrain::inline v0
