// The ViT's blocks split over a tensor-parallel group (models/vit_layers.hpp, Megatron's split:
// heads and hidden units per rank, the row-parallel sums by all-reduce), on threads: one step on
// every rank of groups of 2 and 4 equals the whole model's step (logits, loss, input gradient,
// every parameter's gradient against its slice of the whole one), with and without dropout; a few
// SGD steps follow the whole model's losses; DP x TP on a 2 x 2 device_mesh (DDP over dp, the
// blocks split over tp) equals one process on the global batch; each step sends exactly 4
// all-reduces of batch x tokens x dim per block; uneven splits are refused with the sizes.
#include <catch2/catch.hpp>

#include <partrain/comm/device_mesh.hpp>
#include <partrain/comm/local.hpp>
#include <partrain/model/sequential.hpp>
#include <partrain/optim/sgd.hpp>
#include <partrain/parallel/ddp.hpp>
#include <partrain/parallel/mesh_clip.hpp>
#include <partrain/parallel/pipeline/stage.hpp>
#include <partrain/parallel/fsdp.hpp>
#include <partrain/parallel/zero.hpp>
#include <partrain/optim/clip.hpp>
#include <partrain/train/policies.hpp>
#include <partrain/train/fsdp_policy.hpp>
#include <partrain/train/zero_policy.hpp>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <string>
#include <vector>

#include "mlp_host_twin.hpp"
#include "pipeline_layers.hpp"
#include "temp_dir.hpp"
#include "vit_device_step.hpp"
#include "vit_layers.hpp"

using namespace partrain;
namespace ml = models::layers;

namespace {

using block = ml::basic_transformer_block<float>;

ml::vit_config tp_vit(float dropout) {
  return {.patch = 7, .dim = 16, .depth = 2, .heads = 4, .mlp_ratio = 2, .dropout = dropout};
}

}  // namespace

TEST_CASE("a tensor-parallel ViT step equals the whole model's, with and without sequence parallelism",
          "[examples][vit][tensor_parallel]") {
  const int p = GENERATE(2, 4);
  const float dropout = GENERATE(0.0f, 0.2f);
  const bool sp = GENERATE(false, true);
  // bfloat16: the activations' collectives round each rank's values to 8 bits of mantissa.
  const dtype wire = GENERATE(dtype::float32, dtype::bfloat16);
  const bool bf16 = wire == dtype::bfloat16;
  CAPTURE(p, dropout, sp, bf16);
  const auto c = tp_vit(dropout);
  const test::synthetic_batch b(3, c.image * c.image, 10, 5);
  const models::host_twin_backend memory(device::cpu());
  ml::softmax_cross_entropy loss;
  auto whole = ml::make_vit(c, 9);
  const auto ref = test::run_vit_step(memory, whole, loss, b, 21);

  std::vector<test::vit_step> got(static_cast<std::size_t>(p));
  std::vector<comm_traffic> traffic(static_cast<std::size_t>(p));
  run_local(p, [&](local_group& g) {
    const auto r = static_cast<std::size_t>(g.rank());
    auto shard = ml::make_vit(c, 9, {.group = &g, .rank = r, .size = static_cast<std::size_t>(p), .sequence_parallel = sp,
                                     .wire = wire});
    ml::softmax_cross_entropy l;
    const auto before = g.traffic();
    got[r] = test::run_vit_step(memory, shard, l, b, 21);
    traffic[r] = {g.traffic().calls - before.calls, g.traffic().bytes_sent - before.bytes_sent};
  });
  for (std::size_t r = 0; r < static_cast<std::size_t>(p); ++r) {
    CAPTURE(r);
    const double tol = bf16 ? 1e-2 : 1e-5;  // bf16 measured: at most 6.2e-3 (the input gradient at p 4)
    test::check_tp_step(got[r], ref, r, static_cast<std::size_t>(p), c, tol, bf16 ? 2 * tol : 2e-5);
    // Activations move in the wire's width; the LayerNorm gradients' sums below stay float.
    const std::uint64_t floats = 3 * 16 * c.dim, n = static_cast<std::uint64_t>(p), bytes = floats * (bf16 ? 2 : sizeof(float));
    if (!sp) {
      // 2 all-reduces forward and 2 backward per block, each of batch x tokens x dim floats.
      CHECK(traffic[r].calls == 4 * c.depth);
      CHECK(traffic[r].bytes_sent == 4 * c.depth * (2 * (n - 1) * bytes / n));
    } else {
      // Per block, each a ring exchange of (p - 1) / p of batch x tokens x dim floats: forward 2
      // all-gathers and 2 reduce-scatters; backward 2 output gradients and 2 LayerNorm outputs
      // gathered, 2 reduce-scatters; and an all-reduce of the 4 LayerNorm gradients [dim]. Plus
      // the ends: the split's backward, and the gather's forward and backward (which gathers the
      // head's input again), an all-gather each.
      const std::uint64_t exchange = (n - 1) * bytes / n, ln = 2 * (n - 1) * (4 * c.dim * sizeof(float)) / n;
      CHECK(traffic[r].calls == 11 * c.depth + 3);
      CHECK(traffic[r].bytes_sent == c.depth * (10 * exchange + ln) + 3 * exchange);
    }
  }
}

TEST_CASE("tensor-parallel ViT training follows the whole model's", "[examples][vit][tensor_parallel]") {
  const bool sp = GENERATE(false, true);
  CAPTURE(sp);
  const auto c = tp_vit(0.1f);
  auto train = [&](ml::host_model layers, std::vector<double>& losses) {
    sequential model(std::move(layers), ml::softmax_cross_entropy{});
    model.set_seed(3);
    sgd opt(model, {.lr = 0.1, .momentum = 0.9});
    for (std::uint32_t s = 0; s < 4; ++s) {
      const test::synthetic_batch b(4, c.image * c.image, 10, 70 + s);
      struct {
        tensor_view<const float> features;
        std::vector<std::int32_t> labels;
      } batch{b.input(), b.y};
      losses.push_back(model.train_step(batch));
      opt.step();
    }
  };
  std::vector<double> ref;
  train(ml::make_vit(c, 4), ref);
  std::vector<std::vector<double>> got(2);
  run_local(2, [&](local_group& g) {
    const auto r = static_cast<std::size_t>(g.rank());
    train(ml::make_vit(c, 4, {.group = &g, .rank = r, .size = 2, .sequence_parallel = sp}), got[r]);
  });
  for (const auto& run : got) {
    REQUIRE(run.size() == ref.size());
    for (std::size_t s = 0; s < ref.size(); ++s) CHECK(run[s] == Approx(ref[s]).epsilon(1e-5));
  }
  CHECK(ref.front() != Approx(ref.back()).epsilon(1e-3));  // it trained
}

namespace {

struct rows_batch {
  tensor_view<const float> features;
  std::vector<std::int32_t> labels;
};

// This rank's ViT on a dp x tp mesh: its tensor-parallel slice of the whole model (seed 6).
template <class Mesh>
auto mesh_vit(const ml::vit_config& c, Mesh& mesh) {
  return sequential(ml::make_vit(c, 6, {.group = &mesh.group("tp"), .rank = static_cast<std::size_t>(mesh.coordinate("tp")),
                                        .size = static_cast<std::size_t>(mesh.size("tp"))}),
                    ml::softmax_cross_entropy{});
}
// run(from, to, load, save) trains steps [from, to) on 4 ranks, loading a checkpoint first and/or
// saving it last, and returns every rank's parameters: 3 steps straight equal 2 saved and 1
// resumed, on every rank.
template <class Run>
void check_resumes_bit_for_bit(Run&& run) {
  const auto straight = run(0, 3, false, false);
  (void)run(0, 2, false, true);
  const auto resumed = run(2, 3, true, false);
  for (std::size_t r = 0; r < 4; ++r) {
    CAPTURE(r);
    CHECK(resumed[r] == straight[r]);
  }
  CHECK(straight[0] != straight[1]);  // tp ranks 0 and 1 hold different slices: one section for both would be wrong
}

// The rows of a global batch of 2 x half that data-parallel rank dp takes.
rows_batch dp_rows(const test::synthetic_batch& b, std::size_t dp, std::size_t half, std::size_t pixels) {
  return {tensor_view<const float>(b.x.data() + dp * half * pixels, shape{half, pixels}),
          std::vector<std::int32_t>(b.y.begin() + static_cast<std::ptrdiff_t>(dp * half),
                                    b.y.begin() + static_cast<std::ptrdiff_t>((dp + 1) * half))};
}

}  // namespace

TEST_CASE("DP x TP on a 2 x 2 mesh, DDP, ZeRO-1, ZeRO-2 or FSDP over dp, equals one process on the global batch, "
          "clipped or not", "[examples][vit][tensor_parallel][ddp][zero][fsdp]") {
  // Clipping at 0.05 (well below the gradients' norm: every step clips) needs the norm over every
  // parameter once: the split ones summed over their tp group, the whole ones counted once (and
  // ZeRO's and FSDP's shards mix the two kinds of element).
  const std::string mode = GENERATE("ddp", "zero1", "zero2", "fsdp");
  const double max_norm = GENERATE(0.0, 0.05);
  CAPTURE(mode, max_norm);
  const auto c = tp_vit(0.0f);  // no dropout: a data-parallel rank's masks are drawn for its own rows
  const std::size_t half = 3, pixels = c.image * c.image;
  std::vector<test::synthetic_batch> batches;
  for (std::uint32_t s = 0; s < 3; ++s) batches.emplace_back(2 * half, pixels, 10, 300 + s);
  const test::synthetic_batch probe(5, pixels, 10, 999);
  const rows_batch probe_rows{probe.input(), probe.y};

  sequential whole(ml::make_vit(c, 6), ml::softmax_cross_entropy{});
  sgd whole_opt(whole, {.lr = 0.1, .momentum = 0.9});
  std::vector<double> want_norms;
  for (const auto& b : batches) {
    (void)whole.train_step(rows_batch{b.input(), b.y});
    if (max_norm > 0) want_norms.push_back(clip_grad_norm(whole, max_norm));
    whole_opt.step();
  }
  const eval_result want = whole.eval_step(probe_rows);

  std::vector<eval_result> got(4);
  std::vector<std::vector<double>> norms(4);
  std::vector<std::vector<float>> exported(4);  // FSDP: every rank's gathered whole weights
  run_local(4, [&](local_group& world) {
    device_mesh mesh(world, {{"dp", 2}, {"tp", 2}});
    auto model = mesh_vit(c, mesh);
    const auto r = static_cast<std::size_t>(world.rank());
    const auto dp = static_cast<std::size_t>(mesh.coordinate("dp"));
    const sgd_options o{.lr = 0.1, .momentum = 0.9};
    // Data-parallel rank dp takes rows dp*half .. of the global batch; step(rows) returns the norm.
    auto train = [&](auto&& step) {
      for (const auto& b : batches) {
        const double norm = step(dp_rows(b, dp, half, pixels));
        if (max_norm > 0) norms[r].push_back(norm);
      }
    };
    if (mode == "ddp") {
      distributed_data_parallel ddp(model, mesh.group("dp"));
      sgd opt(model, o);
      train([&](const rows_batch& mine) {
        (void)ddp.train_step(mine);
        const double norm = max_norm > 0 ? ddp.clip_grad_norm(max_norm) : 0.0;
        opt.step();
        return norm;
      });
      got[r] = model.eval_step(probe_rows);
    } else if (mode == "fsdp") {
      fully_sharded_data_parallel fsdp(model, mesh.group("dp"), o, {.max_grad_norm = max_norm});
      train([&](const rows_batch& mine) {
        (void)fsdp.train_step(batch{mine.features, tensor_view<const std::int32_t>(mine.labels), {}});
        return fsdp.last_grad_norm();
      });
      std::vector<batch> probes;  // FSDP sums its ranks' evaluations: the probe on one replica
      if (dp == 0) probes.push_back(batch{probe.input(), probe.labels(), {}});
      got[r] = fsdp.evaluate(probes);
      // The whole weights (the example's --export): the layers summoned over dp, then gathered over tp.
      auto full = fsdp.summon_full_params();
      sequential gathered(ml::gather_vit(model.layers(), c,
                                         {.group = &mesh.group("tp"), .rank = static_cast<std::size_t>(mesh.coordinate("tp")),
                                          .size = static_cast<std::size_t>(mesh.size("tp"))}),
                          ml::softmax_cross_entropy{});
      for (auto& p : gathered.parameters()) exported[r].insert(exported[r].end(), p.value().begin(), p.value().end());
    } else {
      sharded_data_parallel zero(model, mesh.group("dp"), o, {.stage = mode == "zero1" ? 1 : 2, .max_grad_norm = max_norm});
      train([&](const rows_batch& mine) {
        (void)zero.train_step(mine);
        return zero.last_grad_norm();
      });
      got[r] = model.eval_step(probe_rows);
    }
  });
  for (std::size_t r = 0; r < 4; ++r) {
    CAPTURE(r);
    CHECK(got[r].count == want.count);
    CHECK(got[r].correct == want.correct);
    CHECK(got[r].loss_sum == Approx(want.loss_sum).epsilon(1e-5));
    REQUIRE(norms[r].size() == want_norms.size());
    for (std::size_t k = 0; k < want_norms.size(); ++k) CHECK(norms[r][k] == Approx(want_norms[k]).epsilon(1e-5));
  }
  if (max_norm > 0) CHECK(want_norms.front() > 10 * max_norm);
  if (mode == "fsdp") {
    std::vector<float> w;
    for (auto& p : whole.parameters()) w.insert(w.end(), p.value().begin(), p.value().end());
    for (std::size_t r = 0; r < 4; ++r) {
      CAPTURE(r);
      REQUIRE(exported[r].size() == w.size());
      std::size_t far = 0;
      for (std::size_t i = 0; i < w.size(); ++i) far += std::fabs(exported[r][i] - w[i]) > 1e-5f * (1.0f + std::fabs(w[i]));
      CHECK(far == 0);
    }
  }
}

TEST_CASE("DP x TP checkpoints: each rank's slice saved and resumed, bit for bit, under DDP, ZeRO-1 or ZeRO-2",
          "[examples][vit][tensor_parallel][checkpoint][zero]") {
  const std::string mode = GENERATE("ddp", "zero1", "zero2", "fsdp");
  CAPTURE(mode);
  const auto c = tp_vit(0.0f);
  const std::size_t half = 3, pixels = c.image * c.image;
  std::vector<test::synthetic_batch> batches;
  for (std::uint32_t s = 0; s < 3; ++s) batches.emplace_back(2 * half, pixels, 10, 400 + s);
  testing::temp_dir dir("partrain_tp_ckpt");
  const auto file = dir.path / "tp.ckpt";
  // Steps [from, to) of a 2 x 2 mesh, loaded from the checkpoint first and/or saved to it last;
  // returns every rank's parameters (each its own slice of the blocks).
  auto run = [&](std::size_t from, std::size_t to, bool load, bool save) {
    std::vector<std::vector<float>> values(4);
    run_local(4, [&](local_group& world) {
      device_mesh mesh(world, {{"dp", 2}, {"tp", 2}});
      auto model = mesh_vit(c, mesh);
      const auto dp = static_cast<std::size_t>(mesh.coordinate("dp"));
      auto steps = [&](auto& policy) {
        if (load) (void)policy.load_checkpoint(file);
        for (std::size_t s = from; s < to; ++s) {
          const rows_batch mine = dp_rows(batches[s], dp, half, pixels);
          (void)policy.train_step(batch{mine.features, tensor_view<const std::int32_t>(mine.labels), {}});
        }
        if (save) policy.save_checkpoint(file, {});
      };
      if (mode == "ddp") {
        distributed_data_parallel ddp(model, mesh.group("dp"));
        sgd opt(model, {.lr = 0.1, .momentum = 0.9});
        ddp_policy policy(ddp, opt, {.rank_sections = &world});
        steps(policy);
      } else if (mode == "fsdp") {  // the parameters sharded too: each rank its shard of the values and momentum
        fully_sharded_data_parallel fsdp(model, mesh.group("dp"), sgd_options{.lr = 0.1, .momentum = 0.9}, {});
        fsdp_policy policy(fsdp, {.rank_sections = &world});
        steps(policy);
        auto full = fsdp.summon_full_params();  // the layers hold their values only while summoned
        auto& v = values[static_cast<std::size_t>(world.rank())];
        for (auto& p : model.parameters()) v.insert(v.end(), p.value().begin(), p.value().end());
        return;
      } else {  // the optimizer state (zero2: the gradients too) sharded over dp: each rank its shard's momentum
        sharded_data_parallel zero(model, mesh.group("dp"), sgd_options{.lr = 0.1, .momentum = 0.9},
                                   {.stage = mode == "zero1" ? 1 : 2});
        zero_policy policy(zero, {.rank_sections = &world});
        steps(policy);
      }
      auto& v = values[static_cast<std::size_t>(world.rank())];
      for (auto& p : model.parameters()) v.insert(v.end(), p.value().begin(), p.value().end());
    });
    return values;
  };
  check_resumes_bit_for_bit(run);
  // A mesh of another shape cannot take it.
  std::string error;
  run_local(2, [&](local_group& world) {
    device_mesh mesh(world, {{"dp", 1}, {"tp", 2}});
    auto model = mesh_vit(c, mesh);
    distributed_data_parallel ddp(model, mesh.group("dp"));
    sgd opt(model, {.lr = 0.1, .momentum = 0.9});
    ddp_policy policy(ddp, opt, {.rank_sections = &world});
    try {
      (void)policy.load_checkpoint(file);
    } catch (const std::exception& e) {
      if (world.rank() == 0) error = e.what();
    }
  });
  CHECK_THAT(error, Catch::Contains("was saved by 4 ranks, this job has 2"));
}

TEST_CASE("PP x TP checkpoints: a section per rank of the mesh, saved and resumed bit for bit",
          "[examples][vit][tensor_parallel][pipeline][checkpoint]") {
  const auto c = tp_vit(0.0f);
  const std::size_t pixels = c.image * c.image;
  std::vector<test::synthetic_batch> batches;
  for (std::uint32_t s = 0; s < 3; ++s) batches.emplace_back(6, pixels, 10, 450 + s);
  testing::temp_dir dir("partrain_pp_tp_ckpt");
  const auto file = dir.path / "pp_tp.ckpt";
  // Steps [from, to) of a {pp: 2, tp: 2} mesh, loaded first and/or saved last; every rank's
  // parameters (its stage's layers, its slice of their blocks).
  auto run = [&](std::size_t from, std::size_t to, bool load, bool save) {
    std::vector<std::vector<float>> values(4);
    run_local(4, [&](local_group& world) {
      device_mesh mesh(world, {{"pp", 2}, {"tp", 2}});
      auto model = mesh_vit(c, mesh);
      pipeline_stage stage(model, mesh.group("pp"), {.micro_batches = 2});
      auto params = stage.parameters();
      sgd opt(params, {.lr = 0.1, .momentum = 0.9});  // momentum: the state must resume too
      pipeline_policy policy(stage, mesh.group("pp"), opt, model.loss(), {.rank_sections = &world});
      if (load) (void)policy.load_checkpoint(file);
      for (std::size_t s = from; s < to; ++s) {
        (void)policy.train_step(batch{batches[s].input(), tensor_view<const std::int32_t>(batches[s].y), {}});
      }
      if (save) policy.save_checkpoint(file, {});
      auto& v = values[static_cast<std::size_t>(world.rank())];
      stage.for_each_parameter([&](auto& p) { v.insert(v.end(), p.value().begin(), p.value().end()); });
    });
    return values;
  };
  check_resumes_bit_for_bit(run);
}

TEST_CASE("clipping over disjoint parts of a model adds their squares", "[examples][clip]") {
  // Two ranks, each a different model part (as pipeline stages are): the norm covers both.
  std::vector<double> local(2), total(2);
  run_local(2, [&](local_group& g) {
    sequential part(ml::make_mlp({6, 5, 4}, 10 + static_cast<std::uint32_t>(g.rank())), ml::softmax_cross_entropy{});
    const test::synthetic_batch b(4, 6, 4, 7);
    (void)part.train_step(rows_batch{b.input(), b.y});
    local[static_cast<std::size_t>(g.rank())] = mesh_grad_sum_squares(part);
    process_group* stages[] = {&g};
    total[static_cast<std::size_t>(g.rank())] = mesh_grad_sum_squares(part, stages);
  });
  CHECK(local[0] != local[1]);
  CHECK(total[0] == total[1]);
  CHECK(total[0] == Approx(local[0] + local[1]).epsilon(1e-12));
}

TEST_CASE("a tensor-parallel block refuses a split it cannot make", "[examples][vit][tensor_parallel]") {
  const block whole(16, 4, 32, 0.0f, 1);
  CHECK_THROWS_WITH(block(whole, {.group = nullptr, .rank = 0, .size = 3}),
                    Catch::Contains("4 heads and hidden width 32 over 3 tensor-parallel ranks") &&
                        Catch::Contains("divisible"));
  CHECK_THROWS_WITH(block(whole, {.group = nullptr, .rank = 2, .size = 2}), Catch::Contains("rank 2 of 2"));
  CHECK_THROWS_WITH(block(whole, {.group = nullptr, .rank = 0, .size = 2}), Catch::Contains("need their group of that size"));
  CHECK_THROWS_WITH(block(whole, {.group = nullptr, .rank = 0, .size = 1, .wire = dtype::float16}),
                    Catch::Contains("tensor-parallel collectives in float16 (expected float32 or bfloat16)"));
  run_local(2, [&](local_group& g) {
    const block shard(whole, {.group = &g, .rank = static_cast<std::size_t>(g.rank()), .size = 2});
    if (g.rank() == 0) CHECK_THROWS_WITH(block(shard, {.group = &g, .rank = 0, .size = 2}), Catch::Contains("not a shard"));
  });
}

TEST_CASE("DP x PP x TP on a 2 x 2 x 2 mesh equals one process on the global batch, clipped or not",
          "[examples][vit][tensor_parallel][pipeline]") {
  // 8 threads: pipelines of 2 stages whose ranks hold tensor-parallel slices, 2 replicas of them.
  // Clipping needs every parameter once: the slices over tp, the stages over pp, not the replicas.
  const double max_norm = GENERATE(0.0, 0.05);
  CAPTURE(max_norm);
  const auto c = tp_vit(0.0f);
  const std::size_t half = 4, pixels = c.image * c.image;
  std::vector<test::synthetic_batch> batches;
  for (std::uint32_t s = 0; s < 3; ++s) batches.emplace_back(2 * half, pixels, 10, 400 + s);
  const test::synthetic_batch probe(6, pixels, 10, 998);

  sequential whole(ml::make_vit(c, 6), ml::softmax_cross_entropy{});
  sgd whole_opt(whole, {.lr = 0.1, .momentum = 0.9});
  double first_norm = 0;
  for (const auto& b : batches) {
    (void)whole.train_step(rows_batch{b.input(), b.y});
    if (max_norm > 0) {
      const double n = clip_grad_norm(whole, max_norm);
      if (first_norm == 0) first_norm = n;
    }
    whole_opt.step();
  }
  const eval_result want = whole.eval_step(rows_batch{probe.input(), probe.y});

  std::vector<eval_result> got(8);
  run_local(8, [&](local_group& world) {
    device_mesh mesh(world, {{"pp", 2}, {"dp", 2}, {"tp", 2}});
    auto model = mesh_vit(c, mesh);
    pipeline_stage stage(model, mesh.group("pp"), {.micro_batches = 2, .data_parallel = &mesh.group("dp")});
    auto params = stage.parameters();
    sgd opt(params, {.lr = 0.1, .momentum = 0.9});
    pipeline_policy policy(stage, mesh.group("pp"), opt, model.loss());
    if (max_norm > 0) policy.set_max_grad_norm(max_norm);
    const auto dp = static_cast<std::size_t>(mesh.coordinate("dp"));
    for (const auto& b : batches) {
      const rows_batch mine = dp_rows(b, dp, half, pixels);
      (void)policy.train_step(batch{mine.features, tensor_view<const std::int32_t>(mine.labels), {}});
    }
    got[static_cast<std::size_t>(world.rank())] =
        stage.eval_step(model.loss(), probe.input(), tensor_view<const std::int32_t>(probe.y));
  });
  for (std::size_t r = 0; r < 8; ++r) {
    CAPTURE(r);
    CHECK(got[r].count == want.count);
    CHECK(got[r].correct == want.correct);
    CHECK(got[r].loss_sum == Approx(want.loss_sum).epsilon(1e-5));
  }
  if (max_norm > 0) CHECK(first_norm > 10 * max_norm);
}

namespace {

std::vector<float> flat_values(ml::host_model& m) {
  std::vector<float> out;
  for (auto& l : m) {
    for (auto& p : l->parameters()) out.insert(out.end(), p.value().begin(), p.value().end());
  }
  return out;
}

}  // namespace

TEST_CASE("a tensor-parallel ViT gathers into the whole model, which shards again at another size",
          "[examples][vit][tensor_parallel][checkpoint]") {
  const bool sp = GENERATE(false, true);
  CAPTURE(sp);
  const auto c = tp_vit(0.0f);
  auto whole = ml::make_vit(c, 9);
  const auto want = flat_values(whole);
  // Cut and put back together, bit for bit, at 2 and 4 ranks.
  for (const int p : {2, 4}) {
    CAPTURE(p);
    std::vector<std::vector<float>> back(static_cast<std::size_t>(p));
    run_local(p, [&](local_group& g) {
      const ml::tp_shard tp{.group = &g, .rank = static_cast<std::size_t>(g.rank()), .size = static_cast<std::size_t>(p),
                            .sequence_parallel = sp};
      auto shard = ml::make_vit(c, 9, tp);
      auto gathered = ml::gather_vit(shard, c, tp);
      back[static_cast<std::size_t>(g.rank())] = flat_values(gathered);
    });
    for (const auto& v : back) CHECK(v == want);
  }
  // Trained at 2 ranks, gathered, resharded at 4: its evaluation is the whole model's trained the same.
  const test::synthetic_batch b(4, c.image * c.image, 10, 61), probe(5, c.image * c.image, 10, 62);
  auto train2 = [&](ml::host_model layers) {
    sequential model(std::move(layers), ml::softmax_cross_entropy{});
    sgd opt(model, {.lr = 0.1, .momentum = 0.9});
    for (int s = 0; s < 2; ++s) {
      (void)model.train_step(rows_batch{b.input(), b.y});
      opt.step();
    }
    return model;
  };
  const eval_result ref = train2(ml::make_vit(c, 9)).eval_step(rows_batch{probe.input(), probe.y});
  ml::host_model trained;
  run_local(2, [&](local_group& g) {
    const ml::tp_shard tp{.group = &g, .rank = static_cast<std::size_t>(g.rank()), .size = 2, .sequence_parallel = sp};
    auto model = train2(ml::make_vit(c, 9, tp));
    auto gathered = ml::gather_vit(model.layers(), c, tp);
    if (g.rank() == 0) trained = std::move(gathered);
  });
  std::vector<eval_result> got(4);
  run_local(4, [&](local_group& g) {
    const ml::tp_shard tp{.group = &g, .rank = static_cast<std::size_t>(g.rank()), .size = 4, .sequence_parallel = sp};
    sequential model(ml::shard_vit(trained, c, tp), ml::softmax_cross_entropy{});
    got[static_cast<std::size_t>(g.rank())] = model.eval_step(rows_batch{probe.input(), probe.y});
  });
  for (const auto& r : got) {
    CHECK(r.correct == ref.correct);
    CHECK(r.loss_sum == Approx(ref.loss_sum).epsilon(1e-5));
  }
}
