// Sharded data parallel on the mpi backend, run by ctest under `mpirun -np N` (every rank runs
// every test case in order, as an MPI program does): ZeRO-1/2 and FSDP equal one process on the
// global batch, and a sharded checkpoint written by the N ranks resumes bit for bit.
#include <catch2/catch.hpp>

#include <partrain/comm/mpi.hpp>
#include <partrain/optim/adamw.hpp>
#include <partrain/optim/clip.hpp>
#include <partrain/parallel/fsdp.hpp>
#include <partrain/parallel/zero.hpp>
#include <partrain/train/sharded_checkpoint.hpp>

#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <string>
#include <system_error>
#include <vector>

#include "pipeline_layers.hpp"
#include "toy_models.hpp"

using namespace partrain;
using namespace std::chrono_literals;
using partrain::test::host_model;
using partrain::test::make_mlp;
using partrain::test::reference_step;
using partrain::test::softmax_cross_entropy;
using partrain::test::synthetic_batch;
using partrain::testing::make_toy_batch;
using partrain::testing::toy_mlp;

namespace {

mpi_group& world() {
  static mpi_group g(process_group_options{.timeout = 60s});
  return g;
}

constexpr std::size_t per_rank = 4;
constexpr int steps = 6;

std::vector<float> zero_reference(int n) {
  toy_mlp<float, false> m(7);
  adamw opt(m, {.lr = 0.01});
  for (int s = 0; s < steps; ++s) {
    m.train_step(make_toy_batch<float>(static_cast<std::size_t>(s * n) * per_rank, per_rank * static_cast<std::size_t>(n)));
    (void)clip_grad_norm(m, 0.05);
    opt.step();
  }
  return m.flat_values();
}

// Steps [from, to) of ZeRO-2 over the world, loading and saving a checkpoint when given.
std::vector<float> zero_steps(int from, int to, const std::filesystem::path& load = {}, const std::filesystem::path& save = {}) {
  auto& g = world();
  toy_mlp<float> m(7 + static_cast<std::uint64_t>(g.rank()));  // the broadcast (or the load) makes them equal
  sharded_data_parallel zero(m, g, adamw_options{.lr = 0.01}, {.stage = 2, .bucket_cap_bytes = 20, .max_grad_norm = 0.05});
  if (!load.empty()) (void)load_sharded_checkpoint(zero, load);
  for (int s = from; s < to; ++s) {
    zero.train_step(make_toy_batch<float>(static_cast<std::size_t>(s * g.size() + g.rank()) * per_rank, per_rank));
  }
  if (!save.empty()) save_sharded_checkpoint(zero, save, {.step = static_cast<std::uint64_t>(to)});
  return m.flat_values();
}

// A folder every rank names alike: rank 0's pid, shared through an all_reduce.
std::filesystem::path shared_dir() {
  auto& g = world();
  std::vector<std::int64_t> pid{g.rank() == 0 ? static_cast<std::int64_t>(::getpid()) : 0};
  g.all_reduce(tensor_view<std::int64_t>(pid.data(), 1), reduce_op::sum).wait();
  return std::filesystem::temp_directory_path() / ("partrain_sharding_mpi_" + std::to_string(pid[0]));
}

}  // namespace

TEST_CASE("mpi: ZeRO-1 and ZeRO-2 equal one process on the global batch", "[parallel][zero][mpi]") {
  auto& g = world();
  const auto want = zero_reference(g.size());
  for (int stage : {1, 2}) {
    CAPTURE(g.rank(), g.size(), stage);
    toy_mlp<float> m(7 + static_cast<std::uint64_t>(g.rank()));
    sharded_data_parallel zero(m, g, adamw_options{.lr = 0.01}, {.stage = stage, .bucket_cap_bytes = 20, .max_grad_norm = 0.05});
    for (int s = 0; s < steps; ++s) {
      zero.train_step(make_toy_batch<float>(static_cast<std::size_t>(s * g.size() + g.rank()) * per_rank, per_rank));
    }
    const auto got = m.flat_values();
    REQUIRE(got.size() == want.size());
    for (std::size_t i = 0; i < got.size(); ++i) CHECK(got[i] == Approx(want[i]).epsilon(1e-4).margin(1e-6));
  }
}

TEST_CASE("mpi: FSDP equals one process on the global batch", "[parallel][fsdp][mpi]") {
  auto& g = world();
  const std::vector<std::size_t> widths{6, 5, 3, 2, 3};
  const auto rows = per_rank * static_cast<std::size_t>(g.size());
  const auto batch_of = [&](int s) { return synthetic_batch(rows, widths.front(), 3, 1000 + static_cast<std::uint32_t>(s)); };
  host_model ref = make_mlp(widths, 11);
  for (int s = 0; s < steps; ++s) {
    const auto b = batch_of(s);
    (void)reference_step(ref, softmax_cross_entropy{}, b.input(), b.labels());
    partrain::test::sgd_step(ref, 0.1f);
  }
  host_model layers = make_mlp(widths, 11 + static_cast<std::uint32_t>(g.rank()) * 100);
  fully_sharded_data_parallel f(layers, g, softmax_cross_entropy{}, sgd_options{.lr = 0.1});
  const auto r = static_cast<std::size_t>(g.rank());
  for (int s = 0; s < steps; ++s) {
    const auto b = batch_of(s);
    (void)f.train_step(b.input().slice(r * per_rank, (r + 1) * per_rank), b.labels().slice(r * per_rank, (r + 1) * per_rank));
  }
  auto full = f.summon_full_params();
  std::vector<float> got, want;
  for (auto&& p : full.parameters()) got.insert(got.end(), p.value().begin(), p.value().end());
  for (auto& l : ref) {
    for (auto& p : l->parameters()) want.insert(want.end(), p.value().begin(), p.value().end());
  }
  CAPTURE(g.rank(), g.size());
  REQUIRE(got.size() == want.size());
  for (std::size_t i = 0; i < got.size(); ++i) CHECK(got[i] == Approx(want[i]).epsilon(1e-4).margin(1e-6));
}

TEST_CASE("mpi: a sharded checkpoint written by every rank resumes bit for bit", "[parallel][zero][mpi][checkpoint]") {
  const auto dir = shared_dir();
  const auto ck = dir / "zero.ckpt";
  const auto straight = zero_steps(0, steps);
  (void)zero_steps(0, 3, {}, ck);
  const auto resumed = zero_steps(3, steps, ck);
  CAPTURE(world().rank(), world().size());
  CHECK(resumed == straight);
  world().barrier().wait();  // every rank has read the files
  if (world().rank() == 0) {
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
  }
}
