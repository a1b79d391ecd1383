// tests/support/fsdp_device_layers.hpp: a few steps of fully sharded data parallel on the
// example's layered MLP, the same for any layers and communicator: the CPU tier runs it with the
// host layers (models/mlp_layers.hpp) and with the device layers on their host twin
// (models/mlp_layers_device.hpp); the GPU test with the device layers on CUDA over NCCL.
#pragma once

#include <catch2/catch.hpp>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include <partrain/optim/optimizer.hpp>
#include <partrain/parallel/fsdp.hpp>

#include "pipeline_layers.hpp"

namespace partrain::test {

// Layers of 35, 18, 8 and 9 elements: no world size 2-4 divides 35 or 9.
inline const std::vector<std::size_t> fsdp_widths{6, 5, 3, 2, 3};
inline constexpr std::size_t fsdp_rows = 4;
inline constexpr int fsdp_steps = 5;

// The options that change the device path: the defaults; 16-bit gathers and reductions with
// clipping; units of two layers, no prefetch, SHARD_GRAD_OP and AdamW.
struct fsdp_variant {
  const char* name;
  fsdp_options o;
  bool adam = false;
  [[nodiscard]] shard_optimizer_options optimizer() const {
    return adam ? shard_optimizer_options{adamw_options{.lr = 0.01, .weight_decay = 1e-2}}
                : shard_optimizer_options{sgd_options{.lr = 0.1, .momentum = 0.9}};
  }
};
inline std::vector<fsdp_variant> fsdp_variants() {
  return {{"default", {}},
          {"16-bit gathers and reductions, clipping",
           {.max_grad_norm = 0.5, .param_dtype = dtype::bfloat16, .reduce_dtype = dtype::float16}},
          {"units of two layers, no prefetch, SHARD_GRAD_OP, AdamW",
           {.reshard_after_forward = false, .prefetch = false, .min_unit_elements = 40},
           true}};
}

struct fsdp_run {
  std::vector<double> losses;  // this rank's, per synchronizing step
  std::vector<float> values;   // the whole model after the steps (summon_full_params)
  eval_result eval;            // this rank's evaluation batch
  double grad_norm = 0;        // the last step's (NaN without clipping)
  std::size_t units = 0;
};

// One no_sync micro-step, then fsdp_steps steps, each rank on its own batches; to_host(view) copies
// a parameter's values to a std::vector<float>.
template <class Layers, class Loss, class C, class ToHost>
fsdp_run run_fsdp(Layers& layers, Loss loss, C& comm, const shard_optimizer_options& opt, const fsdp_options& o,
                  ToHost&& to_host) {
  const auto rank = static_cast<std::uint32_t>(comm.rank());
  fully_sharded_data_parallel fsdp(layers, comm, std::move(loss), opt, o);
  fsdp_run out;
  const auto classes = static_cast<std::int32_t>(fsdp_widths.back());
  {
    auto guard = fsdp.no_sync();
    const synthetic_batch b(fsdp_rows, fsdp_widths.front(), classes, 900 + rank);
    (void)fsdp.train_step(b.input(), b.labels());
  }
  for (int s = 0; s < fsdp_steps; ++s) {
    const synthetic_batch b(fsdp_rows, fsdp_widths.front(), classes, 100 * static_cast<std::uint32_t>(s) + rank);
    out.losses.push_back(fsdp.train_step(b.input(), b.labels()));
  }
  const synthetic_batch e(fsdp_rows + 1, fsdp_widths.front(), classes, 5000 + rank);
  out.eval = fsdp.eval_step(e.input(), e.labels());
  out.grad_norm = fsdp.last_grad_norm();
  out.units = fsdp.units();
  auto full = fsdp.summon_full_params();
  for (auto& p : full.parameters()) {
    const std::vector<float> v = to_host(p.value());
    out.values.insert(out.values.end(), v.begin(), v.end());
  }
  return out;
}

// a (the device layers' run) against b (the host layers'): close, not bitwise (the GEMMs sum in
// float, a GPU fuses multiply-adds; 16-bit rounding can land on the other side of a tie when the
// sums differ in the last bit); a missing gather, reduction or step is off by far more.
inline void check_same_run(const fsdp_run& a, const fsdp_run& b, const fsdp_variant& v) {
  const double tol = v.o.param_dtype == dtype::float32 ? 1e-5 : 2e-3;
  CHECK(a.units == b.units);
  REQUIRE(a.losses.size() == b.losses.size());
  for (std::size_t i = 0; i < a.losses.size(); ++i) CHECK(a.losses[i] == Approx(b.losses[i]).epsilon(1e-4));
  REQUIRE(a.values.size() == b.values.size());
  for (std::size_t i = 0; i < a.values.size(); ++i) CHECK(a.values[i] == Approx(b.values[i]).margin(tol).epsilon(1e-4));
  CHECK(a.eval.count == b.eval.count);
  CHECK(a.eval.correct == b.eval.correct);
  CHECK(a.eval.loss_sum == Approx(b.eval.loss_sum).epsilon(1e-4));
  CHECK(std::isnan(a.grad_norm) == std::isnan(b.grad_norm));
  if (!std::isnan(b.grad_norm)) CHECK(a.grad_norm == Approx(b.grad_norm).epsilon(1e-4));
}

}  // namespace partrain::test
