// partrain/parallel/ddp_stats.hpp: what DDP measured: its bucket layout, and per step how long
// gradient communication ran and how much of it the caller did not wait for (hidden by overlap).
#pragma once

#include <algorithm>
#include <cstddef>
#include <vector>

#include <partrain/parallel/detail/buckets.hpp>

namespace partrain::inline v0 {

struct ddp_stats {
  std::vector<ddp_bucket_info> buckets;  // in reduction order
  std::size_t steps = 0;                 // train_step calls on this rank
  std::size_t synced_steps = 0;          // steps that reduced gradients (not inside no_sync)
  std::size_t shadow_steps = 0;          // steps a joined rank shadowed for the others
  // Buckets reduced in the model's own gradient memory (no copy in or out; PyTorch's
  // gradient_as_bucket_view), and those copied through DDP's bucket buffers.
  std::size_t in_place_buckets = 0;
  std::size_t copied_buckets = 0;
  // Last synced step: from the first bucket's launch to the last bucket's completion, and how
  // long train_step blocked waiting for it after the model's step returned.
  double last_comm_s = 0;
  double last_wait_s = 0;
  // Totals over synced steps; hidden = Σ max(0, comm - wait).
  double comm_s = 0;
  double wait_s = 0;
  double hidden_s = 0;

  [[nodiscard]] double hidden_fraction() const noexcept { return comm_s > 0 ? hidden_s / comm_s : 0.0; }
  void reset_timing() noexcept {
    steps = synced_steps = shadow_steps = in_place_buckets = copied_buckets = 0;
    last_comm_s = last_wait_s = comm_s = wait_s = hidden_s = 0;
  }
  void record(double comm, double wait) noexcept {
    last_comm_s = comm;
    last_wait_s = wait;
    comm_s += comm;
    wait_s += wait;
    hidden_s += std::max(0.0, comm - wait);
  }
};

}  // namespace partrain::inline v0
