// Fully sharded data parallel (ZeRO-3) over the local (threads) backend, on the example's layered
// MLP: equal to one process training on the global batch at world sizes 1-4 (layer sizes no world
// size divides, a layer whose last chunk is empty), both reshard_after_forward settings, with and
// without prefetch, SGD with momentum and AdamW, clipping, no_sync accumulation; evaluation with
// uneven batch counts; the measured peak parameter, gradient and optimizer-state bytes; the bytes
// each step sends; the chunk arithmetic; bad input; sharded checkpoints that resume at another
// world size and load into a replicated model; a grad scaler with float16 reductions (amp_step).
#include <catch2/catch.hpp>

#include <partrain/comm/local.hpp>
#include <partrain/optim/adamw.hpp>
#include <partrain/optim/clip.hpp>
#include <partrain/optim/sgd.hpp>
#include <partrain/parallel/fsdp.hpp>
#include <partrain/precision/grad_scaler.hpp>
#include <partrain/precision/sharded_amp.hpp>
#include <partrain/train/checkpoint.hpp>
#include <partrain/train/fsdp_policy.hpp>
#include <partrain/train/sharded_checkpoint.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "pipeline_layers.hpp"
#include "temp_dir.hpp"

using namespace partrain;
using namespace std::chrono_literals;
using partrain::test::host_model;
using partrain::test::make_mlp;
using partrain::test::reference_eval;
using partrain::test::reference_step;
using partrain::test::softmax_cross_entropy;
using partrain::test::synthetic_batch;
namespace fl = partrain::detail::fsdp;

namespace {

constexpr std::size_t per_rank = 4;
constexpr int steps = 5;
constexpr std::uint32_t seed = 11;
// Layers of 35, 18, 8 and 9 elements (linear 6->5, relu, 5->3, relu, 3->2, relu, 2->3): 35 and 9
// divide by no world size 2-4, and at world 4 the last layer's chunks are 3, 3, 3, 0.
const std::vector<std::size_t> widths{6, 5, 3, 2, 3};
const sgd_options sgd_momentum{.lr = 0.1, .momentum = 0.9, .weight_decay = 1e-3};
const adamw_options adamw_default{.lr = 0.01, .weight_decay = 1e-2};

// The layers' parameters as a model, for partrain's optimizers and clipping on the reference.
struct layer_params {
  struct ref {
    models::layers::host_param* p;
    [[nodiscard]] tensor_view<float> value() const { return p->value(); }
    [[nodiscard]] tensor_view<float> grad() const { return p->grad(); }
  };
  std::vector<ref> refs;
  explicit layer_params(host_model& m) {
    for (auto& l : m) {
      for (auto& p : l->parameters()) refs.push_back({&p});
    }
  }
  std::vector<ref>& parameters() { return refs; }
};

template <class M>
std::vector<float> flat_values(M& model) {
  std::vector<float> out;
  for (auto&& p : model.parameters()) {
    const auto v = p.value();
    out.insert(out.end(), v.begin(), v.end());
  }
  return out;
}

struct run_config {
  shard_optimizer_options opt = sgd_momentum;
  fsdp_options fsdp{};
  int micros = 1;  // > 1: micros - 1 no_sync micro-steps before each synchronizing one
};

// The rows every rank of every micro-step of one step sees, together.
synthetic_batch step_batch(int step, std::size_t rows) {
  return synthetic_batch(rows, widths.front(), 3, 1000 + static_cast<std::uint32_t>(step));
}

struct reference_result {
  std::vector<float> values;
  std::vector<double> norms;
};

// One process on the global batch: the whole step's rows in one backward (the mean over them
// equals the mean of the ranks' and micro-steps' means: every part has per_rank rows).
reference_result reference_run(int world, const run_config& c) {
  host_model m = make_mlp(widths, seed);
  layer_params params(m);
  reference_result r;
  const auto rows = per_rank * static_cast<std::size_t>(world * c.micros);
  const dtype p16 = c.fsdp.param_dtype;
  auto body = [&](auto& opt) {
    for (int s = 0; s < steps; ++s) {
      const auto b = step_batch(s, rows);
      // A 16-bit param_dtype: forward and backward see the parameters rounded to it; the step
      // updates the fp32 masters.
      std::vector<float> masters;
      if (p16 != dtype::float32) {
        masters = flat_values(params);
        for (auto& p : params.parameters()) {
          for (auto& x : p.value()) x = p16 == dtype::bfloat16 ? static_cast<float>(bfloat16(x)) : static_cast<float>(half(x));
        }
      }
      (void)reference_step(m, softmax_cross_entropy{}, b.input(), b.labels());
      if (!masters.empty()) {
        std::size_t i = 0;
        for (auto& p : params.parameters()) {
          for (auto& x : p.value()) x = masters[i++];
        }
      }
      if (c.fsdp.max_grad_norm > 0) r.norms.push_back(clip_grad_norm(params, c.fsdp.max_grad_norm));
      opt.step();
    }
  };
  if (const auto* s = std::get_if<sgd_options>(&c.opt)) {
    sgd opt(params, *s);
    body(opt);
  } else {
    adamw opt(params, std::get<adamw_options>(c.opt));
    body(opt);
  }
  r.values = flat_values(params);
  return r;
}

struct rank_result {
  std::vector<float> values;
  std::vector<double> norms;
  fsdp_memory mem{};
  std::uint64_t bytes_per_step = 0;
};

// Rank r's rows of micro-step u: a contiguous block of the step's batch.
tensor_view<const float> rows_of(const synthetic_batch& b, std::size_t block) {
  return b.input().slice(block * per_rank, (block + 1) * per_rank);
}
tensor_view<const std::int32_t> labels_of(const synthetic_batch& b, std::size_t block) {
  return b.labels().slice(block * per_rank, (block + 1) * per_rank);
}

std::vector<rank_result> fsdp_run(int world, const run_config& c) {
  std::vector<rank_result> out(static_cast<std::size_t>(world));
  run_local(world, [&](local_group& g) {
    // Each rank starts from other values: the broadcast makes them rank 0's.
    host_model layers = make_mlp(widths, seed + static_cast<std::uint32_t>(g.rank()) * 100);
    fully_sharded_data_parallel f(layers, g, softmax_cross_entropy{}, c.opt, c.fsdp);
    auto& r = out[static_cast<std::size_t>(g.rank())];
    const auto rows = per_rank * static_cast<std::size_t>(world * c.micros);
    g.reset_traffic();
    for (int s = 0; s < steps; ++s) {
      const auto b = step_batch(s, rows);
      const auto block = [&](int u) { return static_cast<std::size_t>(u * world + g.rank()); };
      {
        auto guard = f.no_sync();
        for (int u = 0; u + 1 < c.micros; ++u) (void)f.train_step(rows_of(b, block(u)), labels_of(b, block(u)));
      }
      (void)f.train_step(rows_of(b, block(c.micros - 1)), labels_of(b, block(c.micros - 1)));
      if (c.fsdp.max_grad_norm > 0) r.norms.push_back(f.last_grad_norm());
    }
    r.bytes_per_step = g.traffic().bytes_sent / steps;
    r.mem = f.memory();
    auto full = f.summon_full_params();
    r.values = flat_values(full);
  });
  return out;
}

void check_equal_to_reference(const std::vector<rank_result>& got, const reference_result& ref, double tol) {
  for (std::size_t r = 0; r < got.size(); ++r) {
    CAPTURE(r);
    REQUIRE(got[r].values.size() == ref.values.size());
    CHECK(got[r].values == got[0].values);  // every rank gathers the same chunks
    for (std::size_t i = 0; i < ref.values.size(); ++i) {
      CAPTURE(i);
      CHECK(got[r].values[i] == Approx(ref.values[i]).margin(tol));
    }
  }
}

std::size_t chunk_of(std::size_t n, int world) { return fl::chunking(n, static_cast<std::size_t>(world)).chunk(); }

// Layer sizes of `widths`' MLP (its units).
std::vector<std::size_t> unit_sizes(const std::vector<std::size_t>& w) {
  std::vector<std::size_t> s;
  for (std::size_t i = 0; i + 1 < w.size(); ++i) s.push_back(w[i] * w[i + 1] + w[i + 1]);
  return s;
}

}  // namespace

TEST_CASE("fsdp chunking: torch.chunk's split, padding only at the end", "[parallel][fsdp]") {
  STATIC_REQUIRE(fl::chunking_selftest());
  for (std::size_t n : {1u, 2u, 5u, 9u, 35u, 53u}) {
    for (std::size_t w : {1u, 2u, 3u, 4u, 7u}) {
      CAPTURE(n, w);
      const fl::chunking c(n, w);
      std::size_t covered = 0;
      for (std::size_t r = 0; r < w; ++r) {
        const auto o = c.owned(r);
        CHECK(o.begin == std::min(r * c.chunk(), n));
        CHECK(o.size() <= c.chunk());
        covered += o.size();
      }
      CHECK(covered == n);
      CHECK(c.padded() - n < w);
    }
  }
}

TEST_CASE("fsdp equals one process on the global batch at world sizes 1-4", "[parallel][fsdp]") {
  for (int world : {1, 2, 3, 4}) {
    for (bool reshard : {true, false}) {
      for (bool adam : {false, true}) {
        CAPTURE(world, reshard, adam);
        run_config c;
        c.fsdp.reshard_after_forward = reshard;
        if (adam) c.opt = adamw_default;
        const auto got = fsdp_run(world, c);
        check_equal_to_reference(got, reference_run(world, c), 2e-5);
      }
    }
  }
}

TEST_CASE("fsdp without prefetch takes the same steps", "[parallel][fsdp]") {
  run_config c;
  c.fsdp.prefetch = false;
  check_equal_to_reference(fsdp_run(3, c), reference_run(3, c), 2e-5);
}

TEST_CASE("fsdp clips the global gradient norm across the ranks' chunks", "[parallel][fsdp]") {
  for (int world : {2, 4}) {
    CAPTURE(world);
    run_config c;
    c.opt = adamw_default;
    c.fsdp.max_grad_norm = 0.01;  // below every step's norm here: each step is clipped
    const auto got = fsdp_run(world, c);
    const auto ref = reference_run(world, c);
    check_equal_to_reference(got, ref, 2e-5);
    for (const auto& r : got) {
      REQUIRE(r.norms.size() == ref.norms.size());
      for (std::size_t s = 0; s < ref.norms.size(); ++s) {
        CHECK(ref.norms[s] > c.fsdp.max_grad_norm);
        CHECK(r.norms[s] == Approx(ref.norms[s]).epsilon(1e-5));
      }
    }
  }
}

TEST_CASE("fsdp no_sync accumulates whole gradients and reduces them once", "[parallel][fsdp]") {
  for (int world : {2, 3}) {
    for (bool reshard : {true, false}) {
      CAPTURE(world, reshard);
      run_config c;
      c.micros = 3;
      c.fsdp.reshard_after_forward = reshard;
      check_equal_to_reference(fsdp_run(world, c), reference_run(world, c), 2e-5);
    }
  }
}

TEST_CASE("fsdp no_sync holds a whole model of gradients and sends no gradient", "[parallel][fsdp]") {
  constexpr int world = 2;
  const auto sizes = unit_sizes(widths);
  struct seen {
    std::size_t before = 0, inside = 0, after = 0;
    std::uint64_t sent_inside = 0;
    std::int64_t steps = 0;
  };
  std::vector<seen> got(world);  // filled by the ranks, checked here (Catch2 asserts on one thread)
  run_local(world, [&](local_group& g) {
    host_model layers = make_mlp(widths, seed);
    fully_sharded_data_parallel f(layers, g, softmax_cross_entropy{}, sgd_momentum);
    const auto b = step_batch(0, per_rank * world);
    const auto mine = static_cast<std::size_t>(g.rank());
    auto& r = got[mine];
    r.before = f.memory().gradient_bytes;
    g.reset_traffic();
    {
      auto guard = f.no_sync();
      (void)f.train_step(rows_of(b, mine), labels_of(b, mine));
    }
    r.inside = f.memory().gradient_bytes;
    r.sent_inside = g.traffic().bytes_sent;
    (void)f.train_step(rows_of(b, mine), labels_of(b, mine));
    r.after = f.memory().gradient_bytes;
    r.steps = f.steps();
  });
  std::size_t whole = 0, chunks = 0;
  std::uint64_t gathers = 0;  // forward's all_gathers, and backward's for every layer but the last
  for (std::size_t u = 0; u < sizes.size(); ++u) {
    whole += chunk_of(sizes[u], world) * world * sizeof(float);
    chunks += chunk_of(sizes[u], world) * sizeof(float);
    gathers += (u + 1 < sizes.size() ? 2 : 1) * (world - 1) * chunk_of(sizes[u], world) * sizeof(float);
  }
  for (const auto& r : got) {
    CHECK(r.before == chunks);
    CHECK(r.inside == chunks + whole);
    CHECK(r.sent_inside == gathers);
    CHECK(r.after == chunks);
    CHECK(r.steps == 1);
  }
}

TEST_CASE("fsdp evaluates ranks with different numbers of batches", "[parallel][fsdp]") {
  // Rank 0 holds 2 batches, rank 1 one, rank 2 none: the sums equal one process over all rows.
  const synthetic_batch all(3 * per_rank, widths.front(), 3, 77);
  host_model ref = make_mlp(widths, seed);
  const eval_result want = reference_eval(ref, softmax_cross_entropy{}, all.input(), all.labels());
  struct seen {
    eval_result result;
    std::size_t held = 0, after = 0, peak = 0;
  };
  std::vector<seen> got(3);
  run_local(3, [&](local_group& g) {
    host_model layers = make_mlp(widths, seed);
    fully_sharded_data_parallel f(layers, g, softmax_cross_entropy{}, sgd_momentum);
    std::vector<batch> mine;
    if (g.rank() == 0) {
      mine.push_back({rows_of(all, 0), labels_of(all, 0), {}});
      mine.push_back({rows_of(all, 1), labels_of(all, 1), {}});
    } else if (g.rank() == 1) {
      mine.push_back({rows_of(all, 2), labels_of(all, 2), {}});
    }
    auto& r = got[static_cast<std::size_t>(g.rank())];
    r.held = f.memory().parameter_bytes;
    r.result = f.evaluate(mine);
    r.after = f.memory().parameter_bytes;
    r.peak = f.memory().peak_parameter_bytes;
  });
  for (const auto& r : got) {
    CHECK(r.result.count == want.count);
    CHECK(r.result.correct == want.correct);
    CHECK(r.result.loss_sum == Approx(want.loss_sum).epsilon(1e-6));
    CHECK(r.peak > r.held);     // every rank gathered, the one without batches too
    CHECK(r.after == r.held);  // and evaluation leaves only the chunks held
  }
}

TEST_CASE("fsdp peak parameter bytes: chunks plus the layers gathered at once", "[parallel][fsdp]") {
  // Twelve linear layers 9 -> 9 (90 elements each: chunks 23, 23, 23, 21 at world 4).
  const std::vector<std::size_t> deep(13, 9);
  constexpr int world = 4;
  const std::size_t unit = 90, chunk = 23, units = 12;
  const std::size_t chunk_bytes = units * chunk * sizeof(float);
  const std::size_t gathered = chunk * world * sizeof(float);
  const std::size_t whole = units * unit * sizeof(float);
  auto peak_of = [&](fsdp_options o, shard_optimizer_options opt) {
    std::vector<fsdp_memory> mems(world);
    run_local(world, [&](local_group& g) {
      host_model layers = make_mlp(deep, seed);
      fully_sharded_data_parallel f(layers, g, softmax_cross_entropy{}, opt, o);
      const synthetic_batch b(per_rank, 9, 9, 5 + static_cast<std::uint32_t>(g.rank()));
      for (int s = 0; s < 2; ++s) (void)f.train_step(b.input(), b.labels());
      mems[static_cast<std::size_t>(g.rank())] = f.memory();
    });
    return mems;
  };
  SECTION("reshard after forward, prefetch: at most two layers, under half the model") {
    const auto mems = peak_of({}, adamw_default);
    std::size_t elements = 0;
    for (const auto& m : mems) {
      CHECK(m.unsharded_parameter_bytes == whole);
      CHECK(m.peak_parameter_bytes == chunk_bytes + 2 * gathered);
      CHECK(static_cast<double>(m.peak_parameter_bytes) <= 0.5 * static_cast<double>(m.unsharded_parameter_bytes));
      CHECK(m.parameter_bytes == chunk_bytes);  // between steps: only the chunks
      CHECK(m.optimizer_state_bytes == 2 * m.shard_elements * sizeof(float));  // AdamW: two moments of the chunks
      // Whole gradients: the one in backward plus at most two reduce_scatters in flight.
      CHECK(m.peak_gradient_bytes <= chunk_bytes + 3 * gathered);
      CHECK(m.peak_gradient_bytes >= chunk_bytes + gathered);
      CHECK(m.padding_elements == units * (world * chunk - unit));
      elements += m.shard_elements;
    }
    CHECK(elements == units * unit);
  }
  SECTION("no prefetch: one layer at a time") {
    for (const auto& m : peak_of({.prefetch = false}, sgd_momentum)) CHECK(m.peak_parameter_bytes == chunk_bytes + gathered);
  }
  SECTION("kept from forward to backward: the whole model is held at the turn") {
    for (const auto& m : peak_of({.reshard_after_forward = false}, sgd_momentum)) {
      CHECK(m.peak_parameter_bytes == chunk_bytes + units * gathered);
      CHECK(m.peak_parameter_bytes > m.unsharded_parameter_bytes);
    }
  }
}

TEST_CASE("fsdp sends three passes of the parameters per step, two when kept from forward to backward", "[parallel][fsdp]") {
  constexpr int world = 4;
  const auto sizes = unit_sizes(widths);
  std::uint64_t pass = 0;  // one all_gather (or reduce_scatter) of every layer: (n-1) chunks each
  for (auto n : sizes) pass += (world - 1) * chunk_of(n, world) * sizeof(float);
  const std::uint64_t last = (world - 1) * chunk_of(sizes.back(), world) * sizeof(float);
  for (bool reshard : {true, false}) {
    CAPTURE(reshard);
    run_config c;
    c.fsdp.reshard_after_forward = reshard;
    // The last layer is never resharded between its forward and its backward.
    const std::uint64_t want = reshard ? 3 * pass - last : 2 * pass;
    for (const auto& r : fsdp_run(world, c)) CHECK(r.bytes_per_step == want);
  }
}

TEST_CASE("fsdp units of several layers: the same steps in fewer, larger collectives", "[parallel][fsdp][units]") {
  // widths' layers: 0 linear (35 elements), 1 relu, 2 linear (18), 3 relu, 4 linear (8), 5 relu,
  // 6 linear (9). A unit closes once it holds min_unit_elements; the rest is the last unit.
  struct grouping {
    std::size_t min;
    std::vector<std::pair<std::size_t, std::size_t>> layers;
    std::vector<std::size_t> sizes;
  };
  const std::vector<grouping> groupings{{0, {{0, 0}, {2, 2}, {4, 4}, {6, 6}}, {35, 18, 8, 9}},
                                        {20, {{0, 0}, {2, 4}, {6, 6}}, {35, 26, 9}},
                                        {40, {{0, 2}, {4, 6}}, {53, 17}},
                                        {1000, {{0, 6}}, {70}}};
  for (const auto& gr : groupings) {
    CAPTURE(gr.min);
    std::vector<std::vector<std::pair<std::size_t, std::size_t>>> seen(2);
    run_local(2, [&](local_group& g) {
      host_model layers = make_mlp(widths, seed);
      fully_sharded_data_parallel f(layers, g, softmax_cross_entropy{}, sgd_momentum, {.min_unit_elements = gr.min});
      for (std::size_t u = 0; u < f.units(); ++u) seen[static_cast<std::size_t>(g.rank())].push_back(f.unit_layers(u));
    });
    CHECK(seen[0] == gr.layers);
    for (int world : {1, 2, 3, 4}) {
      for (bool reshard : {true, false}) {
        CAPTURE(world, reshard);
        run_config c;
        c.fsdp.min_unit_elements = gr.min;
        c.fsdp.reshard_after_forward = reshard;
        const auto got = fsdp_run(world, c);
        check_equal_to_reference(got, reference_run(world, c), 2e-5);
        // Three passes of each unit (two when kept), the last unit never resharded in between.
        const auto n = static_cast<std::uint64_t>(world);
        std::uint64_t pass = 0;
        for (auto e : gr.sizes) pass += (n - 1) * chunk_of(e, world) * sizeof(float);
        const std::uint64_t last = (n - 1) * chunk_of(gr.sizes.back(), world) * sizeof(float);
        CHECK(got[0].bytes_per_step == (reshard ? 3 * pass - last : 2 * pass));
        std::size_t padding = 0;
        for (auto e : gr.sizes) padding += chunk_of(e, world) * static_cast<std::size_t>(world) - e;
        CHECK(got[0].mem.padding_elements == padding);
      }
    }
    run_config c;
    c.fsdp.min_unit_elements = gr.min;
    c.fsdp.max_grad_norm = 0.05;
    c.micros = 2;
    c.opt = adamw_default;
    check_equal_to_reference(fsdp_run(3, c), reference_run(3, c), 2e-5);
  }
}

TEST_CASE("fsdp mixed precision: 16-bit gathers compute with rounded parameters, the masters stay fp32", "[parallel][fsdp][precision]") {
  for (const dtype p16 : {dtype::bfloat16, dtype::float16}) {
    for (int world : {1, 2, 3}) {
      CAPTURE(to_string(p16), world);
      run_config c;
      c.fsdp.param_dtype = p16;
      const auto got = fsdp_run(world, c);
      // The reference rounds the parameters before each forward and steps the fp32 masters; the
      // summoned values are the masters (summon_full_params gathers fp32).
      check_equal_to_reference(got, reference_run(world, c), 2e-5);
      const auto fp32 = reference_run(world, run_config{});
      double far = 0;
      for (std::size_t i = 0; i < fp32.values.size(); ++i) far = std::max(far, std::fabs(double(got[0].values[i]) - fp32.values[i]));
      CHECK(far > 2e-6);  // the rounding reached the computation (fp32 runs agree to about 1e-7)
    }
  }
}

TEST_CASE("fsdp mixed precision: 16-bit reductions stay within their rounding of the fp32 run", "[parallel][fsdp][precision]") {
  for (const dtype r16 : {dtype::bfloat16, dtype::float16}) {
    for (int world : {1, 2, 3}) {
      CAPTURE(to_string(r16), world);
      run_config c;
      c.fsdp.reduce_dtype = r16;
      // Each rank's gradient rounded to 16 bits and summed in them: about 2^-9 (bf16) of each
      // update, carried by momentum over 5 steps.
      check_equal_to_reference(fsdp_run(world, c), reference_run(world, c), 1e-3);
    }
  }
}

namespace {

// The cross-entropy with its gradient multiplied by `factor`: with 2^-24 the gradients are small
// enough that a float16 reduction flushes them to zero unless the loss is scaled.
struct tiny_gradient_loss {
  float factor = 1.0f;
  double forward_backward(tensor_view<const float> z, tensor_view<const std::int32_t> y, tensor_view<float> g,
                          float scale) const {
    return softmax_cross_entropy{}.forward_backward(z, y, g, scale * factor);
  }
  eval_result evaluate(tensor_view<const float> z, tensor_view<const std::int32_t> y) const {
    return softmax_cross_entropy{}.evaluate(z, y);
  }
};

struct amp_rank {
  std::vector<float> values;
  std::vector<int> skipped;
  std::vector<float> scales;
};

// AdamW, whose step hardly depends on the gradients' size, so tiny gradients still move the
// parameters; with `scaling`, every step is amp_step with a grad scaler of those options.
std::vector<amp_rank> fsdp_amp_run(int world, dtype reduce, std::optional<grad_scaler_options> scaling, float factor) {
  std::vector<amp_rank> out(static_cast<std::size_t>(world));
  run_local(world, [&](local_group& g) {
    host_model layers = make_mlp(widths, seed);
    fully_sharded_data_parallel f(layers, g, tiny_gradient_loss{factor}, adamw_options{.lr = 0.01, .eps = 1e-10},
                                  {.reduce_dtype = reduce});
    std::optional<grad_scaler> scaler;
    if (scaling) scaler.emplace(*scaling);
    auto& r = out[static_cast<std::size_t>(g.rank())];
    for (int s = 0; s < steps; ++s) {
      const auto b = step_batch(s, per_rank * static_cast<std::size_t>(world));
      const auto me = static_cast<std::size_t>(g.rank());
      const batch mine{rows_of(b, me), labels_of(b, me), {}};
      if (scaler) {
        const amp_step_result a = amp_step(f, *scaler, mine);
        r.skipped.push_back(a.skipped ? 1 : 0);
        r.scales.push_back(a.scale);
      } else {
        (void)f.train_step(mine);
      }
    }
    auto full = f.summon_full_params();
    r.values = flat_values(full);
  });
  return out;
}

double max_difference(const std::vector<float>& a, const std::vector<float>& b) {
  double d = 0;
  for (std::size_t i = 0; i < a.size(); ++i) d = std::max(d, std::fabs(double(a[i]) - b[i]));
  return d;
}

}  // namespace

TEST_CASE("fsdp with a grad scaler: float16 reductions keep gradients that would underflow", "[parallel][fsdp][precision][amp]") {
  constexpr int world = 3;
  const float tiny = std::ldexp(1.0f, -24);
  const auto exact = fsdp_amp_run(world, dtype::float32, std::nullopt, tiny);
  const auto scaled = fsdp_amp_run(world, dtype::float16, grad_scaler_options{.init_scale = std::ldexp(1.0f, 24)}, tiny);
  const auto flushed = fsdp_amp_run(world, dtype::float16, std::nullopt, tiny);
  const double with_scale = max_difference(scaled[0].values, exact[0].values);
  const double without = max_difference(flushed[0].values, exact[0].values);
  CAPTURE(with_scale, without);
  CHECK(with_scale < 1e-3);      // float16's rounding of the scaled gradients
  CHECK(without > 20 * with_scale);  // unscaled, the reductions returned zeros: AdamW never moved
  for (const auto& r : scaled) {
    CHECK(r.values == scaled[0].values);
    CHECK(r.skipped == std::vector<int>(steps, 0));
    CHECK(r.scales == std::vector<float>(steps, std::ldexp(1.0f, 24)));
  }
}

TEST_CASE("fsdp with a grad scaler: an overflow skips the step on every rank and backs the scale off", "[parallel][fsdp][precision][amp]") {
  constexpr int world = 3;
  // Gradients of about 1e-2 times 2^40 are far past float16's 65504: every step overflows.
  const auto got = fsdp_amp_run(world, dtype::float16, grad_scaler_options{.init_scale = std::ldexp(1.0f, 40)}, 1.0f);
  host_model untouched = make_mlp(widths, seed);
  layer_params untouched_params(untouched);
  const auto initial = flat_values(untouched_params);
  std::vector<float> halving;
  for (int s = 0; s < steps; ++s) halving.push_back(std::ldexp(1.0f, 40 - s));
  for (const auto& r : got) {
    CHECK(r.skipped == std::vector<int>(steps, 1));
    CHECK(r.scales == halving);
    CHECK(r.values == initial);  // no step reached the chunks
  }
  // Then a scale float16 holds: the steps run (and agree).
  const auto fine = fsdp_amp_run(world, dtype::float16, grad_scaler_options{.init_scale = 1024.0f}, 1.0f);
  for (const auto& r : fine) {
    CHECK(r.skipped == std::vector<int>(steps, 0));
    CHECK(r.values == fine[0].values);
    CHECK(r.values != initial);
  }
}

TEST_CASE("fsdp mixed precision: 16-bit gathers and reductions send half the bytes", "[parallel][fsdp][precision]") {
  constexpr int world = 4;
  const auto sizes = unit_sizes(widths);
  std::uint64_t pass = 0;  // one fp32 all_gather (or reduce_scatter) of every layer
  for (auto n : sizes) pass += (world - 1) * chunk_of(n, world) * sizeof(float);
  const std::uint64_t last = (world - 1) * chunk_of(sizes.back(), world) * sizeof(float);
  for (const dtype p16 : {dtype::float32, dtype::bfloat16}) {
    for (const dtype r16 : {dtype::float32, dtype::float16}) {
      CAPTURE(to_string(p16), to_string(r16));
      run_config c;
      c.fsdp.param_dtype = p16;
      c.fsdp.reduce_dtype = r16;
      const std::uint64_t gathers = (2 * pass - last) / (p16 == dtype::float32 ? 1 : 2);
      const std::uint64_t scatters = pass / (r16 == dtype::float32 ? 1 : 2);
      for (const auto& r : fsdp_run(world, c)) CHECK(r.bytes_per_step == gathers + scatters);
    }
  }
  run_local(1, [&](local_group& g) {
    host_model layers = make_mlp(widths, seed);
    for (const char* which : {"param_dtype", "reduce_dtype"}) {
      fsdp_options o;
      (std::string_view(which) == "param_dtype" ? o.param_dtype : o.reduce_dtype) = dtype::int32;
      CHECK_THROWS_WITH(fully_sharded_data_parallel(layers, g, softmax_cross_entropy{}, sgd_momentum, o),
                        Catch::Contains(std::string("fsdp_options::") + which + " must be float32, float16 or bfloat16, got int32"));
    }
  });
}

TEST_CASE("fsdp: a model that differs between ranks is named", "[parallel][fsdp]") {
  SECTION("another layer count") {
    CHECK_THROWS_WITH(run_local(2, [&](local_group& g) {
      host_model layers = make_mlp(g.rank() == 1 ? std::vector<std::size_t>{6, 5, 3, 2, 2, 3} : widths, seed);
      fully_sharded_data_parallel f(layers, g, softmax_cross_entropy{}, sgd_momentum);
    }), Catch::Contains("rank 1 has 9 layers") && Catch::Contains("rank 0 has 7") &&
            Catch::Contains("same model on every rank"));
  }
  SECTION("other shapes, the same layer count") {
    CHECK_THROWS_AS(run_local(2, [&](local_group& g) {
      host_model layers = make_mlp(g.rank() == 1 ? std::vector<std::size_t>{6, 4, 3, 2, 3} : widths, seed);
      fully_sharded_data_parallel f(layers, g, softmax_cross_entropy{}, sgd_momentum);
    }), config_error);
    CHECK_THROWS_WITH(run_local(2, [&](local_group& g) {
      host_model layers = make_mlp(g.rank() == 1 ? std::vector<std::size_t>{6, 4, 3, 2, 3} : widths, seed);
      fully_sharded_data_parallel f(layers, g, softmax_cross_entropy{}, sgd_momentum);
    }), Catch::Contains("(other shapes)"));
  }
}

// What f() threw ("" when it did not): ranks record it, the test thread checks it.
template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

TEST_CASE("fsdp with a grad scaler: join and a bad loss scale are refused, naming them", "[parallel][fsdp][precision][amp]") {
  std::string join_error, scale_error;
  run_local(1, [&](local_group& g) {
    host_model layers = make_mlp(widths, seed);
    fully_sharded_data_parallel f(layers, g, softmax_cross_entropy{}, sgd_momentum, {.join = true});
    grad_scaler scaler;
    const auto b = step_batch(0, per_rank);
    join_error = error_of([&] { (void)amp_step(f, scaler, batch{b.input(), b.labels(), {}}); });
    scale_error = error_of([&] { f.set_loss_scale(0.0f); });
  });
  CHECK_THAT(join_error, Catch::Contains("join") && Catch::Contains("grad scaler"));
  CHECK_THAT(scale_error, Catch::Contains("rank 0") && Catch::Contains("set_loss_scale") && Catch::Contains("> 0"));
}

TEST_CASE("fsdp_policy: a grad scaler makes each step amp_step and travels in the checkpoint", "[parallel][fsdp][amp][checkpoint]") {
  partrain::testing::temp_dir dir;
  const auto ck = dir.path / "amp.ckpt";
  // Catch's assertions are not thread-safe: the ranks record, the test thread checks.
  std::vector<std::size_t> skipped(2);
  std::vector<float> saved_scale(2), loaded_scale(2);
  run_local(2, [&](local_group& g) {
    const auto r = static_cast<std::size_t>(g.rank());
    {
      host_model layers = make_mlp(widths, seed);
      fully_sharded_data_parallel f(layers, g, softmax_cross_entropy{}, adamw_default, {.reduce_dtype = dtype::float16});
      grad_scaler scaler({.init_scale = std::ldexp(1.0f, 40)});  // overflows float16 at every step
      fsdp_policy policy(f, {.scaler = &scaler});
      for (int s = 0; s < 3; ++s) {
        const auto b = step_batch(s, 2 * per_rank);
        (void)policy.train_step(batch{rows_of(b, r), labels_of(b, r), {}});
      }
      skipped[r] = policy.skipped_steps();
      saved_scale[r] = scaler.scale();
      policy.save_checkpoint(ck, {.step = 3});
    }
    host_model layers = make_mlp(widths, seed + 1);
    fully_sharded_data_parallel f(layers, g, softmax_cross_entropy{}, adamw_default, {.reduce_dtype = dtype::float16});
    grad_scaler fresh({.init_scale = 1.0f});
    fsdp_policy resumed(f, {.scaler = &fresh});
    (void)resumed.load_checkpoint(ck);
    loaded_scale[r] = fresh.scale();
  });
  CHECK(skipped == std::vector<std::size_t>{3, 3});
  CHECK(saved_scale == std::vector<float>(2, std::ldexp(1.0f, 37)));
  CHECK(loaded_scale == saved_scale);
}

TEST_CASE("fsdp: bad input is refused with its reason, and the step leaves nothing gathered", "[parallel][fsdp]") {
  struct seen {
    std::string wrong_width, wrong_rows, empty, summoned;
    std::size_t held = 0, after_wrong = 0, while_summoned = 0, after_summoned = 0;
    double loss = 0;
    std::int64_t steps = 0;
  };
  std::vector<seen> got(2);
  run_local(2, [&](local_group& g) {
    host_model layers = make_mlp(widths, seed);
    fully_sharded_data_parallel f(layers, g, softmax_cross_entropy{}, sgd_momentum);
    auto& r = got[static_cast<std::size_t>(g.rank())];
    r.held = f.memory().parameter_bytes;
    const synthetic_batch wrong(per_rank, 7, 3, 1);  // 7 features, the first layer takes 6
    r.wrong_width = error_of([&] { (void)f.train_step(wrong.input(), wrong.labels()); });
    r.after_wrong = f.memory().parameter_bytes;
    const synthetic_batch good(per_rank, 6, 3, 1);
    r.wrong_rows = error_of([&] { (void)f.train_step(good.input(), good.labels().slice(0, 3)); });
    r.empty = error_of([&] { (void)f.train_step(tensor_view<const float>{}, good.labels()); });
    {
      auto full = f.summon_full_params();
      r.while_summoned = f.memory().parameter_bytes;
      r.summoned = error_of([&] { (void)f.train_step(good.input(), good.labels()); });
    }
    r.after_summoned = f.memory().parameter_bytes;
    r.loss = f.train_step(good.input(), good.labels());  // the model still trains after the refusals
    r.steps = f.steps();
  });
  for (const auto& r : got) {
    CHECK_THAT(r.wrong_width, Catch::Contains("layer 0") && Catch::Contains("expected [batch, 6]"));
    CHECK(r.after_wrong == r.held);
    CHECK_THAT(r.wrong_rows, Catch::Contains("the input has 4 rows, the target 3"));
    CHECK_THAT(r.empty, Catch::Contains("the input batch is empty"));
    CHECK(r.while_summoned > r.held);
    CHECK_THAT(r.summoned, Catch::Contains("summon_full_params"));
    CHECK(r.after_summoned == r.held);
    CHECK(std::isfinite(r.loss));
    CHECK(r.steps == 1);
  }
  CHECK_THROWS_WITH(run_local(1, [&](local_group& g) {
    host_model layers = make_mlp(widths, seed);
    fully_sharded_data_parallel f(layers, g, softmax_cross_entropy{}, sgd_momentum, {.max_grad_norm = -1});
  }), Catch::Contains("max_grad_norm must be a finite number >= 0"));
  CHECK_THROWS_WITH(run_local(1, [&](local_group& g) {
    host_model layers;
    fully_sharded_data_parallel f(layers, g, softmax_cross_entropy{}, sgd_momentum);
  }), Catch::Contains("the model has no layers"));
}

TEST_CASE("fsdp owns the layers' storage: empty outside compute, whole under summon_full_params", "[parallel][fsdp]") {
  struct seen {
    std::size_t stored = 1, relu = 1, first = 0;
    std::vector<float> values;
    std::uint64_t checksum = 0;
  };
  std::vector<seen> got(2);
  run_local(2, [&](local_group& g) {
    host_model layers = make_mlp(widths, seed + static_cast<std::uint32_t>(g.rank()));
    fully_sharded_data_parallel f(layers, g, softmax_cross_entropy{}, sgd_momentum);
    auto& r = got[static_cast<std::size_t>(g.rank())];
    r.stored = 0;
    for (auto& l : layers) {
      for (auto& p : l->parameters()) r.stored += p.value().size() + p.grad().size();
    }
    r.relu = f.owned(1).size();
    r.first = f.owned(0).size();
    auto full = f.summon_full_params();
    r.values = flat_values(full);
    r.checksum = parameter_checksum(full);
  });
  host_model rank0 = make_mlp(widths, seed);
  layer_params want(rank0);
  for (std::size_t q = 0; q < got.size(); ++q) {
    CAPTURE(q);
    CHECK(got[q].stored == 0);
    CHECK(got[q].relu == 0);
    CHECK(got[q].first == (q == 0 ? 18u : 17u));   // 35 elements: chunks of 18
    CHECK(got[q].values == flat_values(want));     // rank 0's values, broadcast
    CHECK(got[q].checksum == parameter_checksum(want));
  }
}

namespace {

// Checkpoints: a global batch of 12 rows per step, split evenly over 2, 3 or 4 ranks, so runs at
// different world sizes take the same steps.
constexpr std::size_t ck_rows = 12;

// Steps [from, to) at `world` with AdamW, loading `load` first and saving to `save` after (when
// given); every parameter value at the end.
std::vector<float> ck_run(int world, int from, int to, const std::filesystem::path& load = {},
                          const std::filesystem::path& save = {}, std::size_t min_unit = 0) {
  std::vector<float> out;
  std::mutex mu;
  run_local(world, [&](local_group& g) {
    host_model layers = make_mlp(widths, seed + (load.empty() ? 0u : 7u));  // a load replaces the values
    fully_sharded_data_parallel f(layers, g, softmax_cross_entropy{}, adamw_default, {.min_unit_elements = min_unit});
    if (!load.empty() && load_sharded_checkpoint(f, load).step != static_cast<std::uint64_t>(from)) {
      throw std::runtime_error("the checkpoint is not from step " + std::to_string(from));
    }
    const std::size_t per = ck_rows / static_cast<std::size_t>(world);
    const auto r = static_cast<std::size_t>(g.rank());
    for (int s = from; s < to; ++s) {
      const auto b = step_batch(s, ck_rows);
      (void)f.train_step(b.input().slice(r * per, (r + 1) * per), b.labels().slice(r * per, (r + 1) * per));
    }
    if (!save.empty()) save_sharded_checkpoint(f, save, {.epoch = 1, .step = static_cast<std::uint64_t>(to)});
    auto full = f.summon_full_params();
    if (g.rank() == 0) {
      std::lock_guard lock(mu);
      out = flat_values(full);
    }
  });
  return out;
}

}  // namespace

TEST_CASE("fsdp checkpoint: saved at world 3, resumed at 3 bit for bit and at 2 and 4 within rounding",
          "[parallel][fsdp][checkpoint]") {
  partrain::testing::temp_dir dir;
  const auto ck = dir.path / "run" / "fsdp.ckpt";
  const auto straight = ck_run(3, 0, 6);
  (void)ck_run(3, 0, 3, {}, ck);
  // One shard per rank (each holding its chunk of every layer) and the index.
  std::size_t shards = 0;
  for (const auto& e : std::filesystem::directory_iterator(ck.parent_path())) {
    shards += e.path().filename().string().find(".shard-") != std::string::npos ? 1 : 0;
  }
  CHECK(shards == 3);
  CHECK(ck_run(3, 3, 6, ck) == straight);
  for (int world : {2, 4, 1}) {
    CAPTURE(world);
    const auto resumed = ck_run(world, 3, 6, ck);
    REQUIRE(resumed.size() == straight.size());
    // Another world size sums the ranks' gradients in another grouping: float rounding only.
    for (std::size_t i = 0; i < straight.size(); ++i) CHECK(resumed[i] == Approx(straight[i]).epsilon(1e-4).margin(1e-6));
  }
}

TEST_CASE("fsdp checkpoint: single-layer units resume in units of several layers, and back", "[parallel][fsdp][checkpoint][units]") {
  partrain::testing::temp_dir dir;
  const auto straight = ck_run(2, 0, 6);
  for (const std::size_t saved : {std::size_t{0}, std::size_t{40}}) {
    CAPTURE(saved);
    const auto ck = dir.path / ("fsdp-" + std::to_string(saved) + ".ckpt");
    (void)ck_run(2, 0, 3, {}, ck, saved);
    const auto resumed = ck_run(2, 3, 6, ck, {}, saved == 0 ? 40 : 0);
    REQUIRE(resumed.size() == straight.size());
    // Other units reduce other groupings of elements in one reduce_scatter: float rounding only.
    for (std::size_t i = 0; i < straight.size(); ++i) CHECK(resumed[i] == Approx(straight[i]).epsilon(1e-4).margin(1e-6));
  }
}

TEST_CASE("fsdp checkpoint: loads into a replicated model and optimizer, and consolidates", "[parallel][fsdp][checkpoint]") {
  partrain::testing::temp_dir dir;
  const auto ck = dir.path / "fsdp.ckpt";
  const auto saved = ck_run(2, 0, 3, {}, ck);
  const auto straight = ck_run(2, 0, 5);
  // The same layers on one process, stepped by a replicated AdamW from the checkpoint's state.
  host_model m = make_mlp(widths, seed + 99);
  layer_params params(m);
  adamw opt(params, adamw_default);
  CHECK(load_sharded_checkpoint(ck, params, opt).step == 3u);
  CHECK(flat_values(params) == saved);
  CHECK(opt.steps() == 3);
  for (int s = 3; s < 5; ++s) {
    const auto b = step_batch(s, ck_rows);
    (void)reference_step(m, softmax_cross_entropy{}, b.input(), b.labels());
    opt.step();
  }
  const auto replica = flat_values(params);
  REQUIRE(replica.size() == straight.size());
  for (std::size_t i = 0; i < replica.size(); ++i) CHECK(replica[i] == Approx(straight[i]).epsilon(1e-4).margin(1e-6));

  // One ordinary checkpoint file, as the replicated model would have written it.
  const auto whole = dir.path / "whole.ckpt";
  consolidate_sharded_checkpoint(ck, whole);
  host_model m2 = make_mlp(widths, seed + 5);
  layer_params params2(m2);
  adamw opt2(params2, adamw_default);
  (void)load_checkpoint(whole, params2, opt2);
  CHECK(flat_values(params2) == saved);
  CHECK(opt2.steps() == 3);
}

TEST_CASE("fsdp checkpoint: another model, a missing shard and another optimizer are refused, naming the file",
          "[parallel][fsdp][checkpoint]") {
  partrain::testing::temp_dir dir;
  const auto ck = dir.path / "fsdp.ckpt";
  (void)ck_run(2, 0, 1, {}, ck);
  const auto error_of_load = [&](const std::vector<std::size_t>& w, const shard_optimizer_options& o) {
    std::string msg;
    std::mutex mu;
    try {
      run_local(2, [&](local_group& g) {
        host_model layers = make_mlp(w, seed);
        fully_sharded_data_parallel f(layers, g, softmax_cross_entropy{}, o);
        (void)load_sharded_checkpoint(f, ck);
      });
    } catch (const checkpoint_error& e) {
      std::lock_guard lock(mu);
      msg = e.what();
    }
    return msg;
  };
  CHECK_THAT(error_of_load({6, 5, 3, 2, 2}, adamw_default), Catch::Contains("fsdp.ckpt") && Catch::Contains("was written for another model"));
  CHECK_THAT(error_of_load(widths, sgd_momentum), Catch::Contains("holds adamw optimizer state, this run steps with sgd"));
  std::filesystem::remove(dir.path / "fsdp.ckpt.step-1.shard-1-of-2");
  CHECK_THAT(error_of_load(widths, adamw_default), Catch::Contains("shard-1-of-2") && Catch::Contains("which is missing"));
}

TEST_CASE("fsdp join: ranks with fewer batches shadow the others and stay one model", "[parallel][fsdp][join]") {
  const std::vector<int> counts{4, 3, 1};  // batches per rank: rank 2 joins after one step, rank 1 after three
  const int world = 3;
  for (bool initial : {true, false}) {
    CAPTURE(initial);
    // One process on the active ranks' rows of each step; with divide_by_initial_world_size the
    // averaged gradient is that mean times active/world (the joined ranks add zeros).
    host_model ref = make_mlp(widths, seed);
    for (int s = 0; s < counts[0]; ++s) {
      std::size_t k = 0;
      for (int c : counts) k += c > s ? 1 : 0;
      const auto b = step_batch(s, per_rank * world);
      (void)reference_step(ref, softmax_cross_entropy{}, b.input().slice(0, k * per_rank), b.labels().slice(0, k * per_rank));
      partrain::test::sgd_step(ref, 0.1f * (initial ? static_cast<float>(k) / static_cast<float>(world) : 1.0f));
    }
    layer_params want(ref);
    std::vector<std::vector<float>> got(world);
    std::vector<int> shadowed(world, -1);
    std::vector<std::size_t> shadow_steps(world, 99);
    run_local(world, [&](local_group& g) {
      const auto r = static_cast<std::size_t>(g.rank());
      host_model layers = make_mlp(widths, seed + static_cast<std::uint32_t>(r) * 100);
      fully_sharded_data_parallel f(layers, g, softmax_cross_entropy{}, sgd_options{.lr = 0.1},
                                    {.join = true, .divide_by_initial_world_size = initial});
      for (int s = 0; s < counts[r]; ++s) {
        const auto b = step_batch(s, per_rank * world);
        (void)f.train_step(rows_of(b, r), labels_of(b, r));
      }
      shadowed[r] = f.join() ? 1 : 0;
      shadow_steps[r] = f.shadow_steps();
      auto full = f.summon_full_params();
      got[r] = flat_values(full);
    });
    CHECK(shadowed == std::vector<int>{0, 1, 1});
    CHECK(shadow_steps == std::vector<std::size_t>{0, 1, 3});
    const auto ref_values = flat_values(want);
    for (std::size_t r = 0; r < got.size(); ++r) {
      CAPTURE(r);
      REQUIRE(got[r].size() == ref_values.size());
      CHECK(got[r] == got[0]);
      for (std::size_t i = 0; i < ref_values.size(); ++i) CHECK(got[r][i] == Approx(ref_values[i]).epsilon(1e-4).margin(1e-6));
    }
  }
}

TEST_CASE("fsdp join with 16-bit gathers and reductions: the ranks stay one model", "[parallel][fsdp][join][precision]") {
  const std::vector<int> counts{4, 3, 1};
  const int world = 3;
  host_model ref = make_mlp(widths, seed);  // fp32, the active ranks' rows, divided by the world size
  for (int s = 0; s < counts[0]; ++s) {
    std::size_t k = 0;
    for (int c : counts) k += c > s ? 1 : 0;
    const auto b = step_batch(s, per_rank * world);
    (void)reference_step(ref, softmax_cross_entropy{}, b.input().slice(0, k * per_rank), b.labels().slice(0, k * per_rank));
    partrain::test::sgd_step(ref, 0.1f * static_cast<float>(k) / static_cast<float>(world));
  }
  layer_params want(ref);
  std::vector<std::vector<float>> got(world);
  std::vector<std::size_t> shadow_steps(world, 99);
  run_local(world, [&](local_group& g) {
    const auto r = static_cast<std::size_t>(g.rank());
    host_model layers = make_mlp(widths, seed + static_cast<std::uint32_t>(r) * 100);
    fully_sharded_data_parallel f(layers, g, softmax_cross_entropy{}, sgd_options{.lr = 0.1},
                                  {.join = true, .param_dtype = dtype::bfloat16, .reduce_dtype = dtype::bfloat16});
    for (int s = 0; s < counts[r]; ++s) {
      const auto b = step_batch(s, per_rank * world);
      (void)f.train_step(rows_of(b, r), labels_of(b, r));
    }
    (void)f.join();
    shadow_steps[r] = f.shadow_steps();
    auto full = f.summon_full_params();
    got[r] = flat_values(full);
  });
  CHECK(shadow_steps == std::vector<std::size_t>{0, 1, 3});
  const auto ref_values = flat_values(want);
  for (std::size_t r = 0; r < got.size(); ++r) {
    CAPTURE(r);
    REQUIRE(got[r].size() == ref_values.size());
    CHECK(got[r] == got[0]);  // one model, bit for bit
    std::size_t off = 0;
    for (std::size_t i = 0; i < ref_values.size(); ++i) off += got[r][i] != Approx(ref_values[i]).margin(2e-3);
    CHECK(off == 0);  // the fp32 run, within bfloat16's rounding of parameters and gradients
  }
}

TEST_CASE("fsdp join: no_sync micro-steps of the others are shadowed too", "[parallel][fsdp][join]") {
  std::vector<std::vector<float>> got(2);
  std::vector<std::size_t> shadow_steps(2);
  run_local(2, [&](local_group& g) {
    const auto r = static_cast<std::size_t>(g.rank());
    host_model layers = make_mlp(widths, seed);
    fully_sharded_data_parallel f(layers, g, softmax_cross_entropy{}, adamw_default, {.max_grad_norm = 0.5, .join = true});
    for (int s = 0; s < (r == 0 ? 3 : 1); ++s) {
      const auto b = step_batch(s, per_rank * 4);
      {
        auto guard = f.no_sync();
        (void)f.train_step(rows_of(b, r), labels_of(b, r));
      }
      (void)f.train_step(rows_of(b, 2 + r), labels_of(b, 2 + r));
    }
    (void)f.join();
    shadow_steps[r] = f.shadow_steps();
    auto full = f.summon_full_params();
    got[r] = flat_values(full);
  });
  CHECK(shadow_steps == std::vector<std::size_t>{0, 2});
  CHECK(got[0] == got[1]);
  for (const float v : got[0]) CHECK(std::isfinite(v));
}

TEST_CASE("fsdp join: refused without the option; without join an early stop times out naming it", "[parallel][fsdp][join]") {
  CHECK_THROWS_WITH(run_local(1, [&](local_group& g) {
    host_model layers = make_mlp(widths, seed);
    fully_sharded_data_parallel f(layers, g, softmax_cross_entropy{}, sgd_momentum);
    (void)f.join();
  }), Catch::Contains("join() needs join enabled: construct with fsdp_options{.join = true}"));
  std::string msg;
  int rank = -1;
  try {
    run_local(
        2,
        [&](local_group& g) {
          const auto r = static_cast<std::size_t>(g.rank());
          host_model layers = make_mlp(widths, seed);
          fully_sharded_data_parallel f(layers, g, softmax_cross_entropy{}, sgd_momentum);
          for (int s = 0; s < (r == 0 ? 2 : 1); ++s) {
            const auto b = step_batch(s, per_rank * 2);
            (void)f.train_step(rows_of(b, r), labels_of(b, r));
          }
        },
        {.timeout = std::chrono::milliseconds(300)});
  } catch (const timeout_error& e) {
    msg = e.what();
    rank = e.rank();
  }
  CHECK_THAT(msg, Catch::Contains("rank 0 fully_sharded_data_parallel: parameter all_gather of layer 0"));
  CHECK_THAT(msg, Catch::Contains("fsdp_options{.join = true}"));
  CHECK(rank == 0);
}
