// Sharded data parallel under fit() (zero_policy) and its sharded checkpoints: fit trains like
// DDP; a checkpoint saved at world size 3 resumes at 3 bit for bit and at 2 and 4 within float
// tolerance; another model, a missing shard, shards of two saves and a corrupted shard are
// refused naming the file; files of format version 1 (one slice per shard) still load; 16-bit
// parameters keep their fp32 masters sharded, and their checkpoints save those masters.
#include <catch2/catch.hpp>

#include <partrain/comm/local.hpp>
#include <partrain/core/half.hpp>
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
  SECTION("through the single-file reader, which says what the file is and what reads it") {
    toy_mlp<float> m(7);
    adamw opt(m, {.lr = 0.01});
    CHECK_THROWS_WITH(load_checkpoint(ck, m, opt), Catch::Contains("is the index of a sharded checkpoint") &&
                                                      Catch::Contains("load_sharded_checkpoint") &&
                                                      !Catch::Contains("bad magic"));
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
// where versions 2 and 3 write a count and the slices (3 also ends the index with the model's
// buffers, none here). The rest of every file is unchanged.
void rewrite_as_version_1(const std::filesystem::path& index) {
  namespace ck = partrain::detail::zero_ckpt;
  namespace pd = partrain::detail;
  auto x = ck::read_index(index, "index");
  for (auto& e : x.shards) {
    REQUIRE(e.segments.size() == 1);
    const auto path = index.parent_path() / e.file;
    const auto bytes = file_bytes(path);
    const auto payload = pd::ckpt::unframe(bytes, shard_file_magic, sharded_checkpoint_version, "shard");
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

// Sharded data parallel with 16-bit parameters: the model holds only bfloat16 values and
// gradients, each rank keeps the fp32 masters of its own elements. Checked against one process
// that keeps every master in fp32 and rounds what the model computes with, at world sizes 1-4,
// both partitions and both stages; the memory and the bytes per step; sharded checkpoints that
// save the masters (not the rounded values) and resume at another world size.
namespace masters16 {

using partrain::testing::toy_batch;
using partrain::testing::toy_param;
using partrain::testing::toy_rng;

constexpr std::size_t in = 6, out = 3, per_rank = 4;
const sgd_options sgd_momentum{.lr = 0.05, .momentum = 0.9, .weight_decay = 1e-3};

float round16(float x) { return static_cast<float>(bfloat16(x)); }

// y = W x + b, loss = mean over rows of 0.5 ||y - t||²; parameters stored as S (bfloat16: the
// model holds nothing wider), arithmetic in float. Reports the bias, then the weight, final.
template <class S>
struct toy_linear {
  std::vector<toy_param<S>> ps;
  explicit toy_linear(std::uint64_t seed) {
    ps.emplace_back("fc.weight", shape{out, in});
    ps.emplace_back("fc.bias", shape{out});
    toy_rng r(seed);
    for (auto& p : ps) {
      for (auto& v : p.values()) v = S(round16(static_cast<float>(0.5 * r.uniform())));
    }
  }
  std::vector<toy_param<S>>& parameters() { return ps; }
  double train_step(const toy_batch<float>& b) { return run(b, nullptr); }
  double train_step(const toy_batch<float>& b, const grad_ready_fn& ready) { return run(b, &ready); }

  double run(const toy_batch<float>& b, const grad_ready_fn* ready) {
    const auto& w = ps[0].values();
    const auto& bias = ps[1].values();
    std::vector<float> gw(out * in, 0.0f), gb(out, 0.0f);
    double loss = 0;
    const float inv = 1.0f / static_cast<float>(b.n);
    for (std::size_t s = 0; s < b.n; ++s) {
      for (std::size_t k = 0; k < out; ++k) {
        float y = static_cast<float>(bias[k]);
        for (std::size_t j = 0; j < in; ++j) y += static_cast<float>(w[k * in + j]) * b.x[s * in + j];
        const float d = y - b.y[s * out + k];
        loss += 0.5 * static_cast<double>(d) * static_cast<double>(d);
        gb[k] += d * inv;
        for (std::size_t j = 0; j < in; ++j) gw[k * in + j] += d * inv * b.x[s * in + j];
      }
    }
    for (std::size_t k = 0; k < out; ++k) ps[1].grads()[k] = S(gb[k]);
    if (ready) (*ready)(1);
    for (std::size_t i = 0; i < gw.size(); ++i) ps[0].grads()[i] = S(gw[i]);
    if (ready) (*ready)(0);
    return loss / static_cast<double>(b.n);
  }
  [[nodiscard]] std::vector<float> flat() {
    std::vector<float> v;
    for (auto& p : ps) {
      for (auto x : p.values()) v.push_back(static_cast<float>(x));
    }
    return v;
  }
};

toy_batch<float> rank_batch(int step, int world, int rank) {
  return make_toy_batch<float>(static_cast<std::size_t>(step * world + rank) * per_rank, per_rank, in, out);
}

// One process: fp32 masters; every rank's gradient computed with the masters rounded to bf16,
// rounded to bf16 as the model stores it, divided by the world size and summed in rank order.
// Step s runs at world size worlds[s].
std::vector<float> reference(const std::vector<int>& worlds) {
  toy_linear<float> master(7);
  sgd opt(master, sgd_momentum);
  for (int s = 0; s < static_cast<int>(worlds.size()); ++s) {
    const int world = worlds[static_cast<std::size_t>(s)];
    std::vector<float> sum(in * out + out, 0.0f);
    for (int r = 0; r < world; ++r) {
      toy_linear<float> copy(7);
      for (std::size_t p = 0; p < 2; ++p) {
        for (std::size_t i = 0; i < copy.ps[p].values().size(); ++i) copy.ps[p].values()[i] = round16(master.ps[p].values()[i]);
      }
      copy.train_step(rank_batch(s, world, r));
      std::size_t at = 0;
      for (auto& p : copy.ps) {
        for (float g : p.grads()) {
          sum[at] = r == 0 ? round16(g) / static_cast<float>(world) : sum[at] + round16(g) / static_cast<float>(world);
          ++at;
        }
      }
    }
    std::size_t at = 0;
    for (auto& p : master.ps) {
      for (float& g : p.grads()) g = sum[at++];
    }
    opt.step();
  }
  return master.flat();
}

struct rank_out {
  std::vector<float> model;    // the bf16 values the model holds, widened
  std::vector<float> masters;  // this rank's masters over flat_segments(rank)
  std::vector<detail::zero::flat_range> segments;
  sharded_memory mem{};
  std::uint64_t bytes_per_step = 0;
  std::size_t padding = 0;
};

// Steps [from, to) at `world`, loading `load` first and saving to `save` after when given.
std::vector<rank_out> zero16_run(int world, int from, int to, zero_options o, const std::filesystem::path& load = {},
                                 const std::filesystem::path& save = {}) {
  std::vector<rank_out> outs(static_cast<std::size_t>(world));
  run_local(world, [&](local_group& g) {
    toy_linear<bfloat16> m(load.empty() ? 7 : 99);  // a load replaces the values
    sharded_data_parallel zero(m, g, sgd_momentum, o);
    if (!load.empty()) (void)load_sharded_checkpoint(zero, load);
    g.reset_traffic();
    for (int s = from; s < to; ++s) zero.train_step(rank_batch(s, world, g.rank()));
    auto& r = outs[static_cast<std::size_t>(g.rank())];
    r.bytes_per_step = to > from ? g.traffic().bytes_sent / static_cast<std::uint64_t>(to - from) : 0;
    if (!save.empty()) save_sharded_checkpoint(zero, save, {.step = static_cast<std::uint64_t>(to)});
    r.model = m.flat();
    r.masters = zero.master_values();
    r.segments = zero.flat_segments(static_cast<std::size_t>(g.rank()));
    r.mem = zero.memory();
  });
  return outs;
}

// Every rank's masters equal the reference's over its segments (within rel), and every rank's
// model holds the reference rounded to bf16.
void check_against(const std::vector<rank_out>& got, const std::vector<float>& want, double rel = 1e-6) {
  std::size_t covered = 0;
  for (const auto& r : got) {
    REQUIRE(r.model.size() == want.size());
    for (std::size_t i = 0; i < want.size(); ++i) {
      CAPTURE(i);
      CHECK(r.model[i] == Approx(round16(want[i])).epsilon(1e-2 + rel).margin(1e-6 + rel));
    }
    std::size_t at = 0;
    for (const auto& seg : r.segments) {
      for (std::size_t i = seg.begin; i < seg.end; ++i) {
        CAPTURE(i);
        CHECK(r.masters.at(at++) == Approx(want[i]).epsilon(rel).margin(rel / 10));
      }
      covered += seg.size();
    }
    CHECK(at == r.masters.size());
  }
  CHECK(covered == want.size());  // the ranks' masters together: every element once
}


TEST_CASE("zero with bf16 parameters: fp32 masters sharded, equal to one process keeping them whole",
          "[parallel][zero][masters]") {
  for (int world = 1; world <= 4; ++world) {
    const auto want = reference(std::vector<int>(6, world));
    for (const auto partition : {zero_partition::per_bucket, zero_partition::contiguous}) {
      for (int stage : {1, 2}) {
        CAPTURE(world, static_cast<int>(partition), stage);
        // 32-byte buckets: several of them, launched in backward per bucket. Gradients reduced
        // in fp32: the reference's numbers.
        const zero_options o{.stage = stage, .partition = partition, .bucket_cap_bytes = 32, .first_bucket_bytes = 32,
                             .fp32_reduce = true};
        const auto got = zero16_run(world, 0, 6, o);
        check_against(got, want);
        for (const auto& r : got) CHECK(r.model == got[0].model);
        // Memory: 2 bytes per parameter in the model, 4 per owned element of masters.
        const auto& m = got[0].mem;
        CHECK(m.parameter_bytes == 21 * sizeof(bfloat16));
        CHECK(m.master_bytes == m.shard_elements * sizeof(float));
        CHECK(m.optimizer_state_bytes == m.shard_elements * sizeof(float));  // momentum, fp32
        // Bytes: the reduce_scatter in fp32, the all_gather in bf16, of the padded space.
        const auto n = static_cast<std::uint64_t>(world);
        const std::uint64_t padded = 21 + m.padding_elements;
        CHECK(got[0].bytes_per_step == (n - 1) * padded / n * (sizeof(float) + sizeof(bfloat16)));

        // The default: reduced in bf16, half the reduce_scatter's bytes (DDP's on a bf16 model),
        // the sums rounded to bf16.
        auto o16 = o;
        o16.fp32_reduce = false;
        const auto got16 = zero16_run(world, 0, 6, o16);
        check_against(got16, want, 1e-2);
        for (const auto& r : got16) CHECK(r.model == got16[0].model);
        const std::uint64_t padded16 = 21 + got16[0].mem.padding_elements;
        CHECK(got16[0].bytes_per_step == (n - 1) * padded16 / n * (2 * sizeof(bfloat16)));
      }
    }
  }
}

TEST_CASE("zero with bf16 parameters: checkpoints save the fp32 masters and reshard", "[parallel][zero][masters][checkpoint]") {
  partrain::testing::temp_dir dir;
  const auto ck = dir.path / "bf16.ckpt";
  const zero_options o{.bucket_cap_bytes = 32, .first_bucket_bytes = 32, .fp32_reduce = true};
  const auto straight = zero16_run(3, 0, 6, o);
  (void)zero16_run(3, 0, 3, o, {}, ck);
  // The same world: the same bytes, masters included (rounded values would lose them).
  const auto same = zero16_run(3, 3, 6, o, ck);
  for (std::size_t r = 0; r < 3; ++r) {
    CHECK(same[r].masters == straight[r].masters);
    CHECK(same[r].model == straight[r].model);
  }
  // Other world sizes and the other partition: the masters resume exactly, the sums regroup.
  for (int world : {1, 2, 4}) {
    for (const auto partition : {zero_partition::per_bucket, zero_partition::contiguous}) {
      CAPTURE(world, static_cast<int>(partition));
      zero_options p = o;
      p.partition = partition;
      const auto got = zero16_run(world, 3, 6, p, ck);
      // Three steps at world 3, then three at this world (each rank its own batch).
      check_against(got, reference({3, 3, 3, world, world, world}));
    }
  }
  SECTION("the checkpoint holds fp32 values: consolidated, they are the masters") {
    const auto whole = dir.path / "whole.ckpt";
    consolidate_sharded_checkpoint(ck, whole);
    CHECK(std::filesystem::exists(whole));
    // Resumed from it at world 1, the masters are what the three ranks held.
    const auto one = zero16_run(1, 3, 3, o, ck);
    std::vector<float> all(21);
    const auto at3 = zero16_run(3, 3, 3, o, ck);
    for (const auto& r : at3) {
      std::size_t at = 0;
      for (const auto& seg : r.segments) {
        for (std::size_t i = seg.begin; i < seg.end; ++i) all[i] = r.masters[at++];
      }
    }
    CHECK(one[0].masters == all);
    bool any_finer = false;  // some master is not a bf16 value: the file kept more than the model
    for (float x : all) any_finer = any_finer || x != round16(x);
    CHECK(any_finer);
  }
}

}  // namespace masters16
