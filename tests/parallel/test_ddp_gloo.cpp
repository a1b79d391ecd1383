// DDP across processes: forked ranks, each with a gloo_group over a file store.
#include <catch2/catch.hpp>

#include "temp_dir.hpp"

#include <partrain/comm/gloo.hpp>
#include <partrain/launch/spawn.hpp>
#include <partrain/optim/sgd.hpp>
#include <partrain/parallel/ddp.hpp>
#include <partrain/rendezvous/file_store.hpp>
#include <partrain/rendezvous/init.hpp>

#include <atomic>
#include <chrono>
#include <cstring>
#include <thread>
#include <filesystem>
#include <fstream>
#include <string>
#include <unistd.h>
#include <vector>

#include "fork_ranks.hpp"
#include "gloo_ranks.hpp"
#include "toy_models.hpp"

using namespace partrain;
using namespace std::chrono_literals;
using partrain::testing::make_toy_batch;
using partrain::testing::toy_mlp;
namespace fs = std::filesystem;

using partrain::testing::run_gloo;

namespace {

struct temp_dir : partrain::testing::temp_dir {
  temp_dir() : partrain::testing::temp_dir("partrain_ddp_gloo") {}
};

const sgd_options opt_options{.lr = 0.05, .momentum = 0.9, .weight_decay = 1e-3};
constexpr std::size_t per_rank = 4;

std::vector<float> reference_run(int world, int steps) {
  toy_mlp<float, false> m(7);
  sgd opt(m, opt_options);
  for (int s = 0; s < steps; ++s) {
    m.train_step(make_toy_batch<float>(static_cast<std::size_t>(s * world) * per_rank, per_rank * static_cast<std::size_t>(world)));
    opt.step();
  }
  return m.flat_values();
}

}  // namespace

TEST_CASE("ddp gloo processes: N ranks on batch b equal one process on batch N*b", "[parallel][ddp][gloo][processes]") {
  for (int world : {1, 2, 4}) {
    CAPTURE(world);
    const auto got = run_gloo(world, [world](gloo_group& g, std::vector<float>& out) {
      toy_mlp<float> m(7 + static_cast<std::uint64_t>(g.rank()));
      distributed_data_parallel ddp(m, g, {.bucket_cap_bytes = 64, .first_bucket_bytes = 16});
      sgd opt(m, opt_options);
      for (int s = 0; s < 20; ++s) {
        ddp.train_step(make_toy_batch<float>(static_cast<std::size_t>(s * world + g.rank()) * per_rank, per_rank));
        opt.step();
      }
      out = m.flat_values();
    });
    const auto ref = reference_run(world, 20);
    for (const auto& r : got) {
      REQUIRE(r.size() == ref.size());
      CHECK(r == got[0]);
      for (std::size_t i = 0; i < r.size(); ++i) CHECK(r[i] == Approx(ref[i]).epsilon(1e-5).margin(1e-6));
    }
  }
}

TEST_CASE("ddp gloo processes: join with uneven batches finishes with equal parameters", "[parallel][ddp][gloo][processes][join]") {
  const auto got = run_gloo(3, [](gloo_group& g, std::vector<float>& out) {
    toy_mlp<float> m(7);
    distributed_data_parallel ddp(m, g, {.join = true});
    sgd opt(m, opt_options);
    for (int s = 0; s < 2 + g.rank(); ++s) {
      ddp.train_step(make_toy_batch<float>(static_cast<std::size_t>(s * 3 + g.rank()) * per_rank, per_rank));
      opt.step();
    }
    ddp.join();
    out = m.flat_values();
  });
  CHECK(got[0] == got[2]);
  CHECK(got[1] == got[2]);
}

TEST_CASE("ddp gloo processes: without join, a rank that stops early gives a timeout naming join", "[parallel][ddp][gloo][processes][join]") {
  std::vector<partrain::testing::rank_outcome> outcomes;
  run_gloo(
      2,
      [](gloo_group& g, std::vector<float>&) {
        toy_mlp<float> m(7);
        distributed_data_parallel ddp(m, g);
        for (int s = 0; s < (g.rank() == 0 ? 3 : 2); ++s) ddp.train_step(make_toy_batch<float>(static_cast<std::size_t>(s) * 4, 4));
        if (g.rank() == 1) std::this_thread::sleep_for(3s);  // stay alive: rank 0 must time out, not see a closed socket
      },
      1500ms, &outcomes);
  REQUIRE(!outcomes[0].ok);
  CHECK_THAT(outcomes[0].message, Catch::Contains("rank 0 DDP gradient all_reduce"));
  CHECK_THAT(outcomes[0].message, Catch::Contains("join = true"));
}

TEST_CASE("ddp via spawn + init_process_group(env://, gloo): 2 processes equal one process", "[parallel][ddp][gloo][processes]") {
  temp_dir dir;
  const auto out_dir = dir.path;
  spawn_options so;
  so.timeout = 60s;
  so.echo_output = false;
  (void)spawn(
      2,
      [out_dir](int) {
        init_options io;
        io.backend = "gloo";
        io.timeout = 20s;
        auto pg = init_process_group("env://", io);
        toy_mlp<float> m(7 + static_cast<std::uint64_t>(pg->rank()));
        distributed_data_parallel ddp(m, *pg);
        sgd opt(m, opt_options);
        for (int s = 0; s < 20; ++s) {
          ddp.train_step(make_toy_batch<float>(static_cast<std::size_t>(s * 2 + pg->rank()) * per_rank, per_rank));
          opt.step();
        }
        const auto v = m.flat_values();
        std::ofstream f(out_dir / ("spawn" + std::to_string(pg->rank())), std::ios::binary);
        f.write(reinterpret_cast<const char*>(v.data()), static_cast<std::streamsize>(v.size() * sizeof(float)));
      },
      so);
  const auto ref = reference_run(2, 20);
  for (int r = 0; r < 2; ++r) {
    std::ifstream f(out_dir / ("spawn" + std::to_string(r)), std::ios::binary);
    std::vector<char> bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    std::vector<float> v(bytes.size() / sizeof(float));
    if (!v.empty()) std::memcpy(v.data(), bytes.data(), v.size() * sizeof(float));
    REQUIRE(v.size() == ref.size());
    for (std::size_t i = 0; i < v.size(); ++i) CHECK(v[i] == Approx(ref[i]).epsilon(1e-5).margin(1e-6));
  }
}
