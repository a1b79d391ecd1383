// examples/fashion_mnist/modes.hpp: the example's modes other than DDP (main.cpp): ZeRO-1/2,
// FSDP, local SGD and DiLoCo over ranks, data parallel over host devices, and pipeline stages.
// Each builds its policy and hands it to partrain::fit.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstdio>
#include <partrain/partrain.hpp>
#include <string>
#include <vector>

#include "cnn_layers.hpp"
#include "vit_layers.hpp"
#include "common.hpp"
#if defined(__CUDACC__)
#include "mlp_cuda.cuh"
#include "vit_layers_device.hpp"
#endif
#include "mlp_host.hpp"
#include "mlp_layers.hpp"
#include "options.hpp"

namespace example::fm {

// The ViT's configuration: the defaults, with --precision bf16 its matrix products in bfloat16
// (fp32 accumulation; everything else fp32).
inline models::layers::vit_config vit_of(const options& o) {
  models::layers::vit_config c;
  if (o.precision == "bf16") c.compute = dtype::bfloat16;
  return c;
}

// --model: the layers of the model, one description for every mode.
inline models::layers::host_model make_layers(const options& o) {
  const auto seed = static_cast<std::uint32_t>(o.seed);
  if (o.model == "vit") return models::layers::make_vit(vit_of(o), seed);
  return o.model == "cnn" ? models::layers::make_cnn(seed) : models::layers::make_mlp({784, 256, 128, 10}, seed);
}
// --recompute: none, full (every layer), every:K (layers 0, K, 2K, ...).
[[nodiscard]] inline recompute_options recompute_choice(const options& o) {
  if (o.recompute == "full") return {.every = 1, .layers = {}};
  if (o.recompute.starts_with("every:")) return {.every = std::stoul(o.recompute.substr(6)), .layers = {}};
  return {};
}
inline auto make_sequential(const options& o) {
  sequential model(make_layers(o), models::layers::softmax_cross_entropy{});
  model.set_recompute(recompute_choice(o));
  return model;
}
[[nodiscard]] inline const char* model_name(const options& o) {
  if (o.model == "vit") return "ViT 7x7 patches, dim 64, 4 blocks of 4 heads";
  return o.model == "cnn" ? "CNN conv8-pool-conv16-pool-linear" : "MLP 784-256-128-10";
}

// The modes that take a model call f with it: the MLP as the example's own hand-fused step
// (mlp_host, OpenBLAS, mixed precision), the CNN and the ViT as their layers in a
// partrain::sequential.
template <class F>
void with_model(const options& o, F&& f) {
  if (o.model != "mlp") {
    auto model = make_sequential(o);
    f(model);
  } else {
    models::mlp_host model({}, o.seed, parse_precision(o.precision));
    f(model);
  }
}

// --parallel zero1|zero2: DDP's step with the optimizer state (zero2: and the gradients) sharded
// over the ranks; checkpoints are sharded too.
inline void train_zero(process_group& pg, const options& o, const datasets& data) {
  with_model(o, [&](auto& model) { train_zero(model, pg, o, data); });
}
template <class Model>
void train_zero(Model& model, process_group& pg, const options& o, const datasets& data) {
  init_from(o, model, pg.rank());
  const auto compute = parse_precision(o.precision);
  zero_options zopts{.stage = o.parallel == "zero1" ? 1 : 2, .overlap = o.overlap};
  if (o.bucket_kb) zopts.bucket_cap_bytes = zopts.first_bucket_bytes = o.bucket_kb << 10;
  sharded_data_parallel zero(model, pg, optimizer_options(o), zopts);
  grad_scaler scaler = mixed_precision_policy{.compute = compute}.make_scaler();
  trace_recorder trace = make_trace(o);
  zero_policy policy(zero, {.scaler = compute == precision::fp32 ? nullptr : &scaler, .trace = &trace});
  loader train = rank_train(data, o, pg.rank(), pg.size());
  loader test = rank_test(data, pg.rank(), pg.size());
  if (pg.rank() == 0) {
    std::printf("fashion_mnist: %s, %d rank(s) over %s, %s, batch %zu per rank, lr %g, %zu epochs, "
                "%zu/%zu examples, precision %s\n", o.parallel.c_str(), pg.size(), std::string(pg.backend()).c_str(),
                model_name(o), o.batch_size, o.lr, o.epochs, data.n_train, data.n_test, o.precision.c_str());
  }
  fit(policy, train, test, fit_options(o, trace, train.size()));
  export_model(o, model, pg.rank());
  print_end(pg, parameter_checksum(model));
}

// fit() over fully sharded data parallel, whatever layers it holds.
template <class Fsdp>
void fit_fsdp(Fsdp& fsdp, process_group& pg, const options& o, const datasets& data, dtype wire) {
  trace_recorder trace = make_trace(o);
  grad_scaler scaler = grad_scaler::for_precision(parse_precision(o.precision));
  fsdp_policy policy(fsdp, {.scaler = scaler.enabled() ? &scaler : nullptr, .trace = &trace});
  loader train = rank_train(data, o, pg.rank(), pg.size());
  loader test = rank_test(data, pg.rank(), pg.size());
  if (pg.rank() == 0) {
    std::printf("fashion_mnist: fsdp, %d rank(s) over %s, %s%s, batch %zu per rank, lr %g, %zu epochs, "
                "%zu/%zu examples, gathers and reductions in %s\n", pg.size(), std::string(pg.backend()).c_str(),
                model_name(o), o.device == "cuda" ? " on CUDA" : "", o.batch_size, o.lr, o.epochs, data.n_train,
                data.n_test, std::string(to_string(wire)).c_str());
  }
  fit(policy, train, test, fit_options(o, trace, train.size()));
  const fsdp_memory m = fsdp.memory();
  if (pg.rank() == 0) {
    std::printf("rank 0 held at most %.2f MB of parameters (the whole model: %.2f MB)\n",
                static_cast<double>(m.peak_parameter_bytes) / 1e6, static_cast<double>(m.unsharded_parameter_bytes) / 1e6);
  }
  auto full = fsdp.summon_full_params();  // collective: the checksum and the export read the whole model
  export_model(o, full, pg.rank());
  print_end(pg, parameter_checksum(full));
}

// The dtype --precision gives the collectives that carry 16 bits (FSDP's gathers and reductions,
// the tensor-parallel activations): fp32 unless fp16 or bf16.
inline dtype collective_dtype(const options& o) {
  return o.precision == "bf16" ? dtype::bfloat16 : o.precision == "fp16" ? dtype::float16 : dtype::float32;
}

// --parallel fsdp: the model's layers, each layer's parameters (and their gradients and momentum)
// sharded over the ranks and gathered only around that layer's forward and backward.
// --precision fp16|bf16: parameters gathered and gradients reduced in 16 bits (FSDP's
// MixedPrecision); the chunks, the optimizer and the layers' arithmetic stay fp32. fp16 also
// scales the loss (a grad scaler, agreed across ranks) so small gradients survive the reduction.
// With --device cuda (fashion_mnist_cuda): the ViT's CUDA layers on GPU LOCAL_RANK, from the host
// ViT's initial weights.
inline void train_fsdp(process_group& pg, const options& o, const datasets& data) {
  const dtype wire = collective_dtype(o);
  const fsdp_options fo{.param_dtype = wire, .reduce_dtype = wire};
  if (o.device == "cuda") {
#if defined(__CUDACC__)
    const char* local = std::getenv("LOCAL_RANK");
    auto layers = models::layers::make_device_vit<models::cuda_backend>(vit_of(o), static_cast<std::uint32_t>(o.seed),
                                                                         device::cuda(local ? std::atoi(local) : 0));
    models::layers::device_softmax_cross_entropy<models::cuda_backend> loss(layers);
    fully_sharded_data_parallel fsdp(layers, pg, std::move(loss), optimizer_options(o), fo);
    fit_fsdp(fsdp, pg, o, data, wire);
    return;
#else
    throw config_error("--device cuda: this is the host build; run fashion_mnist_cuda (built where nvcc is found)");
#endif
  }
  auto model = make_sequential(o);
  init_from(o, model, pg.rank());
  fully_sharded_data_parallel fsdp(model, pg, optimizer_options(o), fo);
  fit_fsdp(fsdp, pg, o, data, wire);
}

// --tp N (the ViT): its blocks split over tensor-parallel groups of N consecutive ranks, on a
// device_mesh {dp: world / N, tp: N}, DDP (or with --parallel zero1|zero2|fsdp, ZeRO or FSDP) between the
// groups; the ranks of a group take the same batches, and only the group's first rank prints
// and writes metrics.
inline void train_tp(process_group& pg, const options& o, const datasets& data) {
  if (pg.size() % o.tp != 0) {
    throw config_error("--tp " + std::to_string(o.tp) + ": " + std::to_string(pg.size()) +
                       " ranks do not make whole tensor-parallel groups of that size");
  }
  device_mesh mesh(pg, {{"dp", pg.size() / o.tp}, {"tp", o.tp}});
  const int tp_rank = mesh.coordinate("tp"), dp_rank = mesh.coordinate("dp"), dp_size = mesh.size("dp");
  // --precision bf16: the tensor-parallel collectives (and FSDP's) in bf16 (fp16 is refused with --tp).
  const models::layers::tp_shard tp{.group = &mesh.group("tp"), .rank = static_cast<std::size_t>(tp_rank),
                                    .size = static_cast<std::size_t>(o.tp), .sequence_parallel = o.sequence_parallel,
                                    .wire = collective_dtype(o)};
  // The whole model (from --init-from when given, any tensor-parallel size's export), then this
  // rank's slice of it.
  sequential whole(models::layers::make_vit(vit_of(o), static_cast<std::uint32_t>(o.seed)), models::layers::softmax_cross_entropy{});
  init_from(o, whole, pg.rank());
  sequential model(models::layers::shard_vit(whole.layers(), vit_of(o), tp), models::layers::softmax_cross_entropy{});
  trace_recorder trace;
  loader train = rank_train(data, o, dp_rank, dp_size);
  loader test = rank_test(data, dp_rank, dp_size);
  if (pg.rank() == 0) {
    std::printf("fashion_mnist: tensor parallel %d%s%s x %s %d over %s, %s, batch %zu per replica, lr %g, "
                "%zu epochs, %zu/%zu examples\n", o.tp, o.sequence_parallel ? " (sequence parallel)" : "",
                tp.wire == dtype::bfloat16 ? " (bf16 collectives)" : "",
                o.parallel == "ddp" ? "data parallel" : o.parallel.c_str(), dp_size, std::string(pg.backend()).c_str(),
                model_name(o), o.batch_size, o.lr, o.epochs, data.n_train, data.n_test);
  }
  trainer_options fo = fit_options(o, trace, train.size());
  if (tp_rank != 0) {  // the group's other ranks see the same losses: one voice per replica
    fo.out = nullptr;
    fo.log_every = 0;
    fo.metrics.clear();
  }
  // --export: the whole model, every tensor-parallel group's slices gathered (each group the same).
  auto export_whole = [&] {
    if (o.export_to.empty()) return;
    sequential gathered(models::layers::gather_vit(model.layers(), vit_of(o), tp), models::layers::softmax_cross_entropy{});
    export_model(o, gathered, pg.rank());
  };
  if (o.parallel == "zero1" || o.parallel == "zero2") {  // the optimizer state (zero2: gradients) sharded over dp
    sharded_data_parallel zero(model, mesh.group("dp"), optimizer_options(o), {.stage = o.parallel == "zero1" ? 1 : 2});
    zero_policy policy(zero, {.rank_sections = &pg});  // checkpoints: each rank its slice and its optimizer shard
    fit(policy, train, test, fo);
  } else if (o.parallel == "fsdp") {  // parameters too, each layer gathered over dp around its use
    fully_sharded_data_parallel fsdp(model, mesh.group("dp"), optimizer_options(o),
                                     fsdp_options{.param_dtype = tp.wire, .reduce_dtype = tp.wire});
    fsdp_policy policy(fsdp, {.rank_sections = &pg});  // checkpoints: each rank its shards
    fit(policy, train, test, fo);
    auto full = fsdp.summon_full_params();  // the layers hold their values only while summoned (collective)
    export_whole();
    print_end(pg, parameter_checksum(model));
    return;
  } else {
    distributed_data_parallel ddp(model, mesh.group("dp"));
    any_optimizer opt = make_optimizer(model, o);
    ddp_policy policy(ddp, opt, {.rank_sections = &pg});  // checkpoints: each rank its slice of the blocks
    fit(policy, train, test, fo);
  }
  export_whole();
  print_end(pg, parameter_checksum(model));
}

// --deterministic S: every rank takes the whole global batch (the loader unsharded, the same order
// everywhere) and computes its shards of it; deterministic_data_parallel sums the shards'
// gradients exactly, so the trained parameters are the same bits at any world size up to S. With
// --parallel zero1 each rank steps its slice of the parameters (the optimizer state sharded);
// zero2 also reduce-scatters the exact sum a bucket at a time.
// fit() over a deterministic policy: every rank reads the whole global batch, the test set sharded.
template <class Policy>
void fit_deterministic(Policy& policy, process_group& pg, const options& o, const datasets& data, trace_recorder& trace,
                       const char* mode) {
  loader train = rank_train(data, o, 0, 1);
  loader test = rank_test(data, pg.rank(), pg.size());
  if (pg.rank() == 0) {
    std::printf("fashion_mnist: deterministic %s, %d rank(s) over %s, %s, global batch %zu in %zu shards (%zu a "
                "batch, %zu batch(es) a step), lr %g, %zu epochs, %zu/%zu examples\n", mode, pg.size(),
                std::string(pg.backend()).c_str(), model_name(o), o.batch_size * o.accumulate, o.deterministic,
                o.deterministic / o.accumulate, o.accumulate, o.lr, o.epochs, data.n_train, data.n_test);
  }
  fit(policy, train, test, fit_options(o, trace, train.size()));
}
template <class Model>
void train_deterministic(Model& model, process_group& pg, const options& o, const datasets& data) {
  init_from(o, model, pg.rank());
  trace_recorder trace = make_trace(o);
  auto run = [&](auto& policy, const char* mode) { fit_deterministic(policy, pg, o, data, trace, mode); };
  if (o.parallel == "zero1" || o.parallel == "zero2") {  // the optimizer state sharded over the ranks, the same bits
    // zero2: the exact sum reduce-scattered a bucket at a time (ZeRO's 25 MiB, or --bucket-kb).
    const std::size_t bucket_bytes = o.bucket_kb > 0 ? o.bucket_kb << 10 : zero_options{}.bucket_cap_bytes;
    const std::size_t bucket = o.parallel == "zero2" ? bucket_bytes / sizeof(std::int64_t) : 0;
    deterministic_sharded_data_parallel det(model, pg, optimizer_options(o),
                                            {.shards = o.deterministic, .bucket_elements = bucket});
    deterministic_sharded_policy policy(det);
    run(policy, o.parallel == "zero2" ? "ZeRO-2" : "ZeRO-1");
    if (o.parallel == "zero2") {
      std::printf("rank %d exact-sum scratch %.1f KB\n", pg.rank(), static_cast<double>(det.reduction_scratch_bytes()) / 1e3);
    }
  } else {
    deterministic_data_parallel det(model, pg, {.shards = o.deterministic});
    any_optimizer opt = make_optimizer(model, o);
    deterministic_policy policy(det, opt);
    run(policy, "data parallel");
  }
  export_model(o, model, pg.rank());
  print_end(pg, parameter_checksum(model));
}
// --deterministic S --parallel fsdp: the model's layers sharded as --parallel fsdp shards them; each
// rank computes its shards of the whole global batch and FSDP sums each layer's shard gradients
// exactly into the ranks' chunks (its own exact sum, so its own bits, the same at any world size).
inline void train_deterministic_fsdp(process_group& pg, const options& o, const datasets& data) {
  auto model = make_sequential(o);
  init_from(o, model, pg.rank());
  fully_sharded_data_parallel fsdp(model, pg, optimizer_options(o), {.deterministic_shards = o.deterministic});
  trace_recorder trace = make_trace(o);
  fsdp_policy policy(fsdp, {.trace = &trace});
  fit_deterministic(policy, pg, o, data, trace, "FSDP");
  auto full = fsdp.summon_full_params();  // collective: the checksum and the export read the whole model
  export_model(o, full, pg.rank());
  print_end(pg, parameter_checksum(full));
}

// --sync local-sgd|diloco: ranks step alone and meet every --period (or --inner-steps) steps.
inline void train_local(process_group& pg, const options& o, const datasets& data) {
  with_model(o, [&](auto& model) { train_local(model, pg, o, data); });
}
template <class Model>
void train_local(Model& model, process_group& pg, const options& o, const datasets& data) {
  init_from(o, model, pg.rank());
  any_optimizer opt = make_optimizer(model, o);
  trace_recorder trace = make_trace(o);
  loader train = rank_train(data, o, pg.rank(), pg.size());
  loader test = rank_test(data, pg.rank(), pg.size());
  if (pg.rank() == 0) {
    const std::string hosts = o.ranks_per_host > 0 ? " as " + std::to_string(pg.size() / o.ranks_per_host) +
                                                         " hosts of " + std::to_string(o.ranks_per_host)
                                                   : "";
    std::printf("fashion_mnist: %s, %d rank(s)%s over %s, %s, batch %zu per rank, lr %g, %zu epochs, "
                "%zu/%zu examples\n", o.sync.c_str(), pg.size(), hosts.c_str(), std::string(pg.backend()).c_str(),
                model_name(o), o.batch_size, o.lr, o.epochs, data.n_train, data.n_test);
  }
  auto run = [&](auto& algorithm) {
    local_sgd_policy policy(algorithm);
    fit(policy, train, test, fit_options(o, trace, train.size()));
  };
  if (o.sync == "local-sgd" && o.ranks_per_host > 0) {
    // Hierarchical: this rank's host is the group of ranks_per_host consecutive ranks.
    std::unique_ptr<process_group> host = new_subgroups(pg, o.ranks_per_host);
    post_local_sgd lsgd(model, opt, pg, *host, {.period = o.period, .warmup_steps = o.warmup_steps});
    run(lsgd);
  } else if (o.sync == "local-sgd") {
    post_local_sgd lsgd(model, opt, pg, {.period = o.period, .warmup_steps = o.warmup_steps});
    run(lsgd);
  } else {
    const auto bits = o.outer_bits == 8 ? outer_compression::int8 : o.outer_bits == 16 ? outer_compression::bf16
                                                                                          : outer_compression::none;
    diloco dl(model, opt, pg, {.inner_steps = o.inner_steps, .outer_lr = o.outer_lr, .outer_momentum = o.outer_momentum,
                               .compression = bits});
    run(dl);
  }
  export_model(o, model, pg.rank());
  print_end(pg, parameter_checksum(model));
}

// --parallel dp: one process, each batch scattered over --devices host devices (worker threads).
inline void train_dp(const options& o, const datasets& data) {
  with_model(o, [&](auto& model) { train_dp(model, o, data); });
}
template <class Model>
void train_dp(Model& model, const options& o, const datasets& data) {
  init_from(o, model, 0);
  std::vector<device> devices;
  for (int i = 0; i < o.devices; ++i) devices.push_back(device::cpu(i));
  data_parallel dp(model, devices, [&](Model& replica) { return make_optimizer(replica, o); });
  data_parallel_policy policy(dp);
  loader train = shuffled_train(data, o);
  loader test = whole_test(data);
  std::printf("fashion_mnist: dp, %d host device(s) in one process, %s, batch %zu, lr %g, %zu epochs, %zu/%zu examples\n",
              o.devices, model_name(o), o.batch_size, o.lr, o.epochs, data.n_train, data.n_test);
  trace_recorder trace = make_trace(o);
  fit(policy, train, test, fit_options(o, trace, train.size()));
  export_model(o, model, 0);
  std::printf("final parameter checksum %016llx\n", static_cast<unsigned long long>(parameter_checksum(model)));
}

// --parallel pipeline: the model's layers in --stages stages (one rank each); every rank reads the
// same batches. With --tp N (the ViT) each stage is N ranks, its blocks split over them; with more
// ranks than stages x N, the pipeline is replicated: world / (stages x N) data-parallel replicas,
// each its own share of the batches, every stage's gradients averaged over its replicas. The mesh
// is {pp, dp, tp} (tensor parallel innermost, pipeline outermost, as torchtitan lays it out).
inline void train_pipeline(process_group& pg, const options& o, const datasets& data) {
  const int per_replica = o.stages * o.tp;
  if (pg.size() % per_replica != 0) {
    throw config_error("--parallel pipeline --stages " + std::to_string(o.stages) + (o.tp > 1 ? " --tp " + std::to_string(o.tp) : "") +
                       " needs a multiple of " + std::to_string(per_replica) + " ranks (data-parallel replicas of " +
                       std::to_string(per_replica) + "), the job has " + std::to_string(pg.size()));
  }
  const int dp_size = pg.size() / per_replica;
  std::optional<device_mesh<process_group>> mesh;
  if (pg.size() > o.stages) mesh.emplace(pg, std::vector<mesh_dim>{{"pp", o.stages}, {"dp", dp_size}, {"tp", o.tp}});
  process_group& stages = mesh ? mesh->group("pp") : pg;
  const int tp_rank = mesh ? mesh->coordinate("tp") : 0, dp_rank = mesh ? mesh->coordinate("dp") : 0;
  auto model = o.tp > 1 ? sequential(models::layers::make_vit(vit_of(o), static_cast<std::uint32_t>(o.seed),
                                                          {.group = &mesh->group("tp"), .rank = static_cast<std::size_t>(tp_rank),
                                                           .size = static_cast<std::size_t>(o.tp),
                                                           .sequence_parallel = o.sequence_parallel,
                                                           .wire = collective_dtype(o)}),
                                 models::layers::softmax_cross_entropy{})
                    : make_sequential(o);
  // The stages balanced by each layer's time on one micro-batch of real inputs (rank 0 measures),
  // or, when resuming must find the same cut (and on a mesh, where every tensor-parallel
  // coordinate and every replica must cut the same), by the layers' parameter counts.
  const std::size_t probe_rows = std::max<std::size_t>(1, std::min(data.n_train, o.batch_size) / static_cast<std::size_t>(o.micro_batches));
  const auto probe = o.checkpoint.empty() && !mesh ? data.train.features().slice(0, probe_rows) : tensor_view<const float>{};
  pipeline_stage stage(model, stages, {.kind = o.schedule == "gpipe" ? pipeline_schedule_kind::gpipe : pipeline_schedule_kind::one_f_one_b,
                                        .micro_batches = o.micro_batches,
                                        .probe = probe,
                                        .data_parallel = dp_size > 1 ? &mesh->group("dp") : nullptr});
  auto params = stage.parameters();  // this rank's layers' parameters, as a model for sgd
  any_optimizer opt = make_optimizer(params, o);
  // On a mesh, checkpoints hold a section per rank of the whole job (each its slice of its stage).
  pipeline_policy policy(stage, stages, opt, model.loss(), {.rank_sections = mesh ? &pg : nullptr});
  loader train = rank_train(data, o, dp_rank, dp_size);  // at one replica, the whole shuffled order
  loader test = whole_test(data);
  if (pg.rank() == 0) {
    const std::string tp = o.tp > 1 ? " x tensor parallel " + std::to_string(o.tp) + (o.sequence_parallel ? " (sequence parallel)" : "") +
                                          (o.precision == "bf16" ? " (bf16 collectives)" : "")
                                    : "";
    const std::string dp = dp_size > 1 ? " x data parallel " + std::to_string(dp_size) : "";
    std::printf("fashion_mnist: pipeline, %d stage(s)%s%s over %s, %s, %s with %d micro-batches, batch %zu per replica, "
                "lr %g, %zu epochs, %zu/%zu examples\n", o.stages, dp.c_str(), tp.c_str(), std::string(pg.backend()).c_str(),
                model_name(o), o.schedule.c_str(), o.micro_batches, o.batch_size, o.lr, o.epochs, data.n_train, data.n_test);
    std::printf("%s", stage.layout().to_string().c_str());  // which layers each stage runs
  }
  trace_recorder trace = make_trace(o);
  trainer_options fo = fit_options(o, trace, train.size());
  if (tp_rank != 0 || dp_rank != 0) {  // a stage's other ranks see the same losses: one voice
    fo.out = nullptr;
    fo.log_every = 0;
    fo.metrics.clear();
  }
  fit(policy, train, test, fo);
}

}  // namespace example::fm
