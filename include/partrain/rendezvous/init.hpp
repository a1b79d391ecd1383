// partrain/rendezvous/init.hpp: init_process_group(url, options), as torch.distributed's: the
// rendezvous (rendezvous/rendezvous.hpp), then the backend's process group on its store.
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include <partrain/comm/process_group.hpp>
#include <partrain/config.hpp>
#include <partrain/core/device.hpp>
#include <partrain/core/error.hpp>
#include <partrain/rendezvous/rendezvous.hpp>

// Plain macro tests (no __has_include): the single header carries these backends inline.
#if defined(PARTRAIN_WITH_GLOO)
#include <partrain/comm/gloo.hpp>
#define PARTRAIN_INIT_HAS_GLOO 1
#else
#define PARTRAIN_INIT_HAS_GLOO 0
#endif
#if defined(PARTRAIN_WITH_NCCL) && PARTRAIN_HAS_CUDA
#include <partrain/comm/nccl.hpp>
#define PARTRAIN_INIT_HAS_NCCL 1
#else
#define PARTRAIN_INIT_HAS_NCCL 0
#endif

namespace partrain::inline v0 {

// Builds the backend's group on an already connected rendezvous.
[[nodiscard]] inline std::unique_ptr<process_group> make_process_group(const rendezvous_info& info, const init_options& opts = {}) {
  if (!info.store) throw invalid_argument_error("make_process_group: the rendezvous has no store (call connect_store first)");
  std::string backend = opts.backend;
  if (backend.empty()) backend = opts.device && opts.device->is_cuda() ? "nccl" : "gloo";
  process_group_options po;
  po.timeout = info.timeout;
  po.check_collectives = opts.check_collectives;
  if (backend == "gloo") {
#if PARTRAIN_INIT_HAS_GLOO
    return std::make_unique<gloo_group>(info.store, info.rank, info.world_size, po);
#else
    throw config_error("backend 'gloo' is not compiled in: install Debian libgloo-dev and link partrain::gloo "
                       "(which defines PARTRAIN_WITH_GLOO)");
#endif
  }
  if (backend == "nccl") {
#if PARTRAIN_INIT_HAS_NCCL
    const partrain::device dev = opts.device.value_or(partrain::device::cuda(info.local_rank));
    if (!dev.is_cuda()) throw config_error("backend 'nccl' needs a cuda device, got " + dev.to_string());
    return std::make_unique<nccl_group>(info.store, info.rank, info.world_size, dev, po);
#else
    throw config_error("backend 'nccl' is not compiled in: it needs CUDA and NCCL; link partrain::nccl "
                       "(which defines PARTRAIN_WITH_NCCL)");
#endif
  }
  throw config_error("unknown backend '" + backend + "' (expected 'gloo' or 'nccl')");
}

// torch.distributed.init_process_group: rendezvous on url, then the backend's group. The
// store is not kept; to build more groups on it, use rendezvous() + make_process_group()
// and keep rendezvous_info::store alive (on rank 0, until every rank is done with it).
[[nodiscard]] inline std::unique_ptr<process_group> init_process_group(std::string_view url = "env://",
                                                                       const init_options& opts = {}) {
  // Check the backend name before anyone binds a port or waits on a peer.
  if (!opts.backend.empty() && opts.backend != "gloo" && opts.backend != "nccl") {
    throw config_error("unknown backend '" + opts.backend + "' (expected 'gloo' or 'nccl')");
  }
  auto info = rendezvous(url, opts);
  auto group = make_process_group(info, opts);
  detail::release_store_host(info);
  return group;
}

}  // namespace partrain::inline v0
