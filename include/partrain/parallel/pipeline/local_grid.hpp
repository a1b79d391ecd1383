// partrain/parallel/pipeline/local_grid.hpp: pipeline x data parallel on threads of one process.
// pp x dp threads; thread (stage s, replica j) belongs to two groups, each its own local world:
// the pipeline of replica j (ranks = stages) and the data-parallel group of stage s (ranks =
// replicas). Separate worlds keep the two groups' messages and collectives apart.
#pragma once

#include <exception>
#include <memory>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <partrain/comm/local.hpp>

namespace partrain::inline v0 {

struct grid_rank {
  process_group& pipeline;  // rank() is the stage
  process_group& data;      // rank() is the replica
  [[nodiscard]] int stage() const noexcept { return pipeline.rank(); }
  [[nodiscard]] int replica() const noexcept { return data.rank(); }
};

// Runs fn(grid_rank&) on stages x replicas threads and waits. A failing thread aborts both of
// its groups (their peers stop waiting, and the failure spreads to the other groups the same
// way); the first root-cause error is rethrown.
template <class F>
  requires std::invocable<F&, grid_rank&>
void run_local_grid(int stages, int replicas, F fn, process_group_options opts = {}) {
  if (stages < 1 || replicas < 1) {
    throw config_error("run_local_grid: stages and replicas must be at least 1, got " + std::to_string(stages) + " x " +
                       std::to_string(replicas));
  }
  std::vector<std::vector<std::unique_ptr<local_group>>> pipes, datas;
  for (int j = 0; j < replicas; ++j) pipes.push_back(make_local_world(stages, opts));
  for (int s = 0; s < stages; ++s) datas.push_back(make_local_world(replicas, opts));
  std::vector<std::exception_ptr> errors(static_cast<std::size_t>(stages * replicas));
  {
    std::vector<std::jthread> threads;
    for (int j = 0; j < replicas; ++j) {
      for (int s = 0; s < stages; ++s) {
        threads.emplace_back([&, s, j] {
          auto& pp = *pipes[static_cast<std::size_t>(j)][static_cast<std::size_t>(s)];
          auto& dp = *datas[static_cast<std::size_t>(s)][static_cast<std::size_t>(j)];
          grid_rank g{pp, dp};
          try {
            fn(g);
          } catch (...) {
            errors[static_cast<std::size_t>(j * stages + s)] = std::current_exception();
            const std::string who = "stage " + std::to_string(s) + " of replica " + std::to_string(j) + " failed";
            pp.abort(who, s);  // the origin, as each group numbers its ranks (aborted_error::origin())
            dp.abort(who, j);
          }
        });
      }
    }
  }
  // Prefer the root cause: a rank whose error is not an aborted_error echo of another's.
  if (auto first = detail::root_cause(errors)) std::rethrow_exception(first);
}

}  // namespace partrain::inline v0
