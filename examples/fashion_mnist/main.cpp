// examples/fashion_mnist/main.cpp: a user's training program. It trains its own MLP
// (mlp_host.hpp) on Fashion-MNIST with distributed data parallel across ranks:
//
//   fashion_mnist --nproc 2                     # 2 processes over Gloo, started here
//   fashion_mnist --backend local --nproc 2     # 2 threads of this process
//   partrun --nproc 2 fashion_mnist             # ranks from the launcher's environment
//
// Rank 0 prints a progress line every --log-every steps and one line per epoch (train loss, test
// loss, test accuracy, samples/s); with --metrics FILE it writes the same as JSON lines, and with
// --trace FILE (or PARTRAIN_TRACE=FILE) every rank records a timeline that rank 0 merges. The
// learning rate follows a cosine from --lr down to 0 over the epochs (per epoch, so a resumed run
// continues on the same schedule).
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <concepts>
#include <cstdlib>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <iostream>
#include <memory>
#include <numbers>
#include <optional>
#include <ranges>
#include <string>
#include <utility>
#include <vector>

#include <partrain/comm/local.hpp>
#include <partrain/core/task.hpp>
#include <partrain/data/distributed.hpp>
#include <partrain/data/fashion_mnist.hpp>
#include <partrain/data/loader.hpp>
#include <partrain/data/shuffled.hpp>
#include <partrain/launch/spawn.hpp>
#include <partrain/optim/sgd.hpp>
#include <partrain/parallel/data_parallel.hpp>
#include <partrain/parallel/ddp.hpp>
#include <partrain/parallel/pipeline/pipeline.hpp>
#include <partrain/precision/mixed_precision.hpp>
#include <partrain/rendezvous/init.hpp>
#include <partrain/train/checkpoint.hpp>
#include <partrain/train/epochs.hpp>
#include <partrain/train/every.hpp>
#include <partrain/train/metrics.hpp>
#include <partrain/train/progress.hpp>
#include <partrain/train/steps.hpp>
#include <partrain/train/trace.hpp>

#include "mlp_host.hpp"
#include "mlp_layers.hpp"
#include "options.hpp"
#if defined(__CUDACC__)
#include "mlp_cuda.cuh"
#endif

namespace {

using namespace partrain;
using example::options;
namespace layers = example::layers;

struct datasets {
  in_memory_dataset train, test;
  std::size_t n_train = 0, n_test = 0;  // after --limit-train / --limit-test
};

datasets load_data(const options& o) {
  const normalize_options norm = fashion_mnist_normalization();
  const std::filesystem::path dir = o.data.empty() ? fashion_mnist_dir() : std::filesystem::path(o.data);
  datasets d{load_fashion_mnist(fashion_mnist_split::train, norm, dir),
             load_fashion_mnist(fashion_mnist_split::test, norm, dir)};
  d.n_train = o.limit_train ? std::min(o.limit_train, d.train.size()) : d.train.size();
  d.n_test = o.limit_test ? std::min(o.limit_test, d.test.size()) : d.test.size();
  return d;
}

struct epoch_summary {
  double loss_sum = 0;  // over all ranks' steps
  double steps = 0;     // steps counted in loss_sum (all ranks)
  std::size_t samples = 0;  // this rank's
};

// What the loop needs from a parallel mode: one training step (optimizer included) returning the
// mean loss, evaluation over the test batches, and the learning rate. DDP, data_parallel and the
// pipeline each get a small adapter, and the same loop below runs any of them.
template <class Ddp, class Opt>
struct ddp_mode {
  Ddp& ddp;
  Opt& opt;
  trace_recorder* trace = nullptr;  // timeline spans (--trace); off when null
  grad_scaler* scaler = nullptr;    // mixed precision (--precision fp16|bf16); fp32 when null
  std::size_t skipped = 0;          // steps the scaler skipped (inf/NaN gradients on some rank)
  double step(const batch& b) {
    if (scaler) {
      // Scale the loss, train, unscale + check (agreed across ranks), step the fp32 masters
      // unless a gradient overflowed, refresh the 16-bit weights, update the scale.
      auto fb = trace ? trace->span("amp_step") : trace_span{};
      const amp_step_result r = amp_step(ddp, opt, *scaler, b);
      skipped += r.skipped ? 1 : 0;
      return r.loss;
    }
    auto fb = trace ? trace->span("forward_backward") : trace_span{};
    const double loss = ddp.train_step(b);  // gradients averaged over the ranks
    fb.end();
    auto os = trace ? trace->span("optimizer") : trace_span{};
    opt.step();
    return loss;
  }
  template <class Batches>
  eval_result evaluate(Batches& test) {
    return ddp.evaluate(test);  // summed over ranks, each holding its own part of the test set
  }
  void set_lr(double lr) { opt.set_lr(lr); }
};

template <class Dp>
struct dp_mode {
  Dp& dp;
  double step(const batch& b) { return dp.train_step(b); }  // steps every replica's optimizer
  template <class Batches>
  eval_result evaluate(Batches& test) {
    return dp.evaluate(test);
  }
  void set_lr(double lr) {
    dp.for_each_optimizer([lr](auto& opt) { opt.set_lr(lr); });
  }
};

// The parameters of this pipeline rank's layers, as a model for partrain::sgd.
struct stage_parameters {
  struct ref {
    layers::host_param* p;
    [[nodiscard]] tensor_view<float> value() const { return p->value(); }
    [[nodiscard]] tensor_view<float> grad() const { return p->grad(); }
  };
  std::vector<ref> refs;
  std::vector<ref>& parameters() { return refs; }
};

template <class Stage>
struct pipeline_mode {
  Stage& stage;
  sgd<stage_parameters>& opt;
  layers::softmax_cross_entropy loss{};
  double step(const batch& b) {
    const double l = stage.train_step(loss, b.features, b.labels);  // the batch-mean loss, on every stage
    opt.step();
    return l;
  }
  template <class Batches>
  eval_result evaluate(Batches& test) {
    eval_result r;
    for (const batch& b : test) r += stage.eval_step(loss, b.features, b.labels);  // forward only
    return r;
  }
  void set_lr(double lr) { opt.set_lr(lr); }
};

// The loop, written three ways. `pg` is the data-parallel group the loss is summed over (for dp
// and the pipeline, a group of one: their steps already see the whole batch).
template <class Mode>
struct trainer {
  Mode& mode;
  process_group& pg;
  bool leader;  // prints progress lines
  const options& o;
  std::size_t& global_step;
  trace_recorder& trace;
  progress& prog;                          // rank 0's progress line
  std::optional<metrics_writer>& metrics;  // --metrics: rank 0 writes, every rank takes part
  std::size_t epoch = 0;                   // the running epoch (0-based)
  std::size_t epoch_first_step = 0;        // global step at its start

  double one_step(const batch& b, epoch_summary& s) {
    maybe_inject_failure();
    auto span = trace.span("step", trace_track::step, "step", static_cast<std::int64_t>(global_step));
    const double loss = mode.step(b);
    s.samples += b.size();
    return loss;
  }
  // Fault injection for the launcher's restart test: PARTRAIN_EXAMPLE_KILL_AT_STEP=k makes rank 1
  // kill itself (SIGKILL, no clean-up) at global step k of the first attempt only.
  void maybe_inject_failure() const {
    static const long kill_at = [] {
      const char* v = std::getenv("PARTRAIN_EXAMPLE_KILL_AT_STEP");
      return v ? std::atol(v) : -1L;
    }();
    const char* restart = std::getenv("PARTRAIN_RESTART_COUNT");
    const char* rank = std::getenv("RANK");
    if (kill_at >= 0 && rank && std::string_view(rank) == "1" && static_cast<long>(global_step) == kill_at && restart &&
        std::string_view(restart) == "0") {
      std::printf("rank 1: injected failure at step %ld\n", kill_at);
      std::fflush(stdout);
      ::raise(SIGKILL);
    }
  }
  // The progress line: fed every step (it decides when to print); nothing with --log-every 0.
  void show(std::size_t step, double loss, std::size_t samples) {
    if (o.log_every) prog.update(static_cast<std::int64_t>(epoch), static_cast<std::int64_t>(step - epoch_first_step), loss,
                                 static_cast<std::int64_t>(samples));
  }
  // A metrics step record every --log-every steps. `reduced`: loss is already the mean over the
  // ranks; otherwise the record is collective (every rank calls it) and averages it.
  void log_step(std::size_t step, double loss, bool reduced = false) {
    if (!metrics) return;
    std::vector<metric_field> f{{"epoch", static_cast<std::int64_t>(epoch + 1)},
                                {"loss", loss, reduced ? across_ranks::rank0 : across_ranks::mean}};
    if (reduced) {
      metrics->step(static_cast<std::int64_t>(step + 1), std::move(f));
    } else {
      metrics->step(pg, static_cast<std::int64_t>(step + 1), std::move(f));
    }
  }
  // Sums this rank's loss total and step count over all ranks.
  void reduce_loss(epoch_summary& s) {
    std::array<double, 2> sums{s.loss_sum, s.steps};
    pg.all_reduce(tensor_view<double>(sums), reduce_op::sum).wait();
    s.loss_sum = sums[0];
    s.steps = sums[1];
  }

  // 1. The plain for-loop.
  template <class Loader>
  epoch_summary epoch_plain(Loader& train) {
    epoch_summary s;
    for (const batch& b : traced_batches(train, trace)) {  // traced: the time each batch took to arrive
      const double loss = one_step(b, s);
      s.loss_sum += loss;
      s.steps += 1;
      show(global_step, loss, b.size());
      if (o.log_every && (global_step + 1) % o.log_every == 0) log_step(global_step, loss);
      ++global_step;
    }
    reduce_loss(s);
    return s;
  }

  // 2. The same loop as a composition: batches | one step each | every k steps, log.
  template <class Loader>
  epoch_summary epoch_ranges(Loader& train) {
    epoch_summary s;
    std::size_t samples = 0;
    auto step = [&](const batch& b) {
      samples = b.size();
      return one_step(b, s);
    };
    auto log = [&](const step_result<double>& r) { log_step(r.step, r.value); };
    for (const auto& r : traced_batches(train, trace) | views::steps(step, global_step) |
                             views::every(o.log_every ? o.log_every : ~std::size_t{0}, log)) {
      s.loss_sum += r.value;
      s.steps += 1;
      show(r.step, r.value, samples);
    }
    reduce_loss(s);
    return s;
  }

  // 3. A coroutine: each step's loss is summed over the ranks by an all_reduce that runs while
  // the next batch trains; the loop co_awaits it one step later (the running loss is global
  // without ever blocking a step on it).
  template <class Loader>
  task<epoch_summary> epoch_coroutine(Loader& train) {
    epoch_summary s;
    std::array<std::array<double, 2>, 2> slots{};  // [loss, 1] of the two steps in flight
    work pending = work::completed();
    std::size_t k = 0, samples = 0;
    for (const batch& b : traced_batches(train, trace)) {
      samples = b.size();
      const double loss = one_step(b, s);
      auto& slot = slots[k % 2];
      slot = {loss, 1.0};
      work w = pg.all_reduce(tensor_view<double>(slot), reduce_op::sum);
      if (k > 0) {
        co_await pending;  // the previous step's sums, reduced while this step computed
        const auto& prev = slots[(k - 1) % 2];
        s.loss_sum += prev[0];
        s.steps += prev[1];
        show(global_step - 1, prev[0] / prev[1], samples);  // the mean over the ranks
        if (o.log_every && global_step % o.log_every == 0) log_step(global_step - 1, prev[0] / prev[1], true);
      }
      pending = std::move(w);
      ++k;
      ++global_step;
    }
    if (k > 0) {
      co_await pending;
      const auto& last = slots[(k - 1) % 2];
      s.loss_sum += last[0];
      s.steps += last[1];
      show(global_step - 1, last[0] / last[1], samples);
      if (o.log_every && global_step % o.log_every == 0) log_step(global_step - 1, last[0] / last[1], true);
    }
    co_return s;
  }
};

// The timeline: on with --trace FILE or PARTRAIN_TRACE=FILE (every rank sees the same options and
// environment, so all of them agree).
trace_recorder make_trace(const options& o) {
  return o.trace.empty() ? trace_recorder::from_env() : trace_recorder(std::filesystem::path(o.trace));
}
// Collective: aligns the ranks' clocks. The exchange needs a host group (not NCCL's).
void start_trace(trace_recorder& trace, process_group& pg) {
  if (!trace.enabled()) return;
  if (!pg.accepts(device_kind::cpu)) {
    if (pg.rank() == 0) std::printf("trace: the %s backend carries device memory only; tracing is off\n", std::string(pg.backend()).c_str());
    trace.disable();
    return;
  }
  trace.start(pg);
}
// Collective: rank 0 merges every rank's spans into one Chrome-trace file.
void finish_trace(trace_recorder& trace, process_group& pg) {
  if (trace.enabled() && trace.finish(pg)) {
    std::printf("trace written to %s (open it in https://ui.perfetto.dev or chrome://tracing)\n", trace.path().c_str());
    std::fflush(stdout);
  }
}

// FNV-1a over every parameter's bytes: equal checksums mean bit-identical parameters (what the
// restart test compares between an interrupted and an uninterrupted run).
template <class Model>
std::uint64_t parameter_checksum(Model& model) {
  std::uint64_t h = 0xcbf29ce484222325ull;
  for (auto& p : model.parameters()) {
    auto v = p.value();
    if constexpr (std::same_as<typename decltype(v)::space_type, host>) {
      const auto* bytes = reinterpret_cast<const unsigned char*>(v.data());
      for (std::size_t i = 0; i < v.size_bytes(); ++i) h = (h ^ bytes[i]) * 0x100000001b3ull;
    } else {
      return 0;  // device parameters: not checksummed here
    }
  }
  return h;
}

// The epochs: set the learning rate, train, evaluate, checkpoint (through save), report.
// `samples_scale` turns this rank's sample count into the job's (the number of data-parallel ranks).
template <class Mode, class Train, class Test, class Save>
double run_epochs(Mode& mode, process_group& pg, bool leader, Train& train, Test& test, const options& o,
                  std::size_t first_epoch, std::size_t& global_step, int samples_scale, Save save,
                  trace_recorder& trace) {
  std::optional<metrics_writer> metrics;
  if (!o.metrics.empty()) {
    // A fresh run starts a fresh file; a resumed one appends to what the earlier run wrote.
    if (leader && first_epoch == 0) std::filesystem::remove(o.metrics);
    metrics.emplace(o.metrics, leader ? 0 : 1);
  }
  progress prog(leader ? 0 : 1, {.out = &std::cout,
                                 .terminal_fd = STDOUT_FILENO,
                                 .epochs = static_cast<std::int64_t>(o.epochs),
                                 .steps_per_epoch = static_cast<std::int64_t>(train.size()),
                                 .world_size = samples_scale,
                                 .plain_every_steps = static_cast<std::int64_t>(o.log_every)});
  trainer<Mode> t{mode, pg, leader, o, global_step, trace, prog, metrics};
  double last_accuracy = 0;
  for (std::size_t epoch : views::epochs(first_epoch, o.epochs)) {
    mode.set_lr(o.lr * 0.5 * (1 + std::cos(std::numbers::pi * static_cast<double>(epoch) / static_cast<double>(o.epochs))));
    train.set_epoch(epoch);
    t.epoch = epoch;
    t.epoch_first_step = global_step;
    const auto t0 = std::chrono::steady_clock::now();
    epoch_summary s;
    if (o.loop == "plain") {
      s = t.epoch_plain(train);
    } else if (o.loop == "coroutine") {
      s = sync_wait(t.epoch_coroutine(train));
    } else {
      s = t.epoch_ranges(train);
    }
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    prog.finish();
    auto eval_span = trace.span("evaluate");
    const eval_result ev = mode.evaluate(test);
    eval_span.end();
    const double samples_per_s = static_cast<double>(s.samples) * samples_scale / seconds;
    const double train_loss = s.steps > 0 ? s.loss_sum / s.steps : 0.0;
    last_accuracy = ev.accuracy();
    {
      auto ck = o.checkpoint.empty() ? trace_span{} : trace.span("checkpoint");
      save(epoch, global_step);
    }
    if (metrics) {  // already summed over the ranks: rank 0 writes its values
      metrics->epoch(static_cast<std::int64_t>(epoch + 1), {{"step", static_cast<std::int64_t>(global_step)},
                                                            {"train_loss", train_loss},
                                                            {"test_loss", ev.mean_loss()},
                                                            {"test_accuracy", ev.accuracy()},
                                                            {"samples_per_s", samples_per_s}});
    }
    if (leader) {
      std::printf("epoch %zu/%zu  train_loss %.4f  test_loss %.4f  test_accuracy %.4f  samples/s %.0f  (%.1f s)\n",
                  epoch + 1, o.epochs, train_loss, ev.mean_loss(), ev.accuracy(), samples_per_s, seconds);
      std::fflush(stdout);
    }
  }
  if (leader) std::printf("final test_accuracy %.4f\n", last_accuracy);
  return last_accuracy;
}

// --parallel ddp: one model replica per rank, gradients averaged over the ranks.
template <class Model>
void train_ddp(Model& model, process_group& pg, const options& o, const datasets& data) {
  const int rank = pg.rank(), world = pg.size();
  constexpr bool host_model = std::same_as<model_space_t<Model>, host>;
  mixed_precision_policy mp{.compute = parse_precision(o.precision), .reduce_in_low_precision = o.reduce_16bit};
  ddp_options dopts;
  dopts.overlap = o.overlap;
  dopts.hook = mp.ddp_hook();
  trace_recorder trace = make_trace(o);  // before the DDP: its bucket callbacks point here
  start_trace(trace, pg);
  if (trace.enabled()) dopts.on_bucket_launch = trace.bucket_spans();
  if (o.bucket_kb) dopts.bucket_cap_bytes = dopts.first_bucket_bytes = o.bucket_kb << 10;
  distributed_data_parallel ddp(model, pg, dopts);
  grad_scaler scaler = mp.make_scaler();
  sgd opt(model, {.lr = o.lr, .momentum = o.momentum});

  loader train(data.train, views::distributed(data.n_train, world, rank, {.shuffle = true, .seed = o.seed}),
               {.batch_size = o.batch_size, .prefetch = 2});
  // Each rank evaluates a contiguous block of the test set: every example counted exactly once.
  const std::size_t lo = data.n_test * static_cast<std::size_t>(rank) / static_cast<std::size_t>(world);
  const std::size_t hi = data.n_test * static_cast<std::size_t>(rank + 1) / static_cast<std::size_t>(world);
  loader test(data.test, std::views::iota(lo, hi), {.batch_size = 1000, .prefetch = 0});

  std::size_t first_epoch = 0, global_step = 0;
  const std::filesystem::path ckpt =
      o.checkpoint.empty() ? std::filesystem::path{} : std::filesystem::path(o.checkpoint) / "fashion_mnist.ckpt";
  if (!host_model && !ckpt.empty()) {
    throw config_error("--checkpoint: checkpoints hold host parameters; this build saves the host model only");
  }
  if constexpr (host_model) {
    if (!ckpt.empty() && std::filesystem::exists(ckpt)) {
      const checkpoint_extra extra = load_checkpoint(ckpt, model, opt);
      if (scaler.enabled()) scaler.load_state_bytes(extra.scaler_state);
      if constexpr (has_low_precision_copy<Model>) model.refresh_low_precision();  // the loaded masters
      first_epoch = static_cast<std::size_t>(extra.epoch);
      global_step = static_cast<std::size_t>(extra.step);
      if (first_epoch > o.epochs) {
        throw config_error("the checkpoint in " + o.checkpoint + " is at epoch " + std::to_string(first_epoch) +
                           ", past --epochs " + std::to_string(o.epochs));
      }
      if (rank == 0) std::printf("resumed from %s at epoch %zu, step %zu\n", ckpt.c_str(), first_epoch, global_step);
    }
  }
  if (rank == 0) {
    std::printf("fashion_mnist: ddp, %d rank(s) over %s, MLP 784-256-128-10, batch %zu per rank, lr %g, %zu epochs, %zu/%zu examples, loop %s, precision %s%s\n",
                world, std::string(pg.backend()).c_str(), o.batch_size, o.lr, o.epochs, data.n_train, data.n_test,
                o.loop.c_str(), o.precision.c_str(),
                mp.compute == precision::fp32 ? "" : (o.reduce_16bit ? " (gradients reduced in 16 bits)" : " (gradients reduced in fp32)"));
  }
  ddp_mode<decltype(ddp), decltype(opt)> mode{ddp, opt};
  mode.trace = &trace;
  if (mp.compute != precision::fp32) mode.scaler = &scaler;
  auto save = [&](std::size_t epoch, std::size_t step) {
    if constexpr (host_model) {
      if (ckpt.empty()) return;
      // Rank 0 writes (atomically) while the others wait at save_checkpoint's barrier.
      if (rank == 0) std::filesystem::create_directories(ckpt.parent_path());
      checkpoint_extra extra;
      extra.epoch = epoch + 1;  // epochs finished: where a resumed run starts
      extra.step = step;
      if (scaler.enabled()) extra.scaler_state = scaler.state_bytes();
      save_checkpoint(pg, ckpt, model, opt, extra);
    }
  };
  run_epochs(mode, pg, rank == 0, train, test, o, first_epoch, global_step, world, save, trace);
  finish_trace(trace, pg);
  if (rank == 0 && mode.scaler) {
    std::printf("mixed precision: %zu step(s) skipped for inf/NaN gradients, loss scale now %g\n", mode.skipped,
                static_cast<double>(scaler.scale()));
  }
  if (rank == 0) {
    std::printf("final parameter checksum %016llx\n", static_cast<unsigned long long>(parameter_checksum(model)));
    std::fflush(stdout);
  }
}

// --parallel dp: one process, the batch scattered over --devices host devices (worker threads),
// one model replica each, gradients reduced among them.
void train_dp(const options& o, const datasets& data) {
  example::mlp_host model({}, o.seed);
  std::vector<device> devices;
  for (int i = 0; i < o.devices; ++i) devices.push_back(device::cpu(i));
  data_parallel dp(model, devices, [&](example::mlp_host& replica) {
    return sgd<example::mlp_host>(replica, {.lr = o.lr, .momentum = o.momentum});
  });
  auto solo = make_local_world(1);  // the loop's loss sums: a group of one
  loader train(data.train, views::shuffled(data.n_train, o.seed), {.batch_size = o.batch_size, .prefetch = 2});
  loader test(data.test, std::views::iota(std::size_t{0}, data.n_test), {.batch_size = 1000, .prefetch = 0});
  std::printf("fashion_mnist: dp, %d host device(s) in one process, MLP 784-256-128-10, batch %zu, lr %g, %zu epochs, %zu/%zu examples\n",
              o.devices, o.batch_size, o.lr, o.epochs, data.n_train, data.n_test);
  std::size_t global_step = 0;
  dp_mode<decltype(dp)> mode{dp};
  trace_recorder trace = make_trace(o);
  start_trace(trace, *solo[0]);
  run_epochs(mode, *solo[0], true, train, test, o, 0, global_step, 1, [](std::size_t, std::size_t) {}, trace);
  finish_trace(trace, *solo[0]);
  std::printf("final parameter checksum %016llx\n", static_cast<unsigned long long>(parameter_checksum(model)));
}

// --parallel pipeline: the MLP as a sequence of layers, split into --stages stages (one rank
// each); every rank reads the same batches (the first stage uses the pixels, the last the labels).
void train_pipeline(process_group& pg, const options& o, const datasets& data) {
  if (pg.size() != o.stages) {
    throw config_error("--parallel pipeline --stages " + std::to_string(o.stages) + " needs " +
                       std::to_string(o.stages) + " ranks, the job has " + std::to_string(pg.size()));
  }
  auto layers = layers::make_mlp({784, 256, 128, 10}, static_cast<std::uint32_t>(o.seed));
  pipeline_options po;
  po.kind = o.schedule == "gpipe" ? pipeline_schedule_kind::gpipe : pipeline_schedule_kind::one_f_one_b;
  po.micro_batches = o.micro_batches;
  pipeline_stage stage(layers, pg, po);
  stage_parameters params;
  stage.for_each_parameter([&](layers::host_param& p) { params.refs.push_back({&p}); });
  sgd<stage_parameters> opt(params, {.lr = o.lr, .momentum = o.momentum});
  auto solo = make_local_world(1);
  loader train(data.train, views::shuffled(data.n_train, o.seed), {.batch_size = o.batch_size, .prefetch = 2});
  loader test(data.test, std::views::iota(std::size_t{0}, data.n_test), {.batch_size = 1000, .prefetch = 0});
  const bool leader = pg.rank() == 0;
  if (leader) {
    std::printf("fashion_mnist: pipeline, %d stage(s) over %s, %s with %d micro-batches, batch %zu, lr %g, %zu epochs, %zu/%zu examples\n",
                pg.size(), std::string(pg.backend()).c_str(), o.schedule.c_str(), o.micro_batches, o.batch_size, o.lr,
                o.epochs, data.n_train, data.n_test);
  }
  std::size_t global_step = 0;
  pipeline_mode<decltype(stage)> mode{stage, opt};
  trace_recorder trace = make_trace(o);
  start_trace(trace, pg);
  run_epochs(mode, *solo[0], leader, train, test, o, 0, global_step, 1, [](std::size_t, std::size_t) {}, trace);
  finish_trace(trace, pg);
}

// The model lives on the device the options name: the host MLP, or (in the nvcc build of this
// file, fashion_mnist_cuda) the CUDA MLP on GPU LOCAL_RANK.
void run_rank(process_group& pg, const options& o, const datasets& data) {
  if (o.device == "cuda") {
#if defined(__CUDACC__)
    const char* local = std::getenv("LOCAL_RANK");
    example::mlp_cuda model({}, o.seed, device::cuda(local ? std::atoi(local) : 0), parse_precision(o.precision));
    train_ddp(model, pg, o, data);
#else
    throw config_error("--device cuda: this is the host build; run fashion_mnist_cuda (built where nvcc is found)");
#endif
  } else if (o.parallel == "pipeline") {
    train_pipeline(pg, o, data);
  } else {
    example::mlp_host model({}, o.seed, parse_precision(o.precision));
    train_ddp(model, pg, o, data);
  }
}

int run(options o) {
  const datasets data = load_data(o);
  if (o.parallel == "dp") {
    train_dp(o, data);
    return 0;
  }
  // A pipeline started by hand (not under a launcher) starts one rank per stage itself.
  if (o.parallel == "pipeline" && o.nproc == 0 && !std::getenv("WORLD_SIZE")) o.nproc = o.stages;
  if (o.backend == "local") {
    run_local(o.nproc, [&](local_group& g) { run_rank(g, o, data); });
  } else if (o.nproc > 0) {
    // The children are forks of this process: they share the loaded data. The timeout is only
    // a hang guard for the whole run; every collective has its own.
    spawn_options so;
    so.timeout = std::chrono::hours(2);
    spawn(
        o.nproc,
        [&](int) {
          auto pg = init_process_group("env://", {.backend = o.backend});
          run_rank(*pg, o, data);
        },
        so);
  } else {
    auto pg = init_process_group("env://", {.backend = o.backend});
    run_rank(*pg, o, data);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  example::options o;
  try {
    o = example::parse_options(std::vector<std::string>(argv + 1, argv + argc));
  } catch (const example::usage_error& e) {
    std::fprintf(stderr, "fashion_mnist: %s\n\n%s", e.what(), std::string(example::usage_text).c_str());
    return 2;
  }
  if (o.help) {
    std::printf("%s", std::string(example::usage_text).c_str());
    return 0;
  }
  try {
    return run(o);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fashion_mnist: %s\n", e.what());
    return 1;
  }
}
