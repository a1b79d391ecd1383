// Sharded data parallel under fit() (zero_policy) and its sharded checkpoints: fit trains like
// DDP; a checkpoint saved at world size 3 resumes at 3 bit for bit and at 2 and 4 within float
// tolerance; another model, a missing shard, shards of two saves and a corrupted shard are
// refused naming the file; files of format version 1 (one slice per shard) still load.
#include <catch2/catch.hpp>

#include <partrain/comm/local.hpp>
#include <partrain/optim/adamw.hpp>
#include <partrain/optim/sgd.hpp>
#include <partrain/parallel/ddp.hpp>
#include <partrain/parallel/zero.hpp>
#include <partrain/train/detail/framed_file.hpp>
#include <partrain/train/sharded_checkpoint.hpp>
#include <partrain/train/trainer.hpp>
#include <partrain/train/zero_policy.hpp>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <mutex>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "dp_models.hpp"
#include "temp_dir.hpp"
#include "toy_models.hpp"

using namespace partrain;
using partrain::test::dp_dataset;
using partrain::test::dp_softmax_model;
using partrain::testing::make_toy_batch;
using partrain::testing::toy_mlp;

namespace {

struct batch_list {
  std::vector<batch> batches;
  std::size_t epoch = 0;
  void set_epoch(std::size_t e) { epoch = e; }
  [[nodiscard]] std::size_t size() const noexcept { return batches.size(); }
  [[nodiscard]] auto begin() const { return batches.begin(); }
  [[nodiscard]] auto end() const { return batches.end(); }
};

batch_list shard(const dp_dataset& d, int r, int w) {
  batch_list l;
  for (std::size_t first = static_cast<std::size_t>(r) * 8; first + 8 <= d.size(); first += static_cast<std::size_t>(w) * 8) {
    l.batches.push_back(d.rows(first, 8));
  }
  return l;
}

struct fit_out {
  std::vector<float> values;
  std::uint64_t checksum = 0;
  train_result result;
};

template <class Make>
fit_out run_fit(int ranks, trainer_options base, Make make_policy_and_fit) {
  const dp_dataset data(96, 5, 3);
  fit_out out;
  std::mutex mu;
  run_local(ranks, [&](local_group& g) {
    dp_softmax_model model(5, 3);
    auto train = shard(data, g.rank(), g.size());
    auto test = shard(data, g.rank(), g.size());
    trainer_options o = base;
    std::ostringstream sink;
    o.out = &sink;
    const train_result r = make_policy_and_fit(model, g, train, test, o);
    if (g.rank() == 0) {
      std::lock_guard lock(mu);
      for (auto&& p : model.parameters()) {
        const auto v = p.value();
        out.values.insert(out.values.end(), v.data(), v.data() + v.size());
      }
      out.checksum = parameter_checksum(model);
      out.result = r;
    }
  });
  return out;
}

fit_out fit_ddp(int ranks, trainer_options o) {
  return run_fit(ranks, o, [](auto& model, auto& g, auto& train, auto& test, const trainer_options& opts) {
    distributed_data_parallel ddp(model, g);
    sgd opt(model, {.lr = 0.2, .momentum = 0.9});
    ddp_policy policy(ddp, opt);
    return fit(policy, train, test, opts);
  });
}
fit_out fit_zero(int ranks, trainer_options o, int stage = 2) {
  return run_fit(ranks, o, [stage](auto& model, auto& g, auto& train, auto& test, const trainer_options& opts) {
    sharded_data_parallel zero(model, g, sgd_options{.lr = 0.2, .momentum = 0.9}, {.stage = stage, .bucket_cap_bytes = 16});
    zero_policy policy(zero);
    return fit(policy, train, test, opts);
  });
}

// The toy model on a global batch of 12 samples per step, split evenly over 2, 3 or 4 ranks, so
// runs at different world sizes take the same steps.
constexpr std::size_t global_batch = 12;

auto step_batch(int step, int world, int rank) {
  const std::size_t per = global_batch / static_cast<std::size_t>(world);
  return make_toy_batch<float>(static_cast<std::size_t>(step) * global_batch + static_cast<std::size_t>(rank) * per, per);
}

// Trains steps [from, to) at `world`, optionally loading `load` first and saving to `save` after.
// 96-byte buckets: per bucket, toy_mlp's 53 elements are three buckets (24, 24, 5 elements), so
// each rank owns a range of each; contiguous, one range.
std::vector<float> toy_run(int world, int from, int to, const std::filesystem::path& load = {},
                           const std::filesystem::path& save = {},
                           zero_partition partition = zero_partition::per_bucket) {
  std::vector<float> out;
  std::mutex mu;
  run_local(world, [&](local_group& g) {
    toy_mlp<float> m(7);
    sharded_data_parallel zero(m, g, adamw_options{.lr = 0.01},
                               {.stage = 2, .partition = partition, .bucket_cap_bytes = 96, .first_bucket_bytes = 96});
    if (partition == zero_partition::per_bucket && world > 1 && zero.flat_segments(0).size() != 3) {
      throw std::runtime_error("expected three ranges per rank");
    }
    if (!load.empty() && load_sharded_checkpoint(zero, load).step != static_cast<std::uint64_t>(from)) {
      throw std::runtime_error("the checkpoint is not from step " + std::to_string(from));
    }
    for (int s = from; s < to; ++s) zero.train_step(step_batch(s, world, g.rank()));
    if (!save.empty()) save_sharded_checkpoint(zero, save, {.epoch = 1, .step = static_cast<std::uint64_t>(to)});
    if (g.rank() == 0) {
      std::lock_guard lock(mu);
      out = m.flat_values();
    }
  });
  return out;
}

// Steps [from, to) under plain DDP with a replicated AdamW, resumed from a sharded checkpoint.
std::vector<float> ddp_resume(int world, int from, int to, const std::filesystem::path& load) {
  std::vector<float> out;
  std::mutex mu;
  run_local(world, [&](local_group& g) {
    toy_mlp<float> m(11);  // other initial values: the checkpoint must replace them
    adamw opt(m, {.lr = 0.01});
    const auto extra = load_sharded_checkpoint(load, m, opt);
    if (extra.step != static_cast<std::uint64_t>(from) || opt.steps() != from) {
      throw std::runtime_error("the checkpoint or the optimizer is not at step " + std::to_string(from));
    }
    distributed_data_parallel ddp(m, g);
    for (int s = from; s < to; ++s) {
      ddp.train_step(step_batch(s, world, g.rank()));
      opt.step();
    }
    if (g.rank() == 0) {
      std::lock_guard lock(mu);
      out = m.flat_values();
    }
  });
  return out;
}

std::string load_error(int world, const std::filesystem::path& index, bool other_model = false) {
  std::string msg;
  std::mutex mu;
  try {
    run_local(world, [&](local_group& g) {
      toy_mlp<float> m(7, other_model ? 5 : 6);
      sharded_data_parallel zero(m, g, adamw_options{.lr = 0.01});
      (void)load_sharded_checkpoint(zero, index);
    });
  } catch (const checkpoint_error& e) {
    std::lock_guard lock(mu);
    msg = e.what();
  }
  return msg;
}

}  // namespace

static_assert(training_policy<zero_policy<sharded_data_parallel<dp_softmax_model>>, batch>);
static_assert(checkpointable_policy<zero_policy<sharded_data_parallel<dp_softmax_model>>>);

TEST_CASE("zero_policy: fit trains ZeRO-1 and ZeRO-2 to DDP's parameters and numbers", "[train][zero][threads]") {
  const trainer_options o{.epochs = 2};
  for (int world : {1, 2, 3}) {
    CAPTURE(world);
    const auto ddp = fit_ddp(world, o);
    for (int stage : {1, 2}) {
      CAPTURE(stage);
      const auto z = fit_zero(world, o, stage);
      REQUIRE(z.values.size() == ddp.values.size());
      for (std::size_t i = 0; i < z.values.size(); ++i) CHECK(z.values[i] == Approx(ddp.values[i]).epsilon(1e-5).margin(1e-6));
      CHECK(z.result.test_accuracy == Approx(ddp.result.test_accuracy));
      CHECK(z.result.train_loss == Approx(ddp.result.train_loss).epsilon(1e-5));
    }
  }
}

TEST_CASE("zero_policy: fit resumes a sharded checkpoint bit for bit", "[train][zero][threads]") {
  partrain::testing::temp_dir dir;
  const auto ck = dir.path / "run" / "model.ckpt";
  const trainer_options two{.epochs = 2};
  const auto straight = fit_zero(2, two);
  trainer_options first = two;
  first.checkpoint = ck;
  first.epochs = 1;
  (void)fit_zero(2, first);
  REQUIRE(std::filesystem::exists(ck));
  trainer_options rest = two;
  rest.checkpoint = ck;
  const auto resumed = fit_zero(2, rest);
  CHECK(resumed.result.first_epoch == 1);
  CHECK(resumed.checksum == straight.checksum);
  CHECK(resumed.result.test_accuracy == straight.result.test_accuracy);
  // Only the last save's shards remain beside the index.
  std::size_t shards = 0;
  for (const auto& e : std::filesystem::directory_iterator(ck.parent_path())) {
    shards += e.path().filename().string().find(".shard-") != std::string::npos ? 1 : 0;
  }
  CHECK(shards == 2);
}

TEST_CASE("sharded checkpoint: saved at world 3, resumed at 3 bit for bit and at 2 and 4 (resharded)",
          "[train][zero][checkpoint][threads]") {
  partrain::testing::temp_dir dir;
  const auto ck = dir.path / "toy.ckpt";
  const auto straight = toy_run(3, 0, 8);
  const auto half = toy_run(3, 0, 4, {}, ck);
  CHECK(half != straight);
  CHECK(toy_run(3, 4, 8, ck) == straight);  // same world, same reduction order: the same bytes
  for (int world : {1, 2, 4}) {
    for (const auto partition : {zero_partition::per_bucket, zero_partition::contiguous}) {
      CAPTURE(world, static_cast<int>(partition));
      // Another world sums the ranks' gradients in another grouping: equal to float rounding.
      const auto got = toy_run(world, 4, 8, ck, {}, partition);
      REQUIRE(got.size() == straight.size());
      for (std::size_t i = 0; i < got.size(); ++i) CHECK(got[i] == Approx(straight[i]).epsilon(1e-5).margin(1e-6));
    }
  }
  SECTION("saved contiguous, resumed per bucket at the same world") {
    const auto ck2 = dir.path / "contiguous.ckpt";
    const auto straight2 = toy_run(3, 0, 8, {}, {}, zero_partition::contiguous);
    (void)toy_run(3, 0, 4, {}, ck2, zero_partition::contiguous);
    const auto got = toy_run(3, 4, 8, ck2);
    REQUIRE(got.size() == straight2.size());
    for (std::size_t i = 0; i < got.size(); ++i) CHECK(got[i] == Approx(straight2[i]).epsilon(1e-5).margin(1e-6));
  }
}

TEST_CASE("sharded checkpoint: loads into plain DDP with a replicated optimizer", "[train][zero][checkpoint][threads]") {
  partrain::testing::temp_dir dir;
  const auto ck = dir.path / "toy.ckpt";
  const auto straight = toy_run(3, 0, 8);
  (void)toy_run(3, 0, 4, {}, ck);
  for (int world : {1, 2}) {
    CAPTURE(world);
    const auto got = ddp_resume(world, 4, 8, ck);
    REQUIRE(got.size() == straight.size());
    for (std::size_t i = 0; i < got.size(); ++i) CHECK(got[i] == Approx(straight[i]).epsilon(1e-5).margin(1e-6));
  }
  SECTION("consolidated into one ordinary checkpoint, without the model type") {
    const auto whole = dir.path / "whole.ckpt";
    consolidate_sharded_checkpoint(ck, whole);
    toy_mlp<float> a(11), b(13);
    adamw oa(a, {.lr = 0.01}), ob(b, {.lr = 0.01});
    const auto extra = load_checkpoint(whole, a, oa);  // train/checkpoint.hpp's reader
    CHECK(extra.step == 4);
    CHECK(extra.epoch == 1);
    (void)load_sharded_checkpoint(ck, b, ob);
    CHECK(a.flat_values() == b.flat_values());
    state_writer wa, wb;
    oa.save_state(wa);
    ob.save_state(wb);
    CHECK(wa.bytes() == wb.bytes());
    CHECK(oa.steps() == 4);
  }
  SECTION("into the wrong optimizer kind") {
    toy_mlp<float> m(7);
    sgd opt(m, {.lr = 0.1, .momentum = 0.9});
    CHECK_THROWS_WITH(load_sharded_checkpoint(ck, m, opt),
                      Catch::Contains("holds adamw optimizer state, this run steps with sgd"));
  }
}

TEST_CASE("zero_policy: a grad scaler makes each step amp_step and travels in the checkpoint", "[train][zero][threads]") {
  partrain::testing::temp_dir dir;
  const auto ck = dir.path / "amp.ckpt";
  // Catch's assertions are not thread-safe: the ranks record, the test thread checks.
  std::vector<float> saved_scale(2), loaded_scale(2);
  std::vector<std::size_t> skipped(2);
  std::vector<int> refreshes(2), refreshes_after_load(2), same_values(2), loaded_step(2);
  run_local(2, [&](local_group& g) {
    partrain::testing::scaled_toy_mlp<float> m(7);
    if (g.rank() == 1) m.poison_at = 2;
    sharded_data_parallel zero(m, g, adamw_options{.lr = 0.01});
    grad_scaler scaler({.init_scale = 1024.0f, .growth_interval = 2});
    zero_policy policy(zero, {.scaler = &scaler});
    for (int s = 0; s < 4; ++s) (void)policy.train_step(step_batch(s, 2, g.rank()));
    const auto r = static_cast<std::size_t>(g.rank());
    skipped[r] = policy.skipped_steps();
    saved_scale[r] = scaler.scale();
    refreshes[r] = m.refreshes;
    policy.save_checkpoint(ck, {.step = 4});

    partrain::testing::scaled_toy_mlp<float> m2(9);
    sharded_data_parallel zero2(m2, g, adamw_options{.lr = 0.01});
    grad_scaler fresh({.init_scale = 1.0f});
    zero_policy resumed(zero2, {.scaler = &fresh});
    loaded_step[r] = static_cast<int>(resumed.load_checkpoint(ck).step);
    loaded_scale[r] = fresh.scale();
    same_values[r] = m2.flat_values() == m.flat_values() ? 1 : 0;
    refreshes_after_load[r] = m2.refreshes;
  });
  CHECK(refreshes == std::vector<int>{3, 3});              // 4 steps, 1 skipped
  CHECK(loaded_step == std::vector<int>{4, 4});
  CHECK(same_values == std::vector<int>{1, 1});
  CHECK(refreshes_after_load == std::vector<int>{1, 1});  // the 16-bit copy of the loaded masters
  CHECK(skipped == std::vector<std::size_t>{1, 1});
  // 1024, overflow at step 2 -> 512, two good steps -> 1024.
  CHECK(saved_scale == std::vector<float>{1024.0f, 1024.0f});
  CHECK(loaded_scale == saved_scale);
}

TEST_CASE("sharded checkpoint: bad files are refused, naming the file", "[train][zero][checkpoint][threads]") {
  partrain::testing::temp_dir dir;
  const auto ck = dir.path / "toy.ckpt";
  (void)toy_run(3, 0, 2, {}, ck);
  const auto shard1 = dir.path / "toy.ckpt.step-2.shard-1-of-3";
  REQUIRE(std::filesystem::exists(shard1));

  SECTION("another model") {
    const auto msg = load_error(2, ck, true);
    CHECK_THAT(msg, Catch::Contains("toy.ckpt") && Catch::Contains("was written for another model"));
  }
  SECTION("a missing shard") {
    std::filesystem::remove(shard1);
    const auto msg = load_error(2, ck);
    CHECK_THAT(msg, Catch::Contains("shard-1-of-3") && Catch::Contains("which is missing"));
  }
  SECTION("shards of two different saves") {
    const auto old_copy = dir.path / "old-shard";
    std::filesystem::copy_file(shard1, old_copy);
    (void)toy_run(3, 2, 3, ck, ck);  // a save at step 3 replaces the step-2 shards
    std::filesystem::copy_file(old_copy, dir.path / "toy.ckpt.step-3.shard-1-of-3",
                               std::filesystem::copy_options::overwrite_existing);
    const auto msg = load_error(3, ck);
    CHECK_THAT(msg, Catch::Contains("toy.ckpt.step-3.shard-1-of-3") && Catch::Contains("is from step 2 but the index from step 3"));
  }
  SECTION("a corrupted shard") {
    std::fstream f(shard1, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(40);
    f.put('\x7f');
    f.close();
    const auto msg = load_error(4, ck);
    CHECK_THAT(msg, Catch::Contains("shard-1-of-3") && Catch::Contains("is corrupted"));
  }
  SECTION("no index") {
    const auto msg = load_error(1, dir.path / "nothing.ckpt");
    CHECK_THAT(msg, Catch::Contains("nothing.ckpt"));
  }
}

namespace {

std::vector<std::byte> file_bytes(const std::filesystem::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::vector<char> c((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  std::vector<std::byte> out(c.size());
  std::memcpy(out.data(), c.data(), c.size());
  return out;
}
void write_bytes(const std::filesystem::path& p, const std::vector<std::byte>& b) {
  std::ofstream f(p, std::ios::binary | std::ios::trunc);
  f.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
}

// Rewrites a ZeRO checkpoint as format version 1 wrote it: each shard's one slice as (begin, end)
// where version 2 writes a count and the slices. The rest of every file is unchanged.
void rewrite_as_version_1(const std::filesystem::path& index) {
  namespace ck = partrain::detail::zero_ckpt;
  namespace pd = partrain::detail;
  auto x = ck::read_index(index, "index");
  for (auto& e : x.shards) {
    REQUIRE(e.segments.size() == 1);
    const auto path = index.parent_path() / e.file;
    const auto bytes = file_bytes(path);
    const auto payload = pd::ckpt::unframe(bytes, shard_file_magic, 2u, "shard");
    // dtype, element count, fingerprint, world size, rank | segment count, (begin, end)... | the rest
    const std::size_t fixed = 1 + 4 * 8;
    const std::size_t skip = fixed + 8 + 16;
    std::vector<std::byte> v1(payload.begin(), payload.begin() + static_cast<std::ptrdiff_t>(fixed));
    const auto append = [&v1](std::uint64_t n) {
      const auto* p = reinterpret_cast<const std::byte*>(&n);
      v1.insert(v1.end(), p, p + 8);
    };
    append(e.segments[0].begin);
    append(e.segments[0].end);
    v1.insert(v1.end(), payload.begin() + static_cast<std::ptrdiff_t>(skip), payload.end());
    e.crc = pd::crc32(v1);
    write_bytes(path, pd::ckpt::frame(shard_file_magic, 1, v1));
  }
  state_writer w;
  w.put(x.type);
  w.put(x.total);
  w.put(x.params);
  w.put(x.fingerprint);
  w.put(x.world);
  w.put(x.step);
  w.put_string(x.optimizer);
  for (const auto& e : x.shards) {
    w.put_string(e.file);
    w.put(static_cast<std::uint64_t>(e.segments[0].begin));
    w.put(static_cast<std::uint64_t>(e.segments[0].end));
    w.put(e.crc);
  }
  pd::ckpt::put_extra(w, x.extra);
  for (const auto& n : x.names) {
    w.put_string(n.name);
    w.put(static_cast<std::uint8_t>(n.dims.rank()));
    for (std::size_t d = 0; d < n.dims.rank(); ++d) w.put(static_cast<std::uint64_t>(n.dims[d]));
  }
  write_bytes(index, pd::ckpt::frame(sharded_index_magic, 1, w.bytes()));
}

}  // namespace

TEST_CASE("sharded checkpoint: files of format version 1 still load", "[train][zero][checkpoint][threads]") {
  partrain::testing::temp_dir dir;
  const auto ck = dir.path / "toy.ckpt";
  // Version 1 knew one range per rank: ZeRO's contiguous partition.
  const auto contiguous = zero_partition::contiguous;
  const auto straight = toy_run(3, 0, 4, {}, {}, contiguous);
  (void)toy_run(3, 0, 2, {}, ck, contiguous);
  rewrite_as_version_1(ck);
  std::uint32_t version = 0;
  const auto bytes = file_bytes(ck);
  (void)partrain::detail::ckpt::unframe(bytes, sharded_index_magic, partrain::detail::ckpt::frame_versions{1, 2}, "index", nullptr,
                                  &version);
  REQUIRE(version == 1);
  CHECK(toy_run(3, 2, 4, ck, {}, contiguous) == straight);  // the same world size: bit for bit
  // A reader of version 2 only names both versions.
  CHECK_THROWS_WITH(partrain::detail::ckpt::unframe(bytes, sharded_index_magic, 2u, "index"),
                    Catch::Contains("has format version 1, this build reads version 2"));
}
