// partrain/rendezvous/init.hpp: init_process_group(url, options), as torch.distributed's: the
// rendezvous (rendezvous/rendezvous.hpp), then the backend's process group on its store.
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include <partrain/comm/process_group.hpp>
#include <partrain/config.hpp>
#include <partrain/rendezvous/init_options.hpp>
// The rendezvous, its stores and the liveness watch only where the functions below are defined:
// in the compiled mode their users parse the declarations alone.
#if PARTRAIN_DEFINITIONS
#include <partrain/core/device.hpp>
#include <partrain/core/error.hpp>
#include <partrain/rendezvous/job.hpp>
#include <partrain/rendezvous/liveness.hpp>
#include <partrain/rendezvous/rendezvous.hpp>
#endif

// Plain macro tests (no __has_include): the single header carries these backends inline. The
// engines' headers only where init_process_group is defined (not for its users in the compiled
// mode: Gloo's alone take a second to parse).
#if defined(PARTRAIN_WITH_GLOO)
#if PARTRAIN_DEFINITIONS
#include <partrain/comm/gloo.hpp>
#endif
#define PARTRAIN_INIT_HAS_GLOO 1
#else
#define PARTRAIN_INIT_HAS_GLOO 0
#endif
#if defined(PARTRAIN_WITH_MPI)
#include <partrain/comm/mpi.hpp>
#define PARTRAIN_INIT_HAS_MPI 1
#else
#define PARTRAIN_INIT_HAS_MPI 0
#endif
#if defined(PARTRAIN_WITH_NCCL) && PARTRAIN_HAS_CUDA
#if PARTRAIN_DEFINITIONS
#include <partrain/comm/nccl.hpp>
#endif
#define PARTRAIN_INIT_HAS_NCCL 1
#else
#define PARTRAIN_INIT_HAS_NCCL 0
#endif

namespace partrain::inline v0 {

// Builds the backend's group on an already connected rendezvous.
[[nodiscard]] PARTRAIN_LINKAGE std::unique_ptr<process_group> make_process_group(const rendezvous_info& info,
                                                                                 const init_options& opts = {});

// torch.distributed.init_process_group: rendezvous on url, then the backend's group. The
// store is not kept; to build more groups on it, use rendezvous() + make_process_group()
// and keep rendezvous_info::store alive (on rank 0, until every rank is done with it).
[[nodiscard]] PARTRAIN_LINKAGE std::unique_ptr<process_group> init_process_group(std::string_view url = "env://",
                                                                                 const init_options& opts = {});

#if PARTRAIN_DEFINITIONS
namespace detail::rdzv {

inline void check_backend_name(const std::string& backend) {
  if (!backend.empty() && backend != "gloo" && backend != "nccl" && backend != "mpi") {
    throw config_error("unknown backend '" + backend + "' (expected 'gloo', 'mpi' or 'nccl')");
  }
}

// A process partrun started for a fault-tolerant job (--spares, --min-replicas) is one replica of
// many, spares counted in WORLD_SIZE: a group over all of them would train the spares too and
// end the job at the first loss. Such a program builds a replica_group instead.
inline void refuse_replica_launch(const env_lookup& env) {
  for (const char* var : {"PARTRAIN_FT_SLOTS", "PARTRAIN_FT_MIN_REPLICAS"}) {
    if (!env(var)) continue;
    throw config_error(std::string("init_process_group: this process was started for a fault-tolerant job (") + var +
                       " is set, by partrun --spares or --min-replicas), whose groups change with its quorums: build a "
                       "replica_group from replica_launch_from_env() instead (parallel/replica_group.hpp). It heals "
                       "from one replica's whole state, so it takes the data-parallel modes (DDP, local SGD, DiLoCo), "
                       "not ZeRO, FSDP or a pipeline (their state is sharded over the ranks), and gloo or threads, "
                       "not mpi (Open MPI cannot rebuild a communicator after a rank dies)");
  }
}

}  // namespace detail::rdzv

namespace detail::mpi {

// The mpi backend meets its peers through MPI (mpirun/srun started them), not through a store.
// What the URL, the options and a torchrun-style environment say must agree with MPI.
[[nodiscard]] inline std::unique_ptr<process_group> make_group(const init_options& opts, std::chrono::milliseconds timeout) {
#if PARTRAIN_INIT_HAS_MPI
  check_mpi_launch();
  process_group_options po;
  po.timeout = timeout;
  po.check_collectives = opts.check_collectives;
  // PARTRAIN_SILENCE_MS, as the store backends' heartbeats read it: a stopped rank is named in seconds.
  auto g = std::make_unique<mpi_group>(po, mpi_options{.silence = liveness_options_from_env().silence});
  auto check = [&](const char* what, int given, int mpi) {
    if (given >= 0 && given != mpi) {
      throw config_error("backend 'mpi': " + std::string(what) + " " + std::to_string(given) + " disagrees with MPI's " +
                         std::to_string(mpi) + " (mpirun/srun decide ranks for the mpi backend; leave " + what +
                         " unset or make it match)");
    }
  };
  check("rank", opts.rank, g->rank());
  check("world size", opts.world_size, g->size());
  for (auto [var, mpi] : {std::pair{"RANK", g->rank()}, std::pair{"WORLD_SIZE", g->size()}}) {
    if (const char* v = std::getenv(var); v && *v && std::string(v) != std::to_string(mpi)) {
      throw config_error("backend 'mpi': " + std::string(var) + "=" + v + " in the environment disagrees with MPI's " +
                         std::to_string(mpi) + " (another launcher's variables under mpirun?)");
    }
  }
  return g;
#else
  (void)opts;
  (void)timeout;
  throw config_error("backend 'mpi' is not compiled in: install Debian libopenmpi-dev and link partrain::mpi "
                     "(which defines PARTRAIN_WITH_MPI)");
#endif
}

}  // namespace detail::mpi

PARTRAIN_LINKAGE std::unique_ptr<process_group> make_process_group(const rendezvous_info& info, const init_options& opts) {
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
  if (backend == "mpi") return detail::mpi::make_group(opts, info.timeout);
  throw config_error("unknown backend '" + backend + "' (expected 'gloo', 'mpi' or 'nccl')");
}

PARTRAIN_LINKAGE std::unique_ptr<process_group> init_process_group(std::string_view url, const init_options& opts) {
  // Check the backend name before anyone binds a port or waits on a peer.
  detail::rdzv::check_backend_name(opts.backend);
  detail::rdzv::refuse_replica_launch(process_env);
  // mpi:// (or backend "mpi" on env://): MPI's own rendezvous, no store.
  if (url.starts_with("mpi://") || opts.backend == "mpi") {
    if (!opts.backend.empty() && opts.backend != "mpi") {
      throw config_error("mpi:// needs backend 'mpi' (or none), got '" + opts.backend + "'");
    }
    if (url != "mpi://" && url != "env://") {
      throw config_error("backend 'mpi' takes the URL 'mpi://' or 'env://' (MPI's launcher is the rendezvous), got '" +
                         std::string(url) + "'");
    }
    return detail::mpi::make_group(opts, detail::rdzv::timeout_option(opts, process_env, default_timeout));
  }
  auto info = rendezvous(url, opts);
  detail::rdzv::join_job(info);  // one job: same world size everywhere, no rank claimed twice
  auto group = make_process_group(info, opts);
  // A stalled or lost rank ends the job within seconds (liveness.hpp), not at the collective timeout.
  if (const auto lo = liveness_options_from_env(); info.world_size > 1 && lo.silence.count() > 0) {
    auto watch = std::make_shared<liveness_watch>(info, *group, lo);
    group->set_arrival_report([w = watch.get()](std::uint64_t op) { return w->behind(op); });
    group->attach(std::move(watch));
  }
  detail::rdzv::release_store_host(info);
  return group;
}
#endif

}  // namespace partrain::inline v0
