// examples/fashion_mnist/main.cpp: a user's program training its own MLP or CNN on Fashion-MNIST with
// DDP over ranks (or ZeRO-1/2/3, or communicating less: local SGD, DiLoCo, PowerSGD), data parallel
// over host devices, or pipeline stages; partrain::fit runs the epochs (schedule, checkpoints,
// metrics, progress, trace) for all of them:
//   fashion_mnist --nproc 2                     # 2 processes over Gloo, started here
//   fashion_mnist --backend local --nproc 2     # 2 threads of this process
//   partrun --nproc-per-node 2 fashion_mnist    # ranks from the launcher's environment
//   partrun --nproc-per-node 3 --spares 1 fashion_mnist   # a fault-tolerant job (replicas.hpp)
// The modes other than DDP are in modes.hpp, what they all share in common.hpp.
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <partrain/partrain.hpp>
#include <string>
#include <vector>

#include "common.hpp"
#include "mlp_host.hpp"
#include "modes.hpp"
#include "options.hpp"
#include "replicas.hpp"
#if defined(__CUDACC__)
#include "mlp_cuda.cuh"
#endif

namespace {

using namespace partrain;
using example::options;
using namespace example::fm;

// --parallel ddp: one model replica per rank, gradients averaged over the ranks.
template <class Model>
void train_ddp(Model& model, process_group& pg, const options& o, const datasets& data) {
  const int rank = pg.rank(), world = pg.size();
  init_from(o, model, rank);
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
  any_optimizer opt = make_optimizer(model, o);
  ddp_policy policy(ddp, opt, {.scaler = mp.compute == precision::fp32 ? nullptr : &scaler, .trace = &trace,
                               .powersgd = psgd.get()});
  loader train = rank_train(data, o, rank, world);
  loader test = rank_test(data, rank, world);
  if (rank == 0) {
    std::printf("fashion_mnist: %s, %d rank(s) over %s, %s, batch %zu per rank, lr %g, %zu epochs, "
                "%zu/%zu examples, loop %s, prefetch %zu, precision %s%s\n",
                o.sync == "powersgd" ? "ddp with powersgd" : "ddp", world, std::string(pg.backend()).c_str(), model_name(o), o.batch_size,
                o.lr, o.epochs, data.n_train, data.n_test,
                o.loop.c_str(), prefetch_here(o), o.precision.c_str(),
                mp.compute == precision::fp32 ? "" : (o.reduce_16bit ? " (gradients reduced in 16 bits)" : " (gradients reduced in fp32)"));
  }
  fit(policy, train, test, fit_options(o, trace, train.size()));
  if (rank == 0 && scaler.enabled()) {
    std::printf("mixed precision: %zu step(s) skipped for inf/NaN gradients, loss scale now %g\n", policy.skipped_steps(),
                static_cast<double>(scaler.scale()));
  }
  export_model(o, model, rank);
  print_end(pg, parameter_checksum(model));
}

// The model lives where the options say: the host MLP, or (in the nvcc build of this file,
// fashion_mnist_cuda) the CUDA MLP on GPU LOCAL_RANK.
void run_rank(process_group& pg, const options& o, const datasets& data) {
  if (o.device == "cuda" && o.parallel == "ddp") {
#if defined(__CUDACC__)
    const char* local = std::getenv("LOCAL_RANK");
    models::mlp_cuda model({}, o.seed, device::cuda(local ? std::atoi(local) : 0), parse_precision(o.precision));
    train_ddp(model, pg, o, data);
#else
    throw config_error("--device cuda: this is the host build; run fashion_mnist_cuda (built where nvcc is found)");
#endif
  } else if (o.tp > 1 && o.parallel != "pipeline") {
    train_tp(pg, o, data);
  } else if (o.deterministic > 0) {
    if (o.parallel == "fsdp") {
      train_deterministic_fsdp(pg, o, data);
    } else {
      with_model(o, [&](auto& model) { train_deterministic(model, pg, o, data); });
    }
  } else if (o.parallel == "pipeline") {
    train_pipeline(pg, o, data);
  } else if (o.parallel == "zero1" || o.parallel == "zero2") {
    train_zero(pg, o, data);
  } else if (o.parallel == "fsdp") {
    train_fsdp(pg, o, data);
  } else if (o.sync == "local-sgd" || o.sync == "diloco") {
    train_local(pg, o, data);
  } else {
    with_model(o, [&](auto& model) { train_ddp(model, pg, o, data); });
  }
}

int run(options o) {
  // Under partrun --spares or --min-replicas: a replica of a fault-tolerant job (replicas.hpp).
  if (const auto launch = replica_launch_from_env()) {
    refuse_for_replicas(o);
    const datasets data = load_data(o);
    with_model(o, [&](auto& model) { train_replica(model, *launch, o, data); });
    return 0;
  }
  const datasets data = load_data(o);
  if (o.parallel == "dp") {
    train_dp(o, data);
    return 0;
  }
  // A pipeline started by hand (not under a launcher) starts one rank per stage itself.
  if (o.parallel == "pipeline" && o.nproc == 0 && o.backend != "mpi" && !detect_launch().launched()) o.nproc = o.stages * o.tp;
  // Threads (--backend local): each rank on a core of its own, meeting its peers on its own
  // thread rather than through a worker that would compete with it for the cores.
  process_group_options local;
  local.inline_collectives = local.pin_threads = o.local_collectives == "inline";
  // Forks share the loaded data; the timeout only guards the whole run (collectives have their own).
  run_ranks({.nproc = o.nproc, .backend = o.backend, .spawn = {.timeout = std::chrono::hours(2)}, .local = local},
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
    partrain::write_error_file(e);  // under torchrun: its failure summary shows this error
    std::fprintf(stderr, "fashion_mnist: %s\n", e.what());
    return 1;
  }
}
