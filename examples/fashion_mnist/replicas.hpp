// examples/fashion_mnist/replicas.hpp: the example as a fault-tolerant job. Started by
// `partrun --spares N` (a fixed world: the slots keep their rows, the result is bit-identical to
// a run without failures) or `--min-replicas M` (a dynamic world: the members present share each
// global batch), every process is a replica of a replica_group: a lost one costs its step, not
// the job, and a spare or a replacement receives the model and optimizer from a live replica.
//
// partrain's replica_trainer runs the loop: the data order is a function of the global step
// alone (epoch e's shuffled order, cut into global batches of --batch-size x the job's slots, each
// shared out among the members present), so every example of every epoch is trained exactly once,
// whoever is present; slot 0 prints each epoch's count of trained rows. With --sync local-sgd
// (--period N) or diloco (--inner-steps H), each replica step is a round of local steps.
#pragma once

#include <signal.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <partrain/partrain.hpp>

#include "common.hpp"
#include "options.hpp"

namespace example::fm {

// What a replica cannot do (yet), refused by name before anything starts.
inline void refuse_for_replicas(const options& o) {
  auto refuse = [](const std::string& what, const std::string& why) {
    throw config_error("started for a fault-tolerant job (partrun --spares or --min-replicas): " + what + " " + why);
  };
  if (o.parallel != "ddp") {
    refuse("--parallel " + o.parallel,
           "is not offered: a joining replica heals from one live replica's whole state, and ZeRO, FSDP and pipeline "
           "stages spread theirs over the ranks");
  }
  if (o.sync == "powersgd") refuse("--sync powersgd", "is not offered: its error feedback is each rank's own state");
  if (o.sync == "local-sgd" && o.warmup_steps > 0) refuse("--warmup-steps", "is not offered: the rounds start at once");
  if (o.sync == "local-sgd" && o.ranks_per_host > 0) refuse("--ranks-per-host", "is not offered: a replica is one rank");
  if (o.sync == "diloco" && o.outer_bits != 32) refuse("--outer-bits", "is not offered: the average travels in 32 bits");
  if ((o.sync == "local-sgd" && o.period == 1) || (o.sync == "diloco" && o.inner_steps == 1)) {
    refuse("--sync " + o.sync + " with rounds of 1 batch",
           "is not offered: a replica's step of one batch sums the gradients (use --sync ddp, or rounds of 2 or more)");
  }
  if (o.tp > 1) refuse("--tp", "is not offered: tensor parallel groups cannot change at a step boundary yet");
  if (o.deterministic > 0) refuse("--deterministic", "is not offered with replicas");
  if (o.accumulate > 1) refuse("--accumulate", "is not offered: a replica's step is one batch");
  if (o.bucket_kb > 0) {
    refuse("--bucket-kb " + std::to_string(o.bucket_kb),
           "is not offered: a replica's step reduces its gradients, loss and rows in one all-reduce, after the backward");
  }
  if (o.device != "cpu") refuse("--device " + o.device, "is not offered: the replicas train on the host");
  if (o.precision != "fp32") refuse("--precision " + o.precision, "is not offered: a grad scaler's state is not sent yet");
  if (o.backend != "gloo") refuse("--backend " + o.backend, "is not offered: the quorums' groups are gloo groups");
  if (o.nproc != 0) refuse("--nproc", "is partrun's to set: it started this process");
  if (!o.checkpoint.empty()) {
    refuse("--checkpoint", "is not offered: a replica that joins heals from a live one, not from a file");
  }
}

// --trace FILE (or PARTRAIN_TRACE) under replicas: each replica writes its own events (joins,
// heals, failures on the recovery track) to FILE with ".replica<R>" before its extension, as no
// group of every replica is left at the end to merge them over.
[[nodiscard]] inline trace_recorder replica_trace(const options& o, int replica) {
  const trace_recorder job = make_trace(o);  // the file a rank 0 would merge every rank into
  if (!job.enabled()) return trace_recorder();
  std::filesystem::path path = job.path();
  const auto ext = path.extension();
  path.replace_extension();
  path += ".replica" + std::to_string(replica);
  path += ext;
  return trace_recorder(path);
}

template <class Model>
void train_replica(Model& model, const replica_launch& launch, const options& o, const datasets& data) {
  const int me = launch.replica;
  init_from(o, model, me);
  any_optimizer opt = make_optimizer(model, o);
  std::optional<metrics_writer> metrics;
  if (!o.metrics.empty()) metrics.emplace(o.metrics);
  trace_recorder trace = replica_trace(o, me);
  const bool fixed = launch.policy.mode == world_size_mode::fixed_with_spares;
  const std::size_t slots = static_cast<std::size_t>(fixed ? launch.policy.slots : launch.replicas);
  const std::size_t global = o.batch_size * slots, per_epoch = (data.n_train + global - 1) / global;
  const std::size_t warmup = o.lr_warmup > 0 ? static_cast<std::size_t>(o.lr_warmup) : 0;
  // --sync local-sgd / diloco: rounds of --period / --inner-steps batches, each slot stepping alone.
  const std::size_t sync_every = o.sync == "local-sgd" ? static_cast<std::size_t>(o.period)
                                 : o.sync == "diloco"  ? static_cast<std::size_t>(o.inner_steps)
                                                       : 1;
  const std::int64_t kill_at = injected_failure_step(me);  // the tests' fault: -1, none for this replica
  replica_group* live = nullptr;  // the group below, once built: a replacement (healed) must not die again

  replica_trainer trainer(
      model, opt, data.train,
      {.batch_size = o.batch_size,
       .slots = slots,
       .epochs = o.epochs,
       .seed = o.seed,
       .examples = data.n_train,
       .lr = [&](std::size_t step, std::size_t epoch) {
         return warmup ? warmup_cosine_lr{.base = o.lr, .warmup_steps = warmup, .total_steps = per_epoch * o.epochs}(step)
                       : cosine_lr{.base = o.lr, .epochs = o.epochs}(epoch);
       },
       .before_step = [&](std::int64_t step) {
         if (kill_at == step && live && live->heals() == 0) {
           std::printf("replica %d: injected failure at step %lld\n", me, static_cast<long long>(step));
           std::fflush(stdout);
           ::raise(SIGKILL);
         }
       },
       .sync_every = sync_every,
       .outer = o.sync == "diloco" ? std::optional<sgd_options>(sgd_options{.lr = o.outer_lr,
                                                                             .momentum = o.outer_momentum,
                                                                             .nesterov = o.outer_momentum > 0})
                                   : std::nullopt});
  replica_group rg(launch.connect(), gloo_groups_by_id(launch.connect(), {.timeout = std::chrono::seconds(30)}),
                   trainer.state(),
                   {.replica = me, .on_event = replica_event_sink(me, metrics ? &*metrics : nullptr, &trace)});
  live = &rg;
  if (me == 0) {
    const std::string rounds =
        sync_every == 1 ? std::string() : ", " + o.sync + " rounds of " + std::to_string(sync_every) + " batches";
    std::printf("fashion_mnist: fault-tolerant data parallel%s, %s, %zu slot(s)%s, global batch %zu, lr %g, %zu epochs, "
                "%zu/%zu examples\n", rounds.c_str(), model_name(o), slots,
                fixed ? " (spares wait)" : " (dynamic: any members present)", global, o.lr, o.epochs, data.n_train,
                data.n_test);
  }
  (void)trainer.run(rg, [&](const replica_epoch& e) {
    if (e.slot != 0) return;  // slot 0 evaluates and reports
    eval_result r;
    for (auto&& b : whole_test(data)) r += model.eval_step(b);
    const double accuracy = static_cast<double>(r.correct) / static_cast<double>(r.count);
    std::printf("epoch %zu/%zu: %llu of %zu training examples trained, train_loss %.4f, test_loss %.4f, "
                "test_accuracy %.4f\n", e.epoch, o.epochs, static_cast<unsigned long long>(e.trained), data.n_train,
                e.train_loss, r.loss_sum / static_cast<double>(r.count), accuracy);
    std::fflush(stdout);
    if (metrics) {
      metrics->epoch(static_cast<std::int64_t>(e.epoch), {{"trained", static_cast<std::int64_t>(e.trained)},
                                                          {"train_loss", e.train_loss},
                                                          {"test_accuracy", accuracy}});
    }
  });
  rg.finish();
  trace.finish_alone(me);
  if (rg.slot() != 0) return;  // slot 0 of the last quorum closes the run
  eval_result r;
  for (auto&& b : whole_test(data)) r += model.eval_step(b);
  std::printf("replica %d: %d failure(s) lived through, %d heal(s)\n", me, rg.failures(), rg.heals());
  std::printf("final test_accuracy %.4f\n", static_cast<double>(r.correct) / static_cast<double>(r.count));
  export_model(o, model, 0);
  std::printf("final parameter checksum %016llx\n", static_cast<unsigned long long>(parameter_checksum(model)));
}

}  // namespace example::fm
