// partrain/rendezvous/init_options.hpp: what init_process_group and rendezvous take and give
// (init_options, rendezvous_info) and how the environment is read (env_lookup, process_env), apart
// from the rendezvous itself, so that declaring init_process_group needs no stores.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include <partrain/comm/process_group.hpp>
#include <partrain/comm/store.hpp>
#include <partrain/core/device.hpp>

namespace partrain::inline v0 {

struct init_options {
  // "gloo", "mpi" or "nccl"; empty = "nccl" when device is a GPU, else "gloo". "mpi" meets its
  // peers through MPI (ranks started by mpirun or srun), not through a store.
  std::string backend{};
  // Bound on every blocking step. Unset: PARTRAIN_TIMEOUT_MS from the environment, else 300 s.
  std::optional<std::chrono::milliseconds> timeout{};
  // For tcp:// and file:// (env:// reads them from the environment); -1 = not given.
  int rank = -1;
  int world_size = -1;
  // nccl: the GPU of this rank; unset = cuda:LOCAL_RANK.
  std::optional<partrain::device> device{};
  bool check_collectives = false;
  // The store's job token; empty = PARTRAIN_STORE_TOKEN from the environment (may be empty).
  std::string token{};
};

// What a rendezvous URL and the environment say, and (after connect_store) the store.
struct rendezvous_info {
  std::string scheme;  // "env", "tcp" or "file"
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  int local_world_size = 1;
  std::string master_addr;  // env, tcp
  std::uint16_t port = 0;   // env, tcp
  std::string path;         // file
  std::string source;       // where rank and world size came from: torchrun, slurm, openmpi, pmi, url, options
  std::string token;
  std::string bind_address;  // PARTRAIN_STORE_BIND: what rank 0's server binds (default: master_addr)
  bool agent_store = false;  // a launcher hosts the store; every rank is a client
  bool torch_agent_store = false;  // that launcher is torchrun: its store is PyTorch's TCPStore
  int restart_count = 0;
  std::chrono::milliseconds timeout = default_timeout;
  std::shared_ptr<partrain::store> store;  // set by connect_store
};

// Looks up an environment variable; tests pass their own.
using env_lookup = std::function<std::optional<std::string>(const std::string&)>;

[[nodiscard]] inline std::optional<std::string> process_env(const std::string& name) {
  const char* v = std::getenv(name.c_str());
  if (!v) return std::nullopt;
  return std::string(v);
}

}  // namespace partrain::inline v0
