// bench_vit: the example Vision Transformer (models/vit_layers.hpp, vit_config{}: 16 tokens of 7x7
// patches, dim 64, depth 4, 4 heads, MLP 128; 139k parameters) on Fashion-MNIST, AdamW (lr 1e-3,
// weight decay 0.01), batch 64 per rank, one OpenBLAS thread per rank:
//   1. every parallel mode on 2 ranks as threads (local backend): DDP, ZeRO-2, FSDP, a 2-stage
//      1F1B pipeline of 4 micro-batches (the global batch of 128 split among them), post-local
//      SGD (parameters averaged every 8 steps) and DiLoCo (8 inner steps), each without and with
//      full activation recomputation: steady-state samples/s (the median of timed windows after
//      a warm-up, over alternated rounds of every row) and what a rank holds, by the library's own counters: activations (sequential::
//      activation_bytes, fsdp_memory::peak_activation_bytes, pipeline_step_stats::
//      peak_activation_bytes) and model state (parameters, gradients, the policy's gradient
//      buffers, AdamW's moments; DiLoCo's round-start copy and outer momentum)
//   2. one rank's step (train_step + AdamW) against its GEMMs alone (vit_gemms.hpp replays them,
//      same shapes and layout), in alternated rounds: vit_step_vs_gemm = step time / GEMM time
//   3. full recomputation on one rank (sequential alone, same batch): recompute_memory_ratio =
//      activation bytes with / without, recompute_time_ratio = step time with / without
//      (alternated windows, median of the rounds' ratios)
//   4. --train-epochs N: DDP on 2 ranks trains N epochs of the whole training set (the library's
//      distributed sampler, seed 0, drop_last; warmup_cosine_lr per step: 5% warm-up, then cosine
//      to 0) and reports the test accuracy (vit_test_accuracy). Each epoch prints
//      `epoch e/E samples/s X test_accuracy A` (samples/s after the epoch's first 10 steps),
//      the line bench/peers/compare_vit.py reads; --train-only skips 1 to 3.
//   --check-steps K: K AdamW steps (constant lr) on one process, on the first K batches rank 0
//      of 2 reads in epoch 0, printing `check step k loss L` (the loss before step k): what
//      compare_vit.py checks PyTorch's model against (step 0: the initial loss, the weights).
//   bench_vit [--quick] [--warmup N] [--steps N] [--windows N] [--rounds N] [--seed N]
//             [--mode ddp|zero2|fsdp|pipeline|local_sgd|diloco]... [--train-epochs N] [--train-only]
//             [--check-steps K]
#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <mutex>
#include <string>
#include <string_view>
#include <unistd.h>
#include <vector>

#include <partrain/comm/local.hpp>
#include <partrain/data/batch.hpp>
#include <partrain/data/distributed.hpp>
#include <partrain/data/fashion_mnist.hpp>
#include <partrain/data/loader.hpp>
#include <partrain/model/sequential.hpp>
#include <partrain/optim/adamw.hpp>
#include <partrain/parallel/ddp.hpp>
#include <partrain/parallel/diloco.hpp>
#include <partrain/parallel/fsdp.hpp>
#include <partrain/parallel/local_sgd.hpp>
#include <partrain/parallel/pipeline/stage.hpp>
#include <partrain/parallel/zero.hpp>
#include <partrain/train/lr_schedule.hpp>

#include "fashion_batches.hpp"
#include "vit_gemms.hpp"
#include "vit_layers.hpp"

namespace {

using namespace partrain;
using clock_type = std::chrono::steady_clock;
using model_t = sequential<models::layers::host_model, models::layers::softmax_cross_entropy>;

constexpr int world = 2;
constexpr std::int64_t sync_period = 8;  // post-local SGD's averaging period, DiLoCo's inner steps
const adamw_options adamw_opts{.lr = 1e-3, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8, .weight_decay = 0.01};
const recompute_options full_recompute{.every = 1, .layers = {}};

enum class mode { ddp, zero2, fsdp, pipeline, local_sgd, diloco };
constexpr mode all_modes[] = {mode::ddp, mode::zero2, mode::fsdp, mode::pipeline, mode::local_sgd, mode::diloco};

struct config {
  std::size_t batch = 64;    // per rank
  std::size_t warmup = 8;    // steps before the timed windows
  std::size_t steps = 16;    // per timed window (a multiple of 8: each holds the same syncs)
  std::size_t windows = 2;   // timed windows per mode and round
  std::size_t rounds = 4;    // alternated rounds (of the modes; of the one-rank figures)
  std::uint32_t seed = 0;    // make_vit's
  std::size_t depth = 4;     // transformer blocks (--depth; the example's 4 by default)
  std::size_t train_epochs = 0;
  bool train_only = false;
  std::size_t check_steps = 0;
  std::vector<mode> modes;   // the table's rows (--mode; all when none is named)
};

double seconds_since(clock_type::time_point t0) { return std::chrono::duration<double>(clock_type::now() - t0).count(); }

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t k = v.size() / 2;
  return v.size() % 2 ? v[k] : 0.5 * (v[k - 1] + v[k]);
}

double mib(std::size_t bytes) { return static_cast<double>(bytes) / (1024.0 * 1024.0); }

models::layers::vit_config vit_of(const config& c) {
  models::layers::vit_config v;
  v.depth = c.depth;
  return v;
}

model_t make_model(const config& c, bool recompute) {
  model_t m(models::layers::make_vit(vit_of(c), c.seed), models::layers::softmax_cross_entropy{});
  if (recompute) m.set_recompute(full_recompute);
  return m;
}

template <class M>
std::size_t parameter_count(M& m) {
  std::size_t n = 0;
  for (auto&& p : m.parameters()) n += p.value().size();
  return n;
}

// ---- 1: the modes on 2 ranks ----

constexpr const char* key(mode m) {
  switch (m) {
    case mode::ddp: return "ddp";
    case mode::zero2: return "zero2";
    case mode::fsdp: return "fsdp";
    case mode::pipeline: return "pipeline";
    case mode::local_sgd: return "local_sgd";
    case mode::diloco: return "diloco";
  }
  return "?";
}
constexpr const char* label(mode m) {
  switch (m) {
    case mode::ddp: return "DDP";
    case mode::zero2: return "ZeRO-2";
    case mode::fsdp: return "FSDP (full shard)";
    case mode::pipeline: return "pipeline 2 stages, 1F1B, 4 mb";
    case mode::local_sgd: return "post-local SGD, period 8";
    case mode::diloco: return "DiLoCo, 8 inner steps";
  }
  return "?";
}

struct mode_result {
  std::vector<double> window_sps;  // samples/s of both ranks together, per timed window
  std::size_t activation_bytes = 0;  // the larger rank's
  std::size_t state_bytes = 0;       // the larger rank's
  std::string how;                   // ZeRO-2: which step path it took
  [[nodiscard]] double samples_per_s() const { return median(window_sps); }
};

// Runs the warm-up, then the timed windows (each between two barriers, timed on rank 0); the
// windows' samples/s of the whole job (rank 0's, filled on rank 0 only).
template <class Step>
std::vector<double> timed_windows(local_group& g, const config& c, std::size_t samples_per_step, Step&& step) {
  std::size_t i = 0;
  for (; i < c.warmup; ++i) step(i);
  std::vector<double> out;
  for (std::size_t w = 0; w < c.windows; ++w) {
    g.barrier().wait();
    const auto t0 = clock_type::now();
    for (std::size_t s = 0; s < c.steps; ++s, ++i) step(i);
    g.barrier().wait();
    out.push_back(static_cast<double>(samples_per_step * c.steps) / seconds_since(t0));
  }
  return out;
}

mode_result run_mode(mode md, bool recompute, const in_memory_dataset& train, const config& c) {
  const std::size_t need = c.warmup + c.steps * c.windows;
  // Each rank its own rows; the pipeline's two stages both read the global batch.
  const std::vector<std::vector<batch>> rank_batches{bench::dataset_batches(train, c.batch, need, 0),
                                                     bench::dataset_batches(train, c.batch, need, need)};
  const std::vector<batch> global_batches = bench::dataset_batches(train, world * c.batch, need, 0);
  mode_result out;
  std::mutex mu;
  run_local(world, [&](local_group& g) {
    model_t model = make_model(c, recompute);
    const std::size_t n = parameter_count(model);
    const auto& mine = rank_batches[static_cast<std::size_t>(g.rank())];
    const std::size_t per_step = world * c.batch;
    std::vector<double> sps;
    std::size_t act = 0, state = 0;
    // Parameters, the model's gradients and AdamW's two moments, whole on this rank.
    const std::size_t replica_state = 4 * n * sizeof(float);
    auto ddp_buckets = [](const auto& ddp) {
      std::size_t b = 0;
      for (const auto& k : ddp.stats().buckets) b += k.bytes;
      return b;
    };
    switch (md) {
      case mode::ddp: {
        distributed_data_parallel ddp(model, g);
        adamw opt(model, adamw_opts);
        sps = timed_windows(g, c, per_step, [&](std::size_t i) {
          (void)ddp.train_step(mine[i]);
          opt.step();
        });
        act = model.activation_bytes();
        state = replica_state + ddp_buckets(ddp);
        break;
      }
      case mode::zero2: {
        sharded_data_parallel zero(model, g, adamw_opts, zero_options{.stage = 2});
        sps = timed_windows(g, c, per_step, [&](std::size_t i) { (void)zero.train_step(mine[i]); });
        act = model.activation_bytes();
        const sharded_memory m = zero.memory();
        state = m.parameter_bytes + m.model_gradient_bytes + m.gradient_bytes + m.optimizer_state_bytes +
                m.master_bytes + m.communication_bytes;
        // The shared-memory step needs every parameter (and gradient) in one buffer; make_vit's
        // layers each own theirs, so the reduce_scatter path runs.
        if (g.rank() == 0) {
          std::lock_guard lock(mu);
          out.how = zero.shared_memory_step() ? "shared-memory step" : "reduce_scatter path";
        }
        break;
      }
      case mode::fsdp: {
        fully_sharded_data_parallel fsdp(model, g, adamw_opts);
        sps = timed_windows(g, c, per_step, [&](std::size_t i) { (void)fsdp.train_step(mine[i].features, mine[i].labels); });
        const fsdp_memory m = fsdp.memory();
        act = m.peak_activation_bytes;
        state = m.peak_parameter_bytes + m.peak_gradient_bytes + m.optimizer_state_bytes;
        break;
      }
      case mode::pipeline: {
        pipeline_stage stage(model, g, {.kind = pipeline_schedule_kind::one_f_one_b, .micro_batches = 4});
        auto params = stage.parameters();
        adamw opt(params, adamw_opts);
        sps = timed_windows(g, c, per_step, [&](std::size_t i) {
          (void)stage.train_step(model.loss(), global_batches[i].features, global_batches[i].labels);
          opt.step();
          act = std::max(act, stage.last_stats().peak_activation_bytes);
        });
        state = 4 * parameter_count(params) * sizeof(float);
        break;
      }
      case mode::local_sgd: {
        adamw opt(model, adamw_opts);
        post_local_sgd lsgd(model, opt, g, {.period = sync_period});
        sps = timed_windows(g, c, per_step, [&](std::size_t i) { (void)lsgd.train_step(mine[i]); });
        act = model.activation_bytes();
        state = replica_state + ddp_buckets(lsgd.ddp());
        break;
      }
      case mode::diloco: {
        adamw opt(model, adamw_opts);
        diloco dl(model, opt, g, {.inner_steps = sync_period});
        sps = timed_windows(g, c, per_step, [&](std::size_t i) { (void)dl.train_step(mine[i]); });
        act = model.activation_bytes();
        // + the round's starting point and the outer SGD's momentum, one value per parameter each.
        state = replica_state + dl.global_parameters().size() * sizeof(float) + n * sizeof(float);
        break;
      }
    }
    std::lock_guard lock(mu);
    if (g.rank() == 0) out.window_sps = sps;
    out.activation_bytes = std::max(out.activation_bytes, act);
    out.state_bytes = std::max(out.state_bytes, state);
  });
  return out;
}

// ---- 2 and 3: one rank ----

// Seconds per step of `steps` steps (train_step + AdamW) over batches[first ..].
double time_steps(model_t& model, adamw<model_t>& opt, const std::vector<batch>& batches, std::size_t first,
                  std::size_t steps) {
  const auto t0 = clock_type::now();
  for (std::size_t s = 0; s < steps; ++s) {
    (void)model.train_step(batches[(first + s) % batches.size()]);
    opt.step();
  }
  return seconds_since(t0) / static_cast<double>(steps);
}

struct one_rank_result {
  double step_s = 0, gemm_s = 0, step_vs_gemm = 0;  // medians over the rounds
  std::size_t gemm_calls = 0;
  double gemm_flops = 0;
  std::size_t act_plain = 0, act_recompute = 0;
  double step_plain_s = 0, step_recompute_s = 0, recompute_time_ratio = 0;
};

one_rank_result one_rank(const in_memory_dataset& train, const config& c) {
  one_rank_result r;
  const auto batches = bench::dataset_batches(train, c.batch, c.warmup + c.steps, 0);
  model_t plain = make_model(c, false), again = make_model(c, true);
  adamw opt_plain(plain, adamw_opts), opt_again(again, adamw_opts);
  bench::vit::gemm_replay replay(bench::vit::vit_step_gemms(vit_of(c), c.batch));
  r.gemm_calls = replay.plan().calls.size();
  r.gemm_flops = replay.plan().flops();
  (void)time_steps(plain, opt_plain, batches, 0, c.warmup);
  (void)time_steps(again, opt_again, batches, 0, c.warmup);
  for (std::size_t i = 0; i < 2; ++i) replay.run();
  std::vector<double> step, gemm, ratio, step_rc, rc_ratio;
  for (std::size_t round = 0; round < c.rounds; ++round) {
    // The step, its GEMMs, the step with recomputation: back to back, so drift hits all alike.
    step.push_back(time_steps(plain, opt_plain, batches, c.warmup, c.steps));
    const auto t0 = clock_type::now();
    for (std::size_t s = 0; s < c.steps; ++s) replay.run();
    gemm.push_back(seconds_since(t0) / static_cast<double>(c.steps));
    step_rc.push_back(time_steps(again, opt_again, batches, c.warmup, c.steps));
    ratio.push_back(step.back() / gemm.back());
    rc_ratio.push_back(step_rc.back() / step.back());
  }
  r.step_s = median(step);
  r.gemm_s = median(gemm);
  r.step_vs_gemm = median(ratio);
  r.step_plain_s = r.step_s;
  r.step_recompute_s = median(step_rc);
  r.recompute_time_ratio = median(rc_ratio);
  r.act_plain = plain.activation_bytes();
  r.act_recompute = again.activation_bytes();
  return r;
}

// ---- 4: training ----

double evaluate_accuracy(model_t& model, const in_memory_dataset& test) {
  const auto features = test.features();
  const auto labels = test.labels();
  std::size_t correct = 0, count = 0;
  constexpr std::size_t chunk = 500;
  for (std::size_t first = 0; first < test.size(); first += chunk) {
    const std::size_t rows = std::min(chunk, test.size() - first);
    const batch b{features.slice(first, first + rows), tensor_view<const std::int32_t>(labels.data() + first, rows), {}};
    const eval_result e = model.eval_step(b);
    correct += e.correct;
    count += e.count;
  }
  return static_cast<double>(correct) / static_cast<double>(count);
}

// DDP on 2 ranks for c.train_epochs epochs; returns the final test accuracy.
double train_ddp(const in_memory_dataset& train, const in_memory_dataset& test, const config& c) {
  constexpr std::size_t skip = 10;  // steps of each epoch left out of its samples/s
  const std::size_t per_epoch = distributed_num_samples(train.size(), world, true) / c.batch;
  const std::size_t total = per_epoch * c.train_epochs;
  const warmup_cosine_lr schedule{.base = adamw_opts.lr, .warmup_steps = std::max<std::size_t>(1, total / 20),
                                  .total_steps = total};
  double accuracy = 0;
  const auto t_start = clock_type::now();
  run_local(world, [&](local_group& g) {
    model_t model = make_model(c, false);
    distributed_data_parallel ddp(model, g);
    adamw opt(model, adamw_opts);
    loader data(train, views::distributed(train.size(), world, g.rank(), {.shuffle = true, .seed = 0, .drop_last = true}),
                {.batch_size = c.batch, .drop_last = true, .prefetch = 0});
    std::size_t step = 0;
    for (std::size_t epoch = 0; epoch < c.train_epochs; ++epoch) {
      data.set_epoch(epoch);
      std::size_t k = 0;
      double loss_sum = 0;
      auto t0 = clock_type::now();
      for (const batch& b : data) {
        if (k == skip) t0 = clock_type::now();
        opt.set_lr(schedule(step));
        loss_sum += ddp.train_step(b);
        opt.step();
        ++step;
        ++k;
      }
      const double secs = seconds_since(t0);
      if (g.rank() == 0) {
        accuracy = evaluate_accuracy(model, test);
        std::printf("epoch %zu/%zu samples/s %.0f test_accuracy %.4f train_loss %.4f (rank 0)\n", epoch + 1,
                    c.train_epochs, static_cast<double>((k - std::min(k, skip)) * c.batch * world) / secs, accuracy,
                    loss_sum / static_cast<double>(k));
        std::fflush(stdout);
      }
      g.barrier().wait();
    }
  });
  std::printf("trained %zu epoch(s) of %zu steps in %.1f s (DDP, 2 ranks)\n", c.train_epochs, per_epoch,
              seconds_since(t_start));
  return accuracy;
}

// One process, constant lr: the first k batches rank 0 of 2 reads in epoch 0.
void check_steps(const in_memory_dataset& train, const config& c) {
  model_t model = make_model(c, false);
  adamw opt(model, adamw_opts);
  loader data(train, views::distributed(train.size(), world, 0, {.shuffle = true, .seed = 0, .drop_last = true}),
              {.batch_size = c.batch, .drop_last = true, .prefetch = 0});
  std::size_t k = 0;
  for (const batch& b : data) {
    if (k == c.check_steps) break;
    std::printf("check step %zu loss %.7f\n", k, model.train_step(b));
    opt.step();
    ++k;
  }
}

}  // namespace

int main(int argc, char** argv) {
  config c;
  for (int i = 1; i < argc; ++i) {
    const std::string_view a = argv[i];
    auto next = [&]() -> std::size_t {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "bench_vit: %s needs a value\n", argv[i]);
        std::exit(2);
      }
      char* end = nullptr;
      const long v = std::strtol(argv[++i], &end, 10);
      if (*end != '\0' || v < 0) {
        std::fprintf(stderr, "bench_vit: %s takes a whole number >= 0, got '%s'\n", argv[i - 1], argv[i]);
        std::exit(2);
      }
      return static_cast<std::size_t>(v);
    };
    if (a == "--quick") {
      c.warmup = 8;
      c.steps = 8;
      c.windows = 1;
      c.rounds = 1;
    } else if (a == "--warmup") {
      c.warmup = next();
    } else if (a == "--steps") {
      c.steps = next();
    } else if (a == "--windows") {
      c.windows = next();
    } else if (a == "--rounds") {
      c.rounds = next();
    } else if (a == "--depth") {
      c.depth = next();
      if (c.depth == 0) {
        std::fprintf(stderr, "bench_vit: --depth must be at least 1\n");
        return 2;
      }
    } else if (a == "--seed") {
      c.seed = static_cast<std::uint32_t>(next());
    } else if (a == "--train-epochs") {
      c.train_epochs = next();
    } else if (a == "--train-only") {
      c.train_only = true;
    } else if (a == "--check-steps") {
      c.check_steps = next();
    } else if (a == "--mode" && i + 1 < argc) {
      const std::string_view name = argv[++i];
      const auto* m = std::find_if(std::begin(all_modes), std::end(all_modes), [&](mode x) { return name == key(x); });
      if (m == std::end(all_modes)) {
        std::fprintf(stderr, "bench_vit: --mode %s (expected ddp, zero2, fsdp, pipeline, local_sgd or diloco)\n", argv[i]);
        return 2;
      }
      c.modes.push_back(*m);
    } else {
      std::fprintf(stderr,
                   "usage: bench_vit [--quick] [--warmup N] [--steps N] [--windows N] [--rounds N] [--seed N] [--depth N] "
                   "[--mode NAME]... [--train-epochs N] [--train-only] [--check-steps K]\n");
      return 2;
    }
  }
  if (c.modes.empty()) c.modes.assign(std::begin(all_modes), std::end(all_modes));
  if (c.steps == 0 || c.windows == 0 || c.rounds == 0) {
    std::fprintf(stderr, "bench_vit: --steps, --windows and --rounds must be at least 1\n");
    return 2;
  }
  try {
    const in_memory_dataset train = bench::load_fashion_train();
    if (c.check_steps > 0) {
      check_steps(train, c);
      return 0;
    }
    model_t probe = make_model(c, false);
    const std::size_t params = parameter_count(probe);
    double load[1] = {0};
    if (getloadavg(load, 1) != 1) load[0] = -1;
    std::printf("bench_vit: ViT (16 tokens of 7x7 patches, dim 64, depth %zu, 4 heads, MLP 128; %zu "
                "parameters) on Fashion-MNIST, AdamW lr 1e-3 wd 0.01, batch %zu per rank, OpenBLAS 1 thread per rank, "
                "%ld cores, load average %.2f at the start\n",
                c.depth, params, c.batch, sysconf(_SC_NPROCESSORS_ONLN), load[0]);
    std::string keys;
    char buf[256];
    if (!c.train_only) {
      if (c.steps % sync_period != 0 || c.warmup % sync_period != 0) {
        std::printf("note: --steps %zu / --warmup %zu are not multiples of %lld: local SGD's and DiLoCo's windows hold "
                    "unequal numbers of averages\n",
                    c.steps, c.warmup, static_cast<long long>(sync_period));
      }
      // Rounds: each runs every mode once, with and without recomputation (a fresh job: warm-up,
      // then the windows), so that drift in the machine's load hits every row alike.
      struct row {
        mode md;
        bool rc;
        mode_result r;
      };
      std::vector<row> rows;
      for (const mode md : c.modes) {
        for (const bool rc : {false, true}) rows.push_back({md, rc, {}});
      }
      std::printf("\n2 ranks as threads (local backend), %zu round(s), each running every row in turn: a warm-up of "
                  "%zu steps, then %zu window(s) of %zu steps; samples/s of both ranks (median of all windows); "
                  "per rank: the larger rank's\n",
                  c.rounds, c.warmup, c.windows, c.steps);
      for (std::size_t round = 0; round < c.rounds; ++round) {
        for (auto& w : rows) {
          const mode_result r = run_mode(w.md, w.rc, train, c);
          w.r.window_sps.insert(w.r.window_sps.end(), r.window_sps.begin(), r.window_sps.end());
          w.r.activation_bytes = std::max(w.r.activation_bytes, r.activation_bytes);
          w.r.state_bytes = std::max(w.r.state_bytes, r.state_bytes);
          w.r.how = r.how;
        }
      }
      std::printf("%-31s %-9s %10s %17s %14s %13s\n", "mode", "recompute", "samples/s", "(windows min-max)",
                  "act MiB/rank", "state MiB/rank");
      std::vector<double> plain_sps;
      for (const auto& [md, rc, r] : rows) {
        const auto [lo, hi] = std::minmax_element(r.window_sps.begin(), r.window_sps.end());
        char range[48];
        std::snprintf(range, sizeof range, "%.0f-%.0f", *lo, *hi);
        const std::string name = r.how.empty() ? label(md) : std::string(label(md)) + " (" + r.how + ")";
        std::printf("%-31s %-9s %10.0f %17s %14.2f %13.2f\n", rc ? "" : name.c_str(), rc ? "full" : "off",
                    r.samples_per_s(), range, mib(r.activation_bytes), mib(r.state_bytes));
        if (!rc) plain_sps.push_back(r.samples_per_s());
      }
      std::printf("act: activations, recompute scratch and activation gradients (sequential::activation_bytes; FSDP's and "
                  "the pipeline's own peaks). state: parameters, gradients (+ the policy's gradient buffers: DDP's "
                  "buckets, ZeRO-2's, FSDP's peak), AdamW moments (ZeRO-2, FSDP: this rank's shard), DiLoCo's round start "
                  "and outer momentum; FSDP's parameter and gradient peaks summed\n");

      const one_rank_result o = one_rank(train, c);
      std::printf("\none rank, batch %zu, medians of %zu alternated round(s) of %zu steps\n", c.batch, c.rounds, c.steps);
      std::printf("%-44s %10s\n", "", "ms/step");
      std::printf("%-44s %10.3f\n", "step (train_step + AdamW)", 1e3 * o.step_s);
      std::printf("%-44s %10.3f   (%zu sgemm calls, %.1f MFLOP, %.2f GFLOP/s)\n", "its GEMMs alone (replayed)",
                  1e3 * o.gemm_s, o.gemm_calls, o.gemm_flops * 1e-6, o.gemm_flops / o.gemm_s * 1e-9);
      std::printf("%-44s %10.3f   (x%.3f the step)\n", "step with full recomputation", 1e3 * o.step_recompute_s,
                  o.recompute_time_ratio);
      std::printf("step / GEMMs: %.3f; activation bytes without recomputation %.2f MiB, with %.2f MiB (%.3f)\n",
                  o.step_vs_gemm, mib(o.act_plain), mib(o.act_recompute),
                  static_cast<double>(o.act_recompute) / static_cast<double>(o.act_plain));
      std::snprintf(buf, sizeof buf, "vit_step_vs_gemm=%.3f recompute_memory_ratio=%.3f recompute_time_ratio=%.3f",
                    o.step_vs_gemm, static_cast<double>(o.act_recompute) / static_cast<double>(o.act_plain),
                    o.recompute_time_ratio);
      keys += buf;
      for (std::size_t i = 0; i < plain_sps.size(); ++i) {
        std::snprintf(buf, sizeof buf, " samples_per_s_%s=%.0f", key(c.modes[i]), plain_sps[i]);
        keys += buf;
      }
    }
    if (c.train_epochs > 0) {
      const in_memory_dataset test = load_fashion_mnist(fashion_mnist_split::test, fashion_mnist_normalization());
      std::printf("\ntraining: DDP, 2 ranks, AdamW lr 1e-3 wd 0.01, warmup_cosine_lr per step, %zu epoch(s), batch %zu "
                  "per rank\n",
                  c.train_epochs, c.batch);
      const double acc = train_ddp(train, test, c);
      std::snprintf(buf, sizeof buf, "%svit_test_accuracy=%.4f", keys.empty() ? "" : " ", acc);
      keys += buf;
    }
    std::printf("summary: %s\n", keys.c_str());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_vit: %s\n", e.what());
    return 1;
  }
  return 0;
}
