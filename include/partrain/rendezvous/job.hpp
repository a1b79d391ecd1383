// partrain/rendezvous/job.hpp: what makes the ranks on a store one job. Its identity is the
// store's token: spawn and partrun make a random one (random_token), a batch system's job id
// stands in where the launcher sets no token (rendezvous.hpp: Slurm, Open MPI, torchrun's run
// id), and a store with a token refuses a client without the same one, so a second job started
// on the same MASTER_PORT cannot join the first. Then every rank passes one check on joining (join_job): the same world size as
// rank 0, and a rank number no other process has claimed. A rank that fails it tells the others
// through the store, so every rank stops at once with both sides named, not after a timeout.
#pragma once

#include <algorithm>
#include <chrono>
#include <fstream>
#include <string>
#include <string_view>
#include <thread>

#include <unistd.h>

#include <partrain/core/error.hpp>
#include <partrain/core/log.hpp>
#include <partrain/rendezvous/rendezvous.hpp>

namespace partrain::inline v0::detail::rdzv {

// 32 hex digits from /dev/urandom.
[[nodiscard]] inline std::string random_token() {
  unsigned char bytes[16];
  std::ifstream urandom("/dev/urandom", std::ios::binary);
  if (!urandom.read(reinterpret_cast<char*>(bytes), sizeof bytes)) {
    throw config_error("cannot read /dev/urandom to make a job token");
  }
  static constexpr char hex[] = "0123456789abcdef";
  std::string t;
  for (unsigned char b : bytes) {
    t += hex[b >> 4];
    t += hex[b & 15];
  }
  return t;
}

[[nodiscard]] inline std::string this_process() {
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  return "pid " + std::to_string(::getpid()) + " on " + host;
}

// The join check's keys, relative to the job's store prefix. A launcher that sees a rank end before
// it claimed its key sets the failed key, so the others stop waiting at once (partrun does).
[[nodiscard]] inline std::string join_claim_key(int rank) { return "partrain/join/rank/" + std::to_string(rank); }
inline constexpr std::string_view join_failed_key = "partrain/join/failed";

// The check every rank passes once connected, before building its backend (see the top).
inline void join_job(const rendezvous_info& info) {
  if (info.world_size == 1 || !info.store) return;
  auto& s = *info.store;
  const std::string me = "rank " + std::to_string(info.rank);
  const std::string failed_key(join_failed_key);
  auto fail = [&](const std::string& msg) {
    s.set(failed_key, msg);
    throw config_error(msg);
  };

  // A rank number claimed twice: a duplicated RANK, or a rank of another job on this store.
  const std::string claim = join_claim_key(info.rank);
  if (s.add(claim, 1) != 1) {
    std::string other = "another process";
    try {
      other = s.get_string(claim + "/by", std::chrono::milliseconds(2000));
    } catch (const timeout_error&) {
    }
    fail(me + " (" + this_process() + ") joined the store at " + info.master_addr + ":" + std::to_string(info.port) +
         ", but rank " + std::to_string(info.rank) + " was already claimed by " + other +
         ": two processes were given the same RANK, or two jobs share one MASTER_PORT (give each job its own port, "
         "and a job token: PARTRAIN_STORE_TOKEN)");
  }
  s.set(claim + "/by", this_process());

  const std::string size_key = "partrain/join/world_size";
  if (info.rank == 0) {
    s.set(size_key, std::to_string(info.world_size));
    // Wait until every other rank compared its world size with this one (or one failed).
    const auto deadline = std::chrono::steady_clock::now() + info.timeout;
    for (auto pause = std::chrono::milliseconds(1);; pause = std::min(pause * 2, std::chrono::milliseconds(50))) {
      if (s.check({failed_key})) throw config_error(s.get_string(failed_key, info.timeout));
      const auto joined = s.add("partrain/join/checked", 0);
      if (joined >= info.world_size - 1) break;
      if (std::chrono::steady_clock::now() > deadline) {
        throw timeout_error({.rank = 0, .operation = "init_process_group", .timeout = info.timeout},
                            "only " + std::to_string(joined) + " of the " + std::to_string(info.world_size - 1) +
                                " other ranks joined within " + std::to_string(info.timeout.count()) + " ms");
      }
      std::this_thread::sleep_for(pause);
    }
    return;
  }
  const std::string theirs = s.get_string(size_key, info.timeout);
  if (theirs != std::to_string(info.world_size)) {
    fail(me + " was started with world size " + std::to_string(info.world_size) + ", but rank 0 with world size " +
         theirs + " (every rank of a job needs the same WORLD_SIZE)");
  }
  if (s.check({failed_key})) throw config_error(s.get_string(failed_key, info.timeout));
  (void)s.add("partrain/join/checked", 1);
}

}  // namespace partrain::inline v0::detail::rdzv
