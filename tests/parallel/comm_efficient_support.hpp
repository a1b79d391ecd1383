// What the local SGD, DiLoCo and PowerSGD tests share: the per-rank batches of test_ddp.cpp
// (rank r's batch at step s is the r-th part of the one-process batch of step s), a plain DDP
// run to compare with, and a tolerance check.
#pragma once

#include <catch2/catch.hpp>

#include <partrain/comm/local.hpp>
#include <partrain/optim/sgd.hpp>
#include <partrain/parallel/ddp.hpp>

#include <cstddef>
#include <exception>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "toy_models.hpp"

namespace partrain::testing {

inline constexpr std::size_t per_rank = 4;
inline const sgd_options inner_sgd{.lr = 0.05, .momentum = 0.9, .weight_decay = 1e-3};

template <class T>
toy_batch<T> rank_batch(int step, int world, int rank, std::size_t b = per_rank) {
  return make_toy_batch<T>(static_cast<std::size_t>(step * world + rank) * b, b);
}

// Every rank's parameters after `steps` DDP steps with SGD (rank 0's seed wins the broadcast).
template <class T>
std::vector<std::vector<T>> ddp_reference(int world, int steps, ddp_options o = {}, sgd_options so = inner_sgd) {
  std::vector<std::vector<T>> out(static_cast<std::size_t>(world));
  run_local(world, [&](local_group& g) {
    toy_mlp<T> m(7 + static_cast<std::uint64_t>(g.rank()));
    distributed_data_parallel ddp(m, g, o);
    sgd opt(m, so);
    for (int s = 0; s < steps; ++s) {
      ddp.train_step(rank_batch<T>(s, world, g.rank()));
      opt.step();
    }
    out[static_cast<std::size_t>(g.rank())] = m.flat_values();
  });
  return out;
}

template <class T>
void check_close(const std::vector<T>& got, const std::vector<T>& want, double tol) {
  REQUIRE(got.size() == want.size());
  for (std::size_t i = 0; i < got.size(); ++i) {
    CHECK(static_cast<double>(got[i]) == Approx(static_cast<double>(want[i])).epsilon(tol).margin(tol));
  }
}

// hosts x per_host ranks on threads, each in two local worlds: the job's (rank h * per_host + l)
// and its host's (rank l): what hierarchical local SGD is given on a real cluster. A failing
// rank aborts both of its worlds, so no peer waits for it; the first root-cause error is rethrown.
template <class F>
void run_local_hosts(int hosts, int per_host, F fn, process_group_options opts = {}) {
  auto world = make_local_world(hosts * per_host, opts);
  std::vector<std::vector<std::unique_ptr<local_group>>> intra;
  for (int h = 0; h < hosts; ++h) intra.push_back(make_local_world(per_host, opts));
  std::vector<std::exception_ptr> errors(static_cast<std::size_t>(hosts * per_host));
  {
    std::vector<std::jthread> threads;
    for (int r = 0; r < hosts * per_host; ++r) {
      threads.emplace_back([&, r] {
        auto& w = *world[static_cast<std::size_t>(r)];
        auto& in = *intra[static_cast<std::size_t>(r / per_host)][static_cast<std::size_t>(r % per_host)];
        try {
          fn(w, in);
        } catch (...) {
          errors[static_cast<std::size_t>(r)] = std::current_exception();
          w.abort("rank " + std::to_string(r) + " failed", r);
          in.abort("rank " + std::to_string(r) + " failed", r % per_host);
        }
      });
    }
  }
  if (auto first = detail::root_cause(errors)) std::rethrow_exception(first);
}

// Sets every parameter of a toy model from a flat copy (what a checkpoint restores).
template <class T, bool N>
void set_values(toy_mlp<T, N>& m, const std::vector<T>& flat) {
  std::size_t off = 0;
  for (auto& p : m.parameters()) {
    std::copy(flat.begin() + static_cast<std::ptrdiff_t>(off),
              flat.begin() + static_cast<std::ptrdiff_t>(off + p.values().size()), p.values().begin());
    off += p.values().size();
  }
}

}  // namespace partrain::testing
