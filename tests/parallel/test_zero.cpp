// Sharded data parallel (ZeRO-1/2) over the local (threads) backend: equivalence with DDP at world
// sizes 1-4 (parameter counts the world size does not divide), SGD with momentum and AdamW,
// clipping, no_sync accumulation; optimizer state per rank; traffic per step against DDP's; the
// shard and bucket arithmetic; bad input.
#include <catch2/catch.hpp>

#include <partrain/comm/local.hpp>
#include <partrain/optim/adamw.hpp>
#include <partrain/optim/sgd.hpp>
#include <partrain/parallel/ddp.hpp>
#include <partrain/parallel/zero.hpp>
#include <partrain/precision/mixed_precision.hpp>
#include <partrain/precision/sharded_amp.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <mutex>
#include <cstddef>
#include <string>
#include <variant>
#include <vector>

#include "toy_models.hpp"

using namespace partrain;
using partrain::testing::make_toy_batch;
using partrain::testing::toy_batch;
using partrain::testing::toy_mlp;
namespace zl = partrain::detail::zero;

namespace {

constexpr int steps = 8;
constexpr std::size_t per_rank = 4;
const sgd_options sgd_momentum{.lr = 0.05, .momentum = 0.9, .weight_decay = 1e-3};
const adamw_options adamw_default{.lr = 0.01, .weight_decay = 1e-2};

// toy_mlp's default shape holds 30 + 5 + 15 + 3 = 53 elements: no world size 2-4 divides it.
// The "even" shape (in 5, hidden 4, out 4) holds 20 + 4 + 16 + 4 = 44: 1, 2 and 4 divide it.
struct shape3 {
  std::size_t in = 6, hidden = 5, out = 3;
};
constexpr shape3 odd_shape{};
constexpr shape3 even_shape{5, 4, 4};

toy_batch<float> rank_batch(int step, int world, int rank, shape3 s, int micro = 0, int micros = 1) {
  const auto index = static_cast<std::size_t>((step * micros + micro) * world + rank);
  return make_toy_batch<float>(index * per_rank, per_rank, s.in, s.out);
}

struct run_config {
  shard_optimizer_options opt = sgd_momentum;
  double max_norm = 0;  // > 0: clip
  int micros = 1;       // > 1: micros - 1 no_sync micro-steps before each synchronizing one
  shape3 shape = odd_shape;
};

struct rank_result {
  std::vector<float> values;
  std::uint64_t bytes_per_step = 0;  // bytes_sent by this rank over the steps / steps
  std::size_t state_bytes = 0;
  std::vector<double> norms;
  sharded_memory mem{};
  std::size_t buckets = 0;
  std::size_t launched_in_backward = 0;  // of the last step
};

toy_mlp<float> make_model(int rank, shape3 s) { return toy_mlp<float>(7 + static_cast<std::uint64_t>(rank), s.in, s.hidden, s.out); }

std::size_t sgd_state_bytes(toy_mlp<float>& m, const sgd_options& s) {
  return s.momentum != 0 ? m.flat_values().size() * sizeof(float) : 0;
}

// DDP with the replicated optimizer (and clip_grad_norm when asked), the reference.
std::vector<rank_result> ddp_run(int world, const run_config& c, ddp_options o = {}) {
  std::vector<rank_result> out(static_cast<std::size_t>(world));
  run_local(world, [&](local_group& g) {
    auto m = make_model(g.rank(), c.shape);
    distributed_data_parallel ddp(m, g, o);
    auto body = [&](auto& opt) {
      g.reset_traffic();
      auto& r = out[static_cast<std::size_t>(g.rank())];
      for (int s = 0; s < steps; ++s) {
        {
          auto guard = ddp.no_sync();
          for (int u = 0; u + 1 < c.micros; ++u) ddp.train_step(rank_batch(s, world, g.rank(), c.shape, u, c.micros));
        }
        ddp.train_step(rank_batch(s, world, g.rank(), c.shape, c.micros - 1, c.micros));
        if (c.max_norm > 0) r.norms.push_back(ddp.clip_grad_norm(c.max_norm));
        opt.step();
      }
      r.bytes_per_step = g.traffic().bytes_sent / steps;
      r.values = m.flat_values();
    };
    if (const auto* s = std::get_if<sgd_options>(&c.opt)) {
      sgd opt(m, *s);
      body(opt);
      out[static_cast<std::size_t>(g.rank())].state_bytes = sgd_state_bytes(m, *s);
    } else {
      adamw opt(m, std::get<adamw_options>(c.opt));
      body(opt);
      out[static_cast<std::size_t>(g.rank())].state_bytes = 2 * m.flat_values().size() * sizeof(float);
    }
  });
  return out;
}

std::vector<rank_result> zero_run(int world, const run_config& c, zero_options o) {
  o.max_grad_norm = c.max_norm;
  std::vector<rank_result> out(static_cast<std::size_t>(world));
  run_local(world, [&](local_group& g) {
    auto m = make_model(g.rank(), c.shape);
    sharded_data_parallel zero(m, g, c.opt, o);
    g.reset_traffic();
    auto& r = out[static_cast<std::size_t>(g.rank())];
    for (int s = 0; s < steps; ++s) {
      {
        auto guard = zero.no_sync();
        for (int u = 0; u + 1 < c.micros; ++u) zero.train_step(rank_batch(s, world, g.rank(), c.shape, u, c.micros));
      }
      zero.train_step(rank_batch(s, world, g.rank(), c.shape, c.micros - 1, c.micros));
      if (c.max_norm > 0) r.norms.push_back(zero.last_grad_norm());
    }
    r.bytes_per_step = g.traffic().bytes_sent / steps;
    r.mem = zero.memory();
    r.state_bytes = r.mem.optimizer_state_bytes;
    r.buckets = zero.buckets();
    r.launched_in_backward = zero.buckets_launched_in_backward();
    r.values = m.flat_values();
  });
  return out;
}

void check_close(const std::vector<float>& got, const std::vector<float>& want, double rel = 1e-5) {
  REQUIRE(got.size() == want.size());
  for (std::size_t i = 0; i < got.size(); ++i) {
    CAPTURE(i);
    CHECK(static_cast<double>(got[i]) == Approx(static_cast<double>(want[i])).epsilon(rel).margin(rel));
  }
}

// Every rank of the ZeRO run holds the same bytes, and they equal DDP's within float tolerance,
// for both partitions (per bucket with the first bucket as small as the others, so that a small
// cap gives several buckets, each launched in backward when overlap is on).
void check_equivalent(int world, const run_config& c, zero_options o) {
  const auto want = ddp_run(world, c);
  for (const auto partition : {zero_partition::contiguous, zero_partition::per_bucket}) {
    CAPTURE(static_cast<int>(partition));
    o.partition = partition;
    o.first_bucket_bytes = std::min(o.first_bucket_bytes, o.bucket_cap_bytes);
    const auto got = zero_run(world, c, o);
    for (const auto& r : got) CHECK(r.values == got[0].values);
    check_close(got[0].values, want[0].values);
    if (c.max_norm > 0) {
      REQUIRE(got[0].norms.size() == want[0].norms.size());
      for (std::size_t s = 0; s < got[0].norms.size(); ++s) CHECK(got[0].norms[s] == Approx(want[0].norms[s]).epsilon(1e-5));
    }
    const bool in_backward = partition == zero_partition::per_bucket && o.overlap;
    CHECK(got[0].launched_in_backward == (in_backward ? got[0].buckets : 0));
  }
}

}  // namespace

// Shard and bucket arithmetic, checked at compile time.
constexpr bool shard_math() {
  // 53 over 4: 13, 13, 13, 14 (floor(r*N/n) cuts); every element owned once.
  const std::size_t n = 53, w = 4;
  std::size_t covered = 0;
  for (std::size_t r = 0; r < w; ++r) {
    const auto s = zl::shard_of(n, w, r);
    if (s.begin != covered) return false;
    if (s.size() != 13 && s.size() != 14) return false;
    covered = s.end;
  }
  if (covered != n) return false;
  // Fewer elements than ranks: some shards are empty, none overlap.
  if (zl::shard_of(2, 4, 0).size() != 0 || zl::shard_of(2, 4, 3).size() != 1) return false;
  return zl::shard_of(0, 3, 2).size() == 0;
}
static_assert(shard_math());

TEST_CASE("zero: layout pads shards to ceil(N/n) and cuts them into equal windows", "[parallel][zero][layout]") {
  const zl::layout l(53, 4, 5);  // L = 14, windows of 5: 5, 5, 4
  CHECK(l.padded_shard() == 14);
  CHECK(l.padded() == 56);
  REQUIRE(l.buckets() == 3);
  CHECK(l.window_size(0) == 5);
  CHECK(l.window_size(2) == 4);
  CHECK(l.bucket_offset(2) == 40);
  // Rank 0's shard is [0, 13): its last window holds 3 real elements and one of padding.
  CHECK(l.real_block(2, 0) == zl::flat_range{10, 13});
  CHECK(l.real_block(2, 3) == zl::flat_range{49, 53});
  std::size_t real = 0;
  for (std::size_t k = 0; k < l.buckets(); ++k) {
    for (std::size_t q = 0; q < 4; ++q) real += l.real_block(k, q).size();
  }
  CHECK(real == 53);

  // pack/unpack through tensors of 3, 0 and 4 elements: a round trip leaves the values, and the
  // padding never reaches a tensor.
  std::vector<float> a{1, 2, 3}, b, c{4, 5, 6, 7};
  zl::flat_views<float> views({tensor_view<float>(a), tensor_view<float>(b.data(), 0), tensor_view<float>(c)});
  const zl::layout small(7, 3, 2);  // shards [0,2) [2,4) [4,7), L = 3, windows 2 and 1
  REQUIRE(small.buckets() == 2);
  std::vector<float> packed(small.padded(), -1.0f);
  for (std::size_t k = 0; k < small.buckets(); ++k) zl::pack_bucket(small, k, views, packed.data() + small.bucket_offset(k), false);
  CHECK(packed == std::vector<float>{1, 2, 3, 4, 5, 6, 0, 0, 7});
  std::vector<float> ones(packed.size(), 9.0f);
  for (std::size_t k = 0; k < small.buckets(); ++k) zl::unpack_bucket(small, k, ones.data() + small.bucket_offset(k), views, 99);
  CHECK(a == std::vector<float>{9, 9, 9});
  CHECK(c == std::vector<float>{9, 9, 9, 9});
}

TEST_CASE("zero: ZeRO-1 and ZeRO-2 equal DDP after k steps with SGD momentum, worlds 1-4", "[parallel][zero][equivalence]") {
  for (int world = 1; world <= 4; ++world) {
    for (int stage : {1, 2}) {
      CAPTURE(world, stage);
      check_equivalent(world, {.opt = sgd_momentum}, {.stage = stage});
      // Buckets of 3 elements per rank: many buckets, both slots in flight, padding in the last.
      check_equivalent(world, {.opt = sgd_options{.lr = 0.05, .momentum = 0.9, .nesterov = true}},
                       {.stage = stage, .bucket_cap_bytes = 3 * sizeof(float) * static_cast<std::size_t>(world)});
    }
  }
}

TEST_CASE("zero: ZeRO-1 and ZeRO-2 equal DDP with AdamW, worlds 1-4", "[parallel][zero][equivalence]") {
  for (int world = 1; world <= 4; ++world) {
    for (int stage : {1, 2}) {
      CAPTURE(world, stage);
      check_equivalent(world, {.opt = adamw_default}, {.stage = stage, .bucket_cap_bytes = 40});
      check_equivalent(world, {.opt = adamw_default}, {.stage = stage, .overlap = false});
    }
  }
}

TEST_CASE("zero: global-norm clipping across shards equals DDP's clip_grad_norm", "[parallel][zero][clip]") {
  for (int world : {1, 2, 3, 4}) {
    for (int stage : {1, 2}) {
      CAPTURE(world, stage);
      // A max norm well below the gradients' norm: every step clips.
      check_equivalent(world, {.opt = sgd_momentum, .max_norm = 0.05}, {.stage = stage, .bucket_cap_bytes = 64});
      check_equivalent(world, {.opt = adamw_default, .max_norm = 0.05}, {.stage = stage});
    }
  }
}

TEST_CASE("zero: no_sync accumulation equals DDP's", "[parallel][zero][no_sync]") {
  for (int world : {1, 2, 3, 4}) {
    for (int stage : {1, 2}) {
      CAPTURE(world, stage);
      check_equivalent(world, {.opt = sgd_momentum, .micros = 3}, {.stage = stage, .bucket_cap_bytes = 48});
      check_equivalent(world, {.opt = adamw_default, .max_norm = 0.05, .micros = 2}, {.stage = stage});
    }
  }
  SECTION("summed instead of averaged, as ddp_options::average_accumulated = false") {
    const run_config c{.opt = sgd_momentum, .micros = 2};
    const auto want = ddp_run(3, c, {.average_accumulated = false});
    const auto got = zero_run(3, c, {.stage = 2, .average_accumulated = false});
    check_close(got[0].values, want[0].values);
  }
}

namespace {

// toy_mlp that records, after each gradient it reports final, how many collectives its group
// issued since its step began.
struct probe_mlp : toy_mlp<float> {
  using toy_mlp<float>::toy_mlp;
  process_group* group = nullptr;
  std::vector<std::uint64_t> calls;
  double train_step(const toy_batch<float>& b) { return toy_mlp<float>::train_step(b); }
  double train_step(const toy_batch<float>& b, const grad_ready_fn& ready) {
    const auto start = group->traffic().calls;
    calls.clear();
    return toy_mlp<float>::train_step(b, [&](std::size_t i) {
      ready(i);
      calls.push_back(group->traffic().calls - start);
    });
  }
};

}  // namespace

TEST_CASE("zero: per bucket, a bucket's reduce_scatter starts in backward once its gradients are final",
          "[parallel][zero][overlap]") {
  // toy_mlp's flat space: fc1.weight [0, 30), fc1.bias [30, 35), fc2.weight [35, 50), fc2.bias
  // [50, 53). A first bucket of 3 elements, then 15: [50, 53) = fc2.bias, [35, 50) = fc2.weight,
  // [20, 35) (fc1's), [5, 20) and [0, 5) (fc1.weight). toy_mlp reports fc2.bias, fc2.weight,
  // fc1.bias, fc1.weight, the output layer's before the hidden layer's backward runs.
  for (const auto partition : {zero_partition::per_bucket, zero_partition::contiguous}) {
    for (int stage : {1, 2}) {
      CAPTURE(static_cast<int>(partition), stage);
      std::vector<std::vector<std::uint64_t>> calls(2);
      std::vector<std::vector<float>> values(2);
      std::vector<double> exposed(2);
      run_local(2, [&](local_group& g) {
        probe_mlp m(7 + static_cast<std::uint64_t>(g.rank()));
        m.group = &g;
        sharded_data_parallel zero(m, g, sgd_momentum,
                                   {.stage = stage, .partition = partition, .bucket_cap_bytes = 60,
                                    .first_bucket_bytes = 12});
        for (int s = 0; s < 3; ++s) zero.train_step(rank_batch(s, 2, g.rank(), odd_shape));
        exposed[static_cast<std::size_t>(g.rank())] = zero.exposed_reduce_seconds();
        calls[static_cast<std::size_t>(g.rank())] = m.calls;
        values[static_cast<std::size_t>(g.rank())] = m.flat_values();
      });
      CHECK(values[0] == values[1]);
      CHECK(exposed[0] > 0);  // the last buckets' launches at least
      if (partition == zero_partition::per_bucket) {
        // fc2's two buckets are on their way while fc1's backward runs; fc1's three wait for
        // fc1.weight.
        CHECK(calls[0] == std::vector<std::uint64_t>{1, 2, 2, 5});
      } else {
        CHECK(calls[0].empty());  // the model's plain train_step: every reduce_scatter after backward
      }
    }
  }
}

TEST_CASE("zero: each rank holds about 1/n of DDP's optimizer state", "[parallel][zero][memory]") {
  // toy_mlp's 53 elements in 32-byte buckets, per bucket: six of 8 elements, then 5.
  const std::vector<std::size_t> bucket_elements{8, 8, 8, 8, 8, 8, 5};
  for (const auto partition : {zero_partition::contiguous, zero_partition::per_bucket}) {
    for (int world = 1; world <= 4; ++world) {
      for (const run_config& c : {run_config{.opt = sgd_momentum}, run_config{.opt = adamw_default}}) {
        CAPTURE(world, static_cast<int>(partition));
        const auto ddp = ddp_run(world, c);
        const zero_options o{.partition = partition, .bucket_cap_bytes = 32, .first_bucket_bytes = 32};
        auto o1 = o;
        o1.stage = 1;
        const auto z2 = zero_run(world, c, o);
        const auto z1 = zero_run(world, c, o1);
        const std::size_t n = ddp[0].values.size();
        const auto w = static_cast<std::size_t>(world);
        const std::size_t per_elem = ddp[0].state_bytes / n;  // 4 (momentum) or 8 (two moments)
        // Elements each rank owns and the most any may own: one balanced share of the whole space
        // (contiguous), or of each bucket (per bucket).
        const auto owned = [&](std::size_t r) {
          if (partition == zero_partition::contiguous) return zl::shard_of(n, w, r).size();
          std::size_t e = 0;
          for (std::size_t b : bucket_elements) e += zl::shard_of(b, w, r).size();
          return e;
        };
        std::size_t most = (n + w - 1) / w, padding = most * w - n;
        if (partition == zero_partition::per_bucket) {
          most = padding = 0;
          for (std::size_t b : bucket_elements) {
            most += (b + w - 1) / w;
            padding += (b + w - 1) / w * w - b;
          }
        }
        std::size_t sum = 0;
        for (std::size_t r = 0; r < w; ++r) {
          const auto& m = z2[r];
          CHECK(m.mem.shard_elements == owned(r));
          CHECK(m.state_bytes == owned(r) * per_elem);
          CHECK(m.state_bytes <= most * per_elem);  // 1/n of DDP's, rounded up per bucket
          CHECK(z1[r].state_bytes == m.state_bytes);
          sum += m.state_bytes;
        }
        CHECK(sum == ddp[0].state_bytes);  // the shards' state together is DDP's, once
        CHECK(z2[0].mem.padding_elements == padding);
        CHECK(z2[0].mem.parameter_bytes == n * sizeof(float));
        if (partition == zero_partition::contiguous) {
          if (world > 1) CHECK(z2[0].mem.gradient_bytes < z1[0].mem.gradient_bytes);  // stage 2 keeps no whole copy
        } else {
          // Both: the reduced share (one window per bucket). Stage 1: every bucket whole, n
          // windows each; stage 2: two slots of the largest bucket's n windows.
          CHECK(z1[0].mem.gradient_bytes == (most + w * most) * sizeof(float));
          CHECK(z2[0].mem.gradient_bytes == (most + 2 * w * ((8 + w - 1) / w)) * sizeof(float));
          if (world > 1) CHECK(z2[0].mem.gradient_bytes < z1[0].mem.gradient_bytes);
        }
      }
    }
  }
}

TEST_CASE("zero: bytes sent per step equal DDP's (reduce_scatter + all_gather = all_reduce)", "[parallel][zero][traffic]") {
  SECTION("a world size that divides the parameter count: exactly DDP's bytes") {
    for (int world : {1, 2, 4}) {
      for (int stage : {1, 2}) {
        CAPTURE(world, stage);
        const run_config c{.opt = sgd_momentum, .shape = even_shape};
        const auto ddp = ddp_run(world, c);
        const auto z = zero_run(world, c, {.stage = stage});
        for (int r = 0; r < world; ++r) CHECK(z[static_cast<std::size_t>(r)].bytes_per_step == ddp[0].bytes_per_step);
      }
    }
  }
  SECTION("uneven shards: DDP's bytes plus the padding's share, whatever the bucket size") {
    for (int world : {2, 3, 4}) {
      for (std::size_t cap : {std::size_t{12}, std::size_t{25} << 20}) {
        CAPTURE(world, cap);
        const run_config c{.opt = adamw_default};
        const auto ddp = ddp_run(world, c);
        const auto z = zero_run(world, c, {.stage = 2, .bucket_cap_bytes = cap});
        const auto n = static_cast<std::uint64_t>(world);
        const std::uint64_t padded = z[0].mem.padding_elements + 53;
        // A ring reduce_scatter and all_gather of the padded space: (n-1)/n of it each.
        CHECK(z[0].bytes_per_step == 2 * (n - 1) * padded / n * sizeof(float));
        CHECK(z[0].bytes_per_step >= ddp[0].bytes_per_step);
        CHECK(z[0].bytes_per_step - ddp[0].bytes_per_step <= 2 * (n - 1) * sizeof(float) + 1);
      }
    }
  }
  SECTION("clipping adds one 8-byte all_reduce of the norm") {
    const run_config c{.opt = sgd_momentum, .max_norm = 0.05, .shape = even_shape};
    const auto ddp = ddp_run(2, c);
    const auto z = zero_run(2, c, {.stage = 1});
    CHECK(z[0].bytes_per_step == ddp[0].bytes_per_step + 8);
  }
}

TEST_CASE("zero: join lets ranks with fewer batches shadow the others, as DDP's join", "[parallel][zero][join]") {
  // Rank r of 3 has 5 - r batches: the last steps are the longer ranks' alone.
  constexpr int world = 3;
  for (bool initial : {true, false}) {
    for (int stage : {1, 2}) {
      CAPTURE(initial, stage);
      std::vector<std::vector<float>> zero_out(world), after(world), ddp_out(world);
      std::vector<int> shadowed(world);
      std::vector<std::size_t> shadow_steps(world);
      run_local(world, [&](local_group& g) {
        auto m = make_model(g.rank(), odd_shape);
        sharded_data_parallel zero(m, g, adamw_default,
                                   {.stage = stage, .bucket_cap_bytes = 36, .max_grad_norm = 0.05, .join = true,
                                    .divide_by_initial_world_size = initial});
        for (int s = 0; s < 5 - g.rank(); ++s) zero.train_step(rank_batch(s, world, g.rank(), odd_shape));
        const auto r = static_cast<std::size_t>(g.rank());
        shadowed[r] = zero.join() ? 1 : 0;
        shadow_steps[r] = zero.shadow_steps();
        zero_out[r] = m.flat_values();
        zero.train_step(rank_batch(9, world, g.rank(), odd_shape));  // the next epoch's first step
        after[r] = m.flat_values();
      });
      run_local(world, [&](local_group& g) {
        auto m = make_model(g.rank(), odd_shape);
        distributed_data_parallel ddp(m, g, {.join = true, .divide_by_initial_world_size = initial});
        adamw opt(m, adamw_default);
        for (int s = 0; s < 5 - g.rank(); ++s) {
          ddp.train_step(rank_batch(s, world, g.rank(), odd_shape));
          (void)ddp.clip_grad_norm(0.05);
          opt.step();
        }
        (void)ddp.join();  // the last joiner's parameters, everywhere
        ddp_out[static_cast<std::size_t>(g.rank())] = m.flat_values();
      });
      CHECK(shadowed == std::vector<int>{0, 1, 1});
      CHECK(shadow_steps == std::vector<std::size_t>{0, 1, 2});
      for (int r = 0; r < world; ++r) {
        CHECK(zero_out[static_cast<std::size_t>(r)] == zero_out[0]);
        CHECK(after[static_cast<std::size_t>(r)] == after[0]);
      }
      CHECK(after[0] != zero_out[0]);
      check_close(zero_out[0], ddp_out[0]);
    }
  }
  SECTION("join() without the option is a clear error") {
    run_local(1, [](local_group& g) {
      auto m = make_model(0, odd_shape);
      sharded_data_parallel zero(m, g, sgd_momentum);
      CHECK_THROWS_WITH(zero.join(), Catch::Contains("join() needs join enabled"));
    });
  }
}

TEST_CASE("zero: without join, a rank that stops early makes the others time out naming the op and join",
          "[parallel][zero][join]") {
  std::string msg;
  int rank = -1;
  std::chrono::milliseconds deadline{0};
  try {
    run_local(
        2,
        [](local_group& g) {
          auto m = make_model(g.rank(), odd_shape);
          sharded_data_parallel zero(m, g, sgd_momentum);
          for (int s = 0; s < (g.rank() == 0 ? 2 : 1); ++s) zero.train_step(rank_batch(s, 2, g.rank(), odd_shape));
        },
        {.timeout = std::chrono::milliseconds(300)});
  } catch (const timeout_error& e) {
    msg = e.what();
    rank = e.rank();
    deadline = e.timeout();
  }
  CHECK_THAT(msg, Catch::Contains("rank 0 sharded_data_parallel: gradient reduce_scatter of bucket 0"));
  CHECK_THAT(msg, Catch::Contains("zero_options{.join = true}"));
  // The same facts as fields, for callers that must not parse the text.
  CHECK(rank == 0);
  CHECK(deadline == std::chrono::milliseconds(300));
}

namespace {

using scaled_toy = partrain::testing::scaled_toy_mlp<float>;

struct amp_out {
  std::vector<std::vector<float>> values;
  std::vector<std::vector<int>> skipped;
  std::vector<std::vector<float>> scales;
  std::vector<int> refreshes;
};

}  // namespace

TEST_CASE("zero: amp_step unscales each shard, agrees on overflows and matches DDP's amp_step", "[parallel][zero][amp]") {
  constexpr int world = 3, n_steps = 6;
  for (int stage : {1, 2}) {
    CAPTURE(stage);
    auto run = [&](bool sharded) {
      amp_out o{std::vector<std::vector<float>>(world), std::vector<std::vector<int>>(world),
                std::vector<std::vector<float>>(world), std::vector<int>(world)};
      std::mutex mu;
      run_local(world, [&](local_group& g) {
        scaled_toy m(7);
        if (g.rank() == 2) m.poison_at = 3;  // only rank 2 overflows, at its third step
        grad_scaler scaler({.init_scale = 1024.0f, .growth_interval = 2});
        std::vector<int> sk;
        std::vector<float> sc;
        auto record = [&](const amp_step_result& r) {
          sk.push_back(r.skipped ? 1 : 0);
          sc.push_back(r.scale);
        };
        if (sharded) {
          sharded_data_parallel zero(m, g, adamw_default, {.stage = stage, .bucket_cap_bytes = 40, .max_grad_norm = 0.5});
          for (int s = 0; s < n_steps; ++s) record(amp_step(zero, scaler, rank_batch(s, world, g.rank(), odd_shape)));
        } else {
          distributed_data_parallel ddp(m, g);
          adamw opt(m, adamw_default);
          for (int s = 0; s < n_steps; ++s) {
            record(amp_step(ddp, opt, scaler, rank_batch(s, world, g.rank(), odd_shape), {.max_grad_norm = 0.5}));
          }
        }
        std::lock_guard lock(mu);
        const auto r = static_cast<std::size_t>(g.rank());
        o.values[r] = m.flat_values();
        o.skipped[r] = sk;
        o.scales[r] = sc;
        o.refreshes[r] = m.refreshes;
      });
      return o;
    };
    const auto z = run(true);
    const auto d = run(false);
    for (int r = 0; r < world; ++r) {
      const auto q = static_cast<std::size_t>(r);
      CHECK(z.skipped[q] == std::vector<int>{0, 0, 1, 0, 0, 0});
      CHECK(z.scales[q] == d.scales[q]);
      CHECK(z.refreshes[q] == n_steps - 1);
      CHECK(z.values[q] == z.values[0]);
      for (float v : z.values[q]) REQUIRE(std::isfinite(v));
    }
    check_close(z.values[0], d.values[0]);
  }
}

TEST_CASE("zero: evaluate sums over ranks and set_lr reaches the shard's optimizer", "[parallel][zero][eval]") {
  // Catch's assertions are not thread-safe: the ranks record, the test thread checks.
  std::vector<std::size_t> counts(3);
  std::vector<double> lrs(3);
  std::vector<int> refused(3);
  run_local(3, [&](local_group& g) {
    auto m = make_model(g.rank(), odd_shape);
    sharded_data_parallel zero(m, g, sgd_momentum);
    const std::vector<toy_batch<float>> mine{rank_batch(0, 3, g.rank(), odd_shape)};
    const auto r = static_cast<std::size_t>(g.rank());
    counts[r] = zero.evaluate(mine).count;
    zero.set_lr(0.125);
    lrs[r] = zero.lr();
    try {
      zero.set_lr(-1);
    } catch (const invalid_argument_error&) {
      refused[r] = 1;
    }
  });
  CHECK(counts == std::vector<std::size_t>(3, 3 * per_rank));
  CHECK(lrs == std::vector<double>(3, 0.125));
  CHECK(refused == std::vector<int>(3, 1));
}

TEST_CASE("zero: bad input fails with a message naming what was wrong", "[parallel][zero][errors]") {
  run_local(1, [](local_group& g) {
    auto m = make_model(0, odd_shape);
    CHECK_THROWS_WITH(sharded_data_parallel(m, g, sgd_momentum, {.stage = 3}),
                      Catch::Contains("stage must be 1 or 2, got 3"));
    CHECK_THROWS_AS(sharded_data_parallel(m, g, sgd_momentum, {.stage = 0}), invalid_argument_error);
    CHECK_THROWS_WITH(sharded_data_parallel(m, g, sgd_momentum, {.bucket_cap_bytes = 0}),
                      Catch::Contains("bucket_cap_bytes and first_bucket_bytes must be > 0 (got 0 and"));
    CHECK_THROWS_WITH(sharded_data_parallel(m, g, sgd_momentum, {.first_bucket_bytes = 0}),
                      Catch::Contains("(got 26214400 and 0)"));
    CHECK_THROWS_WITH(sharded_data_parallel(m, g, sgd_momentum, {.partition = static_cast<zero_partition>(7)}),
                      Catch::Contains("partition must be per_bucket or contiguous, got 7"));
    CHECK_THROWS_WITH(sharded_data_parallel(m, g, sgd_momentum, {.max_grad_norm = -1}),
                      Catch::Contains("max_grad_norm must be a finite number >= 0"));
    CHECK_THROWS_WITH(sharded_data_parallel(m, g, sgd_options{.lr = -0.1}), Catch::Contains("lr must be >= 0"));
    CHECK_THROWS_WITH(sharded_data_parallel(m, g, adamw_options{.beta1 = 1.5}), Catch::Contains("beta1 must be in [0, 1)"));
  });
  SECTION("a model that reports a gradient twice, or one it does not have") {
    for (const std::size_t bad : {std::size_t{3}, std::size_t{9}}) {
      struct twice_mlp : toy_mlp<float> {
        using toy_mlp<float>::toy_mlp;
        std::size_t extra = 3;
        double train_step(const toy_batch<float>& b) { return toy_mlp<float>::train_step(b); }
        double train_step(const toy_batch<float>& b, const grad_ready_fn& ready) {
          ready(extra);
          return toy_mlp<float>::train_step(b, ready);
        }
      };
      std::string msg;
      run_local(1, [&](local_group& g) {
        twice_mlp m(7);
        m.extra = bad;
        sharded_data_parallel zero(m, g, sgd_momentum);
        try {
          zero.train_step(rank_batch(0, 1, 0, odd_shape));
        } catch (const invalid_argument_error& e) {
          msg = e.what();
        }
      });
      CHECK_THAT(msg, Catch::Contains(bad == 3 ? "grad-ready notification for parameter 3 came twice in one step"
                                               : "parameter index 9, but the model has 4 parameters"));
    }
  }
  SECTION("a rank with another model fails on every rank, naming it") {
    std::vector<std::string> messages(2);
    run_local(2, [&](local_group& g) {
      auto m = g.rank() == 1 ? make_model(1, even_shape) : make_model(0, odd_shape);
      try {
        sharded_data_parallel zero(m, g, sgd_momentum);
      } catch (const config_error& e) {
        messages[static_cast<std::size_t>(g.rank())] = e.what();
      }
    });
    for (const auto& msg : messages) {
      CHECK_THAT(msg, Catch::Contains("rank 1 has 4 parameters of 44 elements"));
      CHECK_THAT(msg, Catch::Contains("rank 0 has 4 of 53"));
    }
  }
}

namespace {

// A linear model y = W x + b (least squares) that keeps all its values in one buffer and all its
// gradients in another, as mlp_host does: what sharded_data_parallel's shared-memory step needs.
class flat_linear {
 public:
  struct param {
    tensor_view<float> v, g;
    [[nodiscard]] tensor_view<float> value() const { return v; }
    [[nodiscard]] tensor_view<float> grad() const { return g; }
  };
  flat_linear(std::uint64_t seed, shape3 s) : in_(s.in), out_(s.out), values_(s.out * (s.in + 1)), grads_(values_.size()) {
    partrain::testing::toy_rng r(seed);
    for (auto& v : values_) v = static_cast<float>(0.5 * r.uniform());
    const std::size_t w = out_ * in_;
    params_ = {{{values_.data(), w}, {grads_.data(), w}}, {{values_.data() + w, out_}, {grads_.data() + w, out_}}};
  }
  [[nodiscard]] std::vector<param>& parameters() noexcept { return params_; }
  double train_step(const toy_batch<float>& b) {
    std::fill(grads_.begin(), grads_.end(), 0.0f);
    double loss = 0;
    const float inv = 1.0f / static_cast<float>(b.n);
    for (std::size_t s = 0; s < b.n; ++s) {
      for (std::size_t o = 0; o < out_; ++o) {
        float y = values_[out_ * in_ + o];
        for (std::size_t i = 0; i < in_; ++i) y += values_[o * in_ + i] * b.x[s * in_ + i];
        const float d = y - b.y[s * out_ + o];
        loss += 0.5 * static_cast<double>(d) * static_cast<double>(d);
        for (std::size_t i = 0; i < in_; ++i) grads_[o * in_ + i] += d * b.x[s * in_ + i] * inv;
        grads_[out_ * in_ + o] += d * inv;
      }
    }
    return loss / static_cast<double>(b.n);
  }
  [[nodiscard]] const std::vector<float>& flat_values() const noexcept { return values_; }

 private:
  std::size_t in_, out_;
  std::vector<float> values_, grads_;
  std::vector<param> params_;
};

struct flat_result {
  std::vector<float> values;  // rank 0's, after the steps
  bool all_equal = true;      // every rank's values equal rank 0's
  bool shared = false;        // rank 0's shared_memory_step()
  sharded_memory mem{};       // rank 0's, after the steps
};

// Rank r of `world` takes 6 - (join ? r : 0) steps of its own batches, then joins (with join).
flat_result flat_run(int world, const shard_optimizer_options& opt, zero_options o, double max_norm = 0, bool join = false) {
  o.max_grad_norm = max_norm;
  o.join = join;
  std::vector<std::vector<float>> values(static_cast<std::size_t>(world));
  flat_result res;
  run_local(world, [&](local_group& g) {
    flat_linear m(7 + static_cast<std::uint64_t>(g.rank()), odd_shape);
    sharded_data_parallel zero(m, g, opt, o);
    const int mine = 6 - (join ? g.rank() : 0);
    for (int s = 0; s < mine; ++s) zero.train_step(rank_batch(s, world, g.rank(), odd_shape));
    if (join) (void)zero.join();
    values[static_cast<std::size_t>(g.rank())] = m.flat_values();
    if (g.rank() == 0) {
      res.shared = zero.shared_memory_step();
      res.mem = zero.memory();
    }
  }, {.timeout = std::chrono::seconds(20)});
  res.values = values[0];
  for (const auto& v : values) res.all_equal = res.all_equal && v == values[0];
  return res;
}

}  // namespace

TEST_CASE("zero: the shared-memory step on threads gives the reduce_scatter path's bits", "[parallel][zero][shared]") {
  const std::vector<shard_optimizer_options> opts{sgd_momentum, adamw_default};
  for (int world = 1; world <= 4; ++world) {
    for (const auto& opt : opts) {
      for (int stage : {1, 2}) {
        for (const auto partition : {zero_partition::per_bucket, zero_partition::contiguous}) {
          CAPTURE(world, stage, static_cast<int>(partition), opt.index());
          // 12-byte buckets: several buckets, each rank's blocks spread over them.
          zero_options o{.stage = stage, .partition = partition, .bucket_cap_bytes = 12, .first_bucket_bytes = 12};
          const auto shared = flat_run(world, opt, o);
          o.shared_memory_step = false;
          const auto scattered = flat_run(world, opt, o);
          CHECK(shared.shared);
          CHECK_FALSE(scattered.shared);
          CHECK(shared.all_equal);
          CHECK(shared.values == scattered.values);
          // No bucket slots, gathered blocks or reduced shard: the step needs none.
          CHECK(shared.mem.gradient_bytes == 0);
          CHECK(shared.mem.communication_bytes == 0);
          CHECK(scattered.mem.communication_bytes > 0);
          CHECK(shared.mem.optimizer_state_bytes == scattered.mem.optimizer_state_bytes);
        }
      }
    }
  }
  SECTION("clipping takes the reduce_scatter path; join shadows over shared memory") {
    for (int world : {2, 3}) {
      CAPTURE(world);
      const auto clipped = flat_run(world, sgd_momentum, {}, 0.05);
      const auto clipped_rs = flat_run(world, sgd_momentum, {.shared_memory_step = false}, 0.05);
      CHECK(clipped.values == clipped_rs.values);
      CHECK(clipped.mem.communication_bytes == clipped_rs.mem.communication_bytes);  // made at the first step
      const auto joined = flat_run(world, adamw_default, {}, 0, true);
      const auto joined_rs = flat_run(world, adamw_default, {.shared_memory_step = false}, 0, true);
      CHECK(joined.all_equal);
      CHECK(joined.values == joined_rs.values);
    }
  }
}

TEST_CASE("zero: models whose parameters are not one buffer take the reduce_scatter path", "[parallel][zero][shared]") {
  run_local(2, [](local_group& g) {
    auto m = make_model(g.rank(), odd_shape);  // toy_mlp: one allocation per parameter
    sharded_data_parallel zero(m, g, sgd_momentum);
    CHECK_FALSE(zero.shared_memory_step());
  });
}
