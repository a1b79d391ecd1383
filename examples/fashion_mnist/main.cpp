// examples/fashion_mnist/main.cpp: a user's program training its own MLP on Fashion-MNIST with
// DDP over ranks (or ZeRO-1/2/3, or communicating less: local SGD, DiLoCo, PowerSGD), data parallel
// over host devices, or pipeline stages; partrain::fit runs the epochs (schedule, checkpoints,
// metrics, progress, trace) for all of them:
//   fashion_mnist --nproc 2                     # 2 processes over Gloo, started here
//   fashion_mnist --backend local --nproc 2     # 2 threads of this process
//   partrun --nproc-per-node 2 fashion_mnist    # ranks from the launcher's environment
#include <signal.h>

#include <cstdio>
#include <cstdlib>
#include <partrain/partrain.hpp>

#include "mlp_host.hpp"
#include "mlp_layers.hpp"
#include "options.hpp"
#if defined(__CUDACC__)
#include "mlp_cuda.cuh"
#endif

namespace {

using namespace partrain;
using example::options;

struct datasets {
  in_memory_dataset train, test;
  std::size_t n_train = 0, n_test = 0;  // after --limit-train / --limit-test
};

datasets load_data(const options& o) {
  const std::filesystem::path dir = o.data.empty() ? fashion_mnist_dir() : std::filesystem::path(o.data);
  datasets d{load_fashion_mnist(fashion_mnist_split::train, fashion_mnist_normalization(), dir),
             load_fashion_mnist(fashion_mnist_split::test, fashion_mnist_normalization(), dir)};
  d.n_train = o.limit_train ? std::min(o.limit_train, d.train.size()) : d.train.size();
  d.n_test = o.limit_test ? std::min(o.limit_test, d.test.size()) : d.test.size();
  return d;
}

// What every mode shares: the schedule, checkpoint, metrics, trace and the launcher's restart
// test hook (PARTRAIN_EXAMPLE_KILL_AT_STEP=k: rank 1 SIGKILLs itself at step k of attempt 0).
trainer_options fit_options(const options& o, trace_recorder& trace) {
  trainer_options t{.epochs = o.epochs, .lr = cosine_lr{.base = o.lr, .epochs = o.epochs}, .metrics = o.metrics,
                    .log_every = o.log_every, .trace = &trace};
  t.loop = o.loop == "plain" ? loop_style::plain : o.loop == "coroutine" ? loop_style::coroutine : loop_style::ranges;
  if (!o.checkpoint.empty()) t.checkpoint = std::filesystem::path(o.checkpoint) / "fashion_mnist.ckpt";
  const char* kill_at = std::getenv("PARTRAIN_EXAMPLE_KILL_AT_STEP");
  const char* rank = std::getenv("RANK");
  const char* attempt = std::getenv("PARTRAIN_RESTART_COUNT");
  if (kill_at && rank && std::string_view(rank) == "1" && attempt && std::string_view(attempt) == "0") {
    t.before_step = [k = std::strtoul(kill_at, nullptr, 10)](std::size_t step) {
      if (step != k) return;
      std::printf("rank 1: injected failure at step %zu\n", step);
      std::fflush(stdout);
      ::raise(SIGKILL);
    };
  }
  return t;
}

// dp and pipeline: every step sees the whole batch, so one shuffled order and the whole test set.
auto shuffled_train(const datasets& d, const options& o) {
  return loader(d.train, views::shuffled(d.n_train, o.seed), {.batch_size = o.batch_size, .prefetch = 2});
}
auto whole_test(const datasets& d) {
  return loader(d.test, std::views::iota(std::size_t{0}, d.n_test), {.batch_size = 1000, .prefetch = 0});
}

trace_recorder make_trace(const options& o) {
  return o.trace.empty() ? trace_recorder::from_env() : trace_recorder(std::filesystem::path(o.trace));
}

// DDP, ZeRO and the local modes: each rank its share of every epoch's shuffled order, and a
// contiguous block of the test set (every example counted exactly once).
auto rank_train(const datasets& d, const options& o, int rank, int world) {
  return loader(d.train, views::distributed(d.n_train, world, rank, {.shuffle = true, .seed = o.seed}),
                {.batch_size = o.batch_size, .prefetch = 2});
}
auto rank_test(const datasets& d, int rank, int world) {
  const auto part = [&](int r) { return d.n_test * static_cast<std::size_t>(r) / static_cast<std::size_t>(world); };
  return loader(d.test, std::views::iota(part(rank), part(rank + 1)), {.batch_size = 1000, .prefetch = 0});
}

void print_end(process_group& pg, std::uint64_t checksum) {
  // Bytes this rank sent (ring-algorithm bytes, comm_traffic), what the communication modes save.
  std::printf("rank %d sent %.1f MB\n", pg.rank(), static_cast<double>(pg.traffic().bytes_sent) / 1e6);
  if (pg.rank() == 0) std::printf("final parameter checksum %016llx\n", static_cast<unsigned long long>(checksum));
}

// --parallel ddp: one model replica per rank, gradients averaged over the ranks.
template <class Model>
void train_ddp(Model& model, process_group& pg, const options& o, const datasets& data) {
  const int rank = pg.rank(), world = pg.size();
  const mixed_precision_policy mp{.compute = parse_precision(o.precision), .reduce_in_low_precision = o.reduce_16bit};
  trace_recorder trace = make_trace(o);  // before the DDP: its bucket callbacks point here
  ddp_options dopts{.overlap = o.overlap, .hook = mp.ddp_hook()};
  std::shared_ptr<powersgd_state> psgd;  // checkpoints carry it: each rank's error feedback
  if (o.sync == "powersgd") {
    psgd = std::make_shared<powersgd_state>(
        powersgd_options{.matrix_approximation_rank = o.powersgd_rank, .start_iter = o.powersgd_start});
    dopts.hook = comm_hooks::powersgd(psgd);
  }
  if (trace.enabled()) dopts.on_bucket_launch = trace.bucket_spans();
  if (o.bucket_kb) dopts.bucket_cap_bytes = dopts.first_bucket_bytes = o.bucket_kb << 10;
  distributed_data_parallel ddp(model, pg, dopts);
  grad_scaler scaler = mp.make_scaler();
  sgd opt(model, {.lr = o.lr, .momentum = o.momentum});
  ddp_policy policy(ddp, opt, {.scaler = mp.compute == precision::fp32 ? nullptr : &scaler, .trace = &trace,
                               .powersgd = psgd.get()});
  loader train = rank_train(data, o, rank, world);
  loader test = rank_test(data, rank, world);
  if (rank == 0) {
    std::printf("fashion_mnist: %s, %d rank(s) over %s, MLP 784-256-128-10, batch %zu per rank, lr %g, %zu epochs, "
                "%zu/%zu examples, loop %s, precision %s%s\n",
                o.sync == "powersgd" ? "ddp with powersgd" : "ddp", world, std::string(pg.backend()).c_str(), o.batch_size,
                o.lr, o.epochs, data.n_train, data.n_test,
                o.loop.c_str(), o.precision.c_str(),
                mp.compute == precision::fp32 ? "" : (o.reduce_16bit ? " (gradients reduced in 16 bits)" : " (gradients reduced in fp32)"));
  }
  fit(policy, train, test, fit_options(o, trace));
  if (rank == 0 && scaler.enabled()) {
    std::printf("mixed precision: %zu step(s) skipped for inf/NaN gradients, loss scale now %g\n", policy.skipped_steps(),
                static_cast<double>(scaler.scale()));
  }
  print_end(pg, parameter_checksum(model));
}

// --parallel zero1|zero2: DDP's step with the optimizer state (zero2: and the gradients) sharded
// over the ranks; checkpoints are sharded too.
void train_zero(process_group& pg, const options& o, const datasets& data) {
  const auto compute = parse_precision(o.precision);
  models::mlp_host model({}, o.seed, compute);
  sharded_data_parallel zero(model, pg, sgd_options{.lr = o.lr, .momentum = o.momentum},
                             {.stage = o.parallel == "zero1" ? 1 : 2});
  grad_scaler scaler = mixed_precision_policy{.compute = compute}.make_scaler();
  trace_recorder trace = make_trace(o);
  zero_policy policy(zero, {.scaler = compute == precision::fp32 ? nullptr : &scaler, .trace = &trace});
  loader train = rank_train(data, o, pg.rank(), pg.size());
  loader test = rank_test(data, pg.rank(), pg.size());
  if (pg.rank() == 0) {
    std::printf("fashion_mnist: %s, %d rank(s) over %s, MLP 784-256-128-10, batch %zu per rank, lr %g, %zu epochs, "
                "%zu/%zu examples, precision %s\n", o.parallel.c_str(), pg.size(), std::string(pg.backend()).c_str(),
                o.batch_size, o.lr, o.epochs, data.n_train, data.n_test, o.precision.c_str());
  }
  fit(policy, train, test, fit_options(o, trace));
  print_end(pg, parameter_checksum(model));
}

// --parallel fsdp: the MLP as a sequence of layers, each layer's parameters (and their gradients
// and momentum) sharded over the ranks and gathered only around that layer's forward and backward.
void train_fsdp(process_group& pg, const options& o, const datasets& data) {
  auto layers = models::layers::make_mlp({784, 256, 128, 10}, static_cast<std::uint32_t>(o.seed));
  fully_sharded_data_parallel fsdp(layers, pg, models::layers::softmax_cross_entropy{},
                                   sgd_options{.lr = o.lr, .momentum = o.momentum});
  trace_recorder trace = make_trace(o);
  fsdp_policy policy(fsdp, {.trace = &trace});
  loader train = rank_train(data, o, pg.rank(), pg.size());
  loader test = rank_test(data, pg.rank(), pg.size());
  if (pg.rank() == 0) {
    std::printf("fashion_mnist: fsdp, %d rank(s) over %s, MLP 784-256-128-10, batch %zu per rank, lr %g, %zu epochs, "
                "%zu/%zu examples\n", pg.size(), std::string(pg.backend()).c_str(), o.batch_size, o.lr, o.epochs,
                data.n_train, data.n_test);
  }
  fit(policy, train, test, fit_options(o, trace));
  const fsdp_memory m = fsdp.memory();
  if (pg.rank() == 0) {
    std::printf("rank 0 held at most %.2f MB of parameters (the whole model: %.2f MB)\n",
                static_cast<double>(m.peak_parameter_bytes) / 1e6, static_cast<double>(m.unsharded_parameter_bytes) / 1e6);
  }
  auto full = fsdp.summon_full_params();  // collective: the checksum reads the whole model
  print_end(pg, parameter_checksum(full));
}

// --sync local-sgd|diloco: ranks step alone and meet every --period (or --inner-steps) steps.
void train_local(process_group& pg, const options& o, const datasets& data) {
  models::mlp_host model({}, o.seed);
  sgd opt(model, {.lr = o.lr, .momentum = o.momentum});
  trace_recorder trace = make_trace(o);
  loader train = rank_train(data, o, pg.rank(), pg.size());
  loader test = rank_test(data, pg.rank(), pg.size());
  if (pg.rank() == 0) {
    std::printf("fashion_mnist: %s, %d rank(s) over %s, MLP 784-256-128-10, batch %zu per rank, lr %g, %zu epochs, "
                "%zu/%zu examples\n", o.sync.c_str(), pg.size(), std::string(pg.backend()).c_str(), o.batch_size, o.lr,
                o.epochs, data.n_train, data.n_test);
  }
  auto run = [&](auto& algorithm) {
    local_sgd_policy policy(algorithm);
    fit(policy, train, test, fit_options(o, trace));
  };
  if (o.sync == "local-sgd") {
    post_local_sgd lsgd(model, opt, pg, {.period = o.period, .warmup_steps = o.warmup_steps});
    run(lsgd);
  } else {
    const auto bits = o.outer_bits == 8 ? outer_compression::int8 : o.outer_bits == 16 ? outer_compression::bf16
                                                                                          : outer_compression::none;
    diloco dl(model, opt, pg, {.inner_steps = o.inner_steps, .outer_lr = o.outer_lr, .outer_momentum = o.outer_momentum,
                               .compression = bits});
    run(dl);
  }
  print_end(pg, parameter_checksum(model));
}

// --parallel dp: one process, each batch scattered over --devices host devices (worker threads).
void train_dp(const options& o, const datasets& data) {
  models::mlp_host model({}, o.seed);
  std::vector<device> devices;
  for (int i = 0; i < o.devices; ++i) devices.push_back(device::cpu(i));
  data_parallel dp(model, devices, [&](models::mlp_host& replica) {
    return sgd<models::mlp_host>(replica, {.lr = o.lr, .momentum = o.momentum});
  });
  data_parallel_policy policy(dp);
  loader train = shuffled_train(data, o);
  loader test = whole_test(data);
  std::printf("fashion_mnist: dp, %d host device(s) in one process, MLP 784-256-128-10, batch %zu, lr %g, %zu epochs, %zu/%zu examples\n",
              o.devices, o.batch_size, o.lr, o.epochs, data.n_train, data.n_test);
  trace_recorder trace = make_trace(o);
  fit(policy, train, test, fit_options(o, trace));
  std::printf("final parameter checksum %016llx\n", static_cast<unsigned long long>(parameter_checksum(model)));
}

// --parallel pipeline: the MLP as a sequence of layers in --stages stages (one rank each); every
// rank reads the same batches.
void train_pipeline(process_group& pg, const options& o, const datasets& data) {
  if (pg.size() != o.stages) {
    throw config_error("--parallel pipeline --stages " + std::to_string(o.stages) + " needs " + std::to_string(o.stages) +
                       " ranks, the job has " + std::to_string(pg.size()));
  }
  auto layers = models::layers::make_mlp({784, 256, 128, 10}, static_cast<std::uint32_t>(o.seed));
  pipeline_stage stage(layers, pg, {.kind = o.schedule == "gpipe" ? pipeline_schedule_kind::gpipe : pipeline_schedule_kind::one_f_one_b,
                                    .micro_batches = o.micro_batches});
  auto params = stage.parameters();  // this rank's layers' parameters, as a model for sgd
  sgd opt(params, {.lr = o.lr, .momentum = o.momentum});
  pipeline_policy policy(stage, pg, opt, models::layers::softmax_cross_entropy{});
  loader train = shuffled_train(data, o);
  loader test = whole_test(data);
  if (pg.rank() == 0) {
    std::printf("fashion_mnist: pipeline, %d stage(s) over %s, %s with %d micro-batches, batch %zu, lr %g, %zu epochs, "
                "%zu/%zu examples\n", pg.size(), std::string(pg.backend()).c_str(), o.schedule.c_str(), o.micro_batches,
                o.batch_size, o.lr, o.epochs, data.n_train, data.n_test);
  }
  trace_recorder trace = make_trace(o);
  fit(policy, train, test, fit_options(o, trace));
}

// The model lives where the options say: the host MLP, or (in the nvcc build of this file,
// fashion_mnist_cuda) the CUDA MLP on GPU LOCAL_RANK.
void run_rank(process_group& pg, const options& o, const datasets& data) {
  if (o.device == "cuda") {
#if defined(__CUDACC__)
    const char* local = std::getenv("LOCAL_RANK");
    models::mlp_cuda model({}, o.seed, device::cuda(local ? std::atoi(local) : 0), parse_precision(o.precision));
    train_ddp(model, pg, o, data);
#else
    throw config_error("--device cuda: this is the host build; run fashion_mnist_cuda (built where nvcc is found)");
#endif
  } else if (o.parallel == "pipeline") {
    train_pipeline(pg, o, data);
  } else if (o.parallel == "zero1" || o.parallel == "zero2") {
    train_zero(pg, o, data);
  } else if (o.parallel == "fsdp") {
    train_fsdp(pg, o, data);
  } else if (o.sync == "local-sgd" || o.sync == "diloco") {
    train_local(pg, o, data);
  } else {
    models::mlp_host model({}, o.seed, parse_precision(o.precision));
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
  if (o.parallel == "pipeline" && o.nproc == 0 && o.backend != "mpi" && !std::getenv("WORLD_SIZE")) o.nproc = o.stages;
  // Forks share the loaded data; the timeout only guards the whole run (collectives have their own).
  run_ranks({.nproc = o.nproc, .backend = o.backend, .spawn = {.timeout = std::chrono::hours(2)}},
            [&](process_group& pg) { run_rank(pg, o, data); });
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
