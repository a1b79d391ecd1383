// partrain_consolidate, the command-line tool around consolidate_sharded_checkpoint: a ZeRO
// checkpoint saved by 3 ranks becomes one file that load_checkpoint reads into a replicated model
// and optimizer, equal to loading the sharded one; bad arguments and a missing index are refused
// with the reason, and OUT may not overwrite the checkpoint it reads.
#include <catch2/catch.hpp>

#include <partrain/comm/local.hpp>
#include <partrain/optim/adamw.hpp>
#include <partrain/parallel/zero.hpp>
#include <partrain/train/checkpoint.hpp>
#include <partrain/train/sharded_checkpoint.hpp>

#include <sys/wait.h>

#include <cstdio>
#include <filesystem>
#include <string>
#include <utility>

#include "temp_dir.hpp"
#include "toy_models.hpp"

using namespace partrain;
using partrain::testing::make_toy_batch;
using partrain::testing::toy_mlp;

namespace {

// The tool's exit status and everything it printed.
std::pair<int, std::string> consolidate(const std::string& args) {
  const std::string cmd = std::string(CONSOLIDATE_EXE) + " " + args + " 2>&1";
  FILE* p = ::popen(cmd.c_str(), "r");
  REQUIRE(p != nullptr);
  std::string out;
  char buf[512];
  while (std::fgets(buf, sizeof buf, p)) out += buf;
  const int status = ::pclose(p);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

std::string quoted(const std::filesystem::path& p) { return "'" + p.string() + "'"; }

}  // namespace

TEST_CASE("partrain_consolidate writes one checkpoint equal to the sharded one", "[tools][checkpoint]") {
  partrain::testing::temp_dir dir;
  const auto ck = dir.path / "run" / "model.ckpt";
  run_local(3, [&](local_group& g) {
    toy_mlp<float> m(7);
    sharded_data_parallel zero(m, g, adamw_options{.lr = 0.01}, {.stage = 2});
    for (int s = 0; s < 3; ++s) zero.train_step(make_toy_batch<float>(static_cast<std::size_t>(s * 12 + g.rank() * 4), 4));
    save_sharded_checkpoint(zero, ck, {.epoch = 2, .step = 3});
  });
  const auto whole = dir.path / "whole.ckpt";
  const auto [rc, out] = consolidate(quoted(ck) + " " + quoted(whole));
  INFO(out);
  REQUIRE(rc == 0);
  CHECK_THAT(out, Catch::Contains("adamw state, saved by 3 rank(s) at epoch 2 step 3"));

  toy_mlp<float> from_shards(11), from_file(13);
  adamw a(from_shards, {.lr = 0.01}), b(from_file, {.lr = 0.01});
  (void)load_sharded_checkpoint(ck, from_shards, a);
  const auto extra = load_checkpoint(whole, from_file, b);
  CHECK(extra.step == 3u);
  CHECK(extra.epoch == 2u);
  CHECK(from_file.flat_values() == from_shards.flat_values());
  CHECK(b.steps() == a.steps());
  // Both optimizers go on alike: their state came over too.
  const auto batch = make_toy_batch<float>(100, 12);
  from_shards.train_step(batch);
  from_file.train_step(batch);
  a.step();
  b.step();
  CHECK(from_file.flat_values() == from_shards.flat_values());
}

TEST_CASE("partrain_consolidate refuses bad arguments, a missing index and overwriting its input", "[tools][checkpoint]") {
  partrain::testing::temp_dir dir;
  {
    const auto [rc, out] = consolidate("");
    CHECK(rc == 2);
    CHECK_THAT(out, Catch::Contains("expected 2 arguments (INDEX OUT), got 0") && Catch::Contains("usage:"));
  }
  {
    const auto [rc, out] = consolidate("--help");
    CHECK(rc == 0);
    CHECK_THAT(out, Catch::StartsWith("usage: partrain_consolidate INDEX OUT"));
  }
  {
    const auto [rc, out] = consolidate(quoted(dir.path / "nothing.ckpt") + " " + quoted(dir.path / "out.ckpt"));
    CHECK(rc == 1);
    CHECK_THAT(out, Catch::Contains("nothing.ckpt"));
    CHECK_FALSE(std::filesystem::exists(dir.path / "out.ckpt"));
  }
  const auto ck = dir.path / "model.ckpt";
  run_local(2, [&](local_group& g) {
    toy_mlp<float> m(7);
    sharded_data_parallel zero(m, g, adamw_options{.lr = 0.01});
    save_sharded_checkpoint(zero, ck, {.step = 1});
  });
  const auto size = std::filesystem::file_size(ck);
  {
    const auto [rc, out] = consolidate(quoted(ck) + " " + quoted(ck));
    CHECK(rc == 2);
    CHECK_THAT(out, Catch::Contains("is the index itself"));
  }
  {
    const auto [rc, out] = consolidate(quoted(ck) + " " + quoted(dir.path / "model.ckpt.step-1.shard-1-of-2"));
    CHECK(rc == 2);
    CHECK_THAT(out, Catch::Contains("is one of the checkpoint's shards"));
  }
  CHECK(std::filesystem::file_size(ck) == size);
}
