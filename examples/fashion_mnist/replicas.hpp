// examples/fashion_mnist/replicas.hpp: the example as a fault-tolerant job. Started by
// `partrun --spares N` (a fixed world: the slots keep their rows, the result is bit-identical to
// a run without failures) or `--min-replicas M` (a dynamic world: the members present share each
// global batch), every process is a replica of a replica_group: a lost one costs its step, not
// the job, and a spare or a replacement receives the model and optimizer from a live replica.
//
// The data order is a function of the global step alone: epoch e's shuffled order, cut into
// global batches of --batch-size x the job's slots, each shared out among the members present
// (replica_rows). So every example of every epoch is trained exactly once, whoever is present;
// the members count the rows of each committed step in the step's all-reduce, and slot 0 prints
// the count each epoch.
#pragma once

#include <signal.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
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
  if (o.sync != "ddp") refuse("--sync " + o.sync, "is not offered: the replicas reduce their gradients every step");
  if (o.tp > 1) refuse("--tp", "is not offered: tensor parallel groups cannot change at a step boundary yet");
  if (o.deterministic > 0) refuse("--deterministic", "is not offered with replicas");
  if (o.accumulate > 1) refuse("--accumulate", "is not offered: a replica's step is one batch");
  if (o.device != "cpu") refuse("--device " + o.device, "is not offered: the replicas train on the host");
  if (o.precision != "fp32") refuse("--precision " + o.precision, "is not offered: a grad scaler's state is not sent yet");
  if (o.backend != "gloo") refuse("--backend " + o.backend, "is not offered: the quorums' groups are gloo groups");
  if (o.nproc != 0) refuse("--nproc", "is partrun's to set: it started this process");
  if (!o.checkpoint.empty()) {
    refuse("--checkpoint", "is not offered: a replica that joins heals from a live one, not from a file");
  }
  if (!o.trace.empty()) refuse("--trace", "is not offered with replicas yet (each replica's events go to --metrics)");
}

template <class Model>
void zero_grads(Model& model) {
  for (auto&& p : model.parameters()) {
    auto g = p.grad();
    std::fill(g.begin(), g.end(), 0.0f);
  }
}

template <class Model>
void train_replica(Model& model, const replica_launch& launch, const options& o, const datasets& data) {
  const int me = launch.replica;
  init_from(o, model, me);
  any_optimizer opt = make_optimizer(model, o);
  // Moves with the state: sampler_position counts this epoch's trained rows, user the loss sum.
  checkpoint_extra extra;
  std::optional<metrics_writer> metrics;
  if (!o.metrics.empty()) metrics.emplace(o.metrics);
  const bool fixed = launch.policy.mode == world_size_mode::fixed_with_spares;
  const std::size_t slots = static_cast<std::size_t>(fixed ? launch.policy.slots : launch.replicas);
  const std::size_t global = o.batch_size * slots;
  const std::size_t per_epoch = (data.n_train + global - 1) / global;
  const auto total = static_cast<std::int64_t>(per_epoch * o.epochs);
  const std::size_t warmup = o.lr_warmup > 0 ? static_cast<std::size_t>(o.lr_warmup) : 0;
  const char* kill_at = std::getenv("PARTRAIN_EXAMPLE_KILL_AT_STEP");  // the tests' fault: RANK 1 dies there

  replica_group rg(launch.connect(), gloo_groups_by_id(launch.connect(), {.timeout = std::chrono::seconds(30)}),
                   replica_state_of(model, opt, &extra),
                   {.replica = me, .on_event = replica_event_sink(me, metrics ? &*metrics : nullptr, nullptr)});
  if (me == 0) {
    std::printf("fashion_mnist: fault-tolerant data parallel, %s, %zu slot(s)%s, global batch %zu, lr %g, %zu epochs, "
                "%zu/%zu examples\n", model_name(o), slots, fixed ? " (spares wait)" : " (dynamic: any members present)",
                global, o.lr, o.epochs, data.n_train, data.n_test);
  }
  auto order = views::shuffled(data.n_train, o.seed);
  std::vector<std::size_t> rows;
  std::vector<float> features, reduced;
  std::vector<std::int32_t> labels;
  double step_rows = 0, step_loss = 0;
  while (rg.current_step() < total) {
    const bool more = rg.step(
        [&](process_group& g, int slot, std::int64_t step) {
          if (kill_at && me == 1 && std::strtoll(kill_at, nullptr, 10) == step && rg.heals() == 0) {
            std::printf("replica 1: injected failure at step %lld\n", static_cast<long long>(step));
            std::fflush(stdout);
            ::raise(SIGKILL);
          }
          const auto epoch = static_cast<std::size_t>(step) / per_epoch;
          const std::size_t first = (static_cast<std::size_t>(step) % per_epoch) * global;
          const std::size_t n = std::min(global, data.n_train - first);
          opt.set_lr(warmup ? warmup_cosine_lr{.base = o.lr, .warmup_steps = warmup, .total_steps = static_cast<std::size_t>(total)}(
                                  static_cast<std::size_t>(step))
                            : cosine_lr{.base = o.lr, .epochs = o.epochs}(epoch));
          if (order.epoch() != epoch) order.set_epoch(epoch);
          // This member's rows of the global batch, whoever else is present.
          const auto mine = replica_rows(n, slot, g.size());
          double loss = 0;
          if (mine.count == 0) {
            zero_grads(model);
          } else {
            rows.resize(mine.count);
            for (std::size_t i = 0; i < mine.count; ++i) rows[i] = order.element(first + mine.first + i);
            const std::size_t width = data.train.example_shape().numel();
            features.resize(mine.count * width);
            labels.resize(mine.count);
            data.train.fetch(rows, tensor_view<float>(features.data(), shape{mine.count, width}),
                             tensor_view<std::int32_t>(labels.data(), mine.count));
            loss = model.train_step(batch{tensor_view<const float>(features.data(), shape{mine.count, width}),
                                          tensor_view<const std::int32_t>(labels.data(), mine.count), rows});
          }
          // The global batch's mean gradient: each member's mean weighted by its share of the rows,
          // summed; the step's rows and loss ride along in the same all-reduce.
          const float share = static_cast<float>(mine.count) / static_cast<float>(n);
          reduced.clear();
          for (auto&& p : model.parameters()) {
            for (const float v : p.grad()) reduced.push_back(v * share);
          }
          reduced.push_back(static_cast<float>(loss * static_cast<double>(mine.count)));
          reduced.push_back(static_cast<float>(mine.count));
          g.all_reduce(tensor_view<float>(reduced), reduce_op::sum).wait();
          std::size_t at = 0;
          for (auto&& p : model.parameters()) {
            auto gr = p.grad();
            std::copy_n(reduced.begin() + static_cast<std::ptrdiff_t>(at), gr.size(), gr.begin());
            at += gr.size();
          }
          step_loss = reduced[at];
          step_rows = reduced[at + 1];
        },
        [&] {
          opt.step();
          extra.sampler_position += static_cast<std::uint64_t>(step_rows);
          double loss_sum = 0;
          if (extra.user.size() == sizeof loss_sum) std::memcpy(&loss_sum, extra.user.data(), sizeof loss_sum);
          loss_sum += step_loss;
          extra.user.resize(sizeof loss_sum);
          std::memcpy(extra.user.data(), &loss_sum, sizeof loss_sum);
          const auto done = static_cast<std::size_t>(rg.current_step() + 1);  // the step just applied, counted
          if (done % per_epoch != 0) return;
          // The epoch's end: slot 0 evaluates and reports; every member starts the next count.
          if (rg.slot() == 0) {
            eval_result r;
            for (auto&& b : whole_test(data)) r += model.eval_step(b);
            const std::size_t epoch = done / per_epoch;
            std::printf("epoch %zu/%zu: %llu of %zu training examples trained, train_loss %.4f, test_loss %.4f, "
                        "test_accuracy %.4f\n", epoch, o.epochs, static_cast<unsigned long long>(extra.sampler_position),
                        data.n_train, loss_sum / static_cast<double>(data.n_train), r.loss_sum / static_cast<double>(r.count),
                        static_cast<double>(r.correct) / static_cast<double>(r.count));
            std::fflush(stdout);
            if (metrics) {
              metrics->epoch(static_cast<std::int64_t>(epoch),
                             {{"trained", static_cast<std::int64_t>(extra.sampler_position)},
                              {"train_loss", loss_sum / static_cast<double>(data.n_train)},
                              {"test_accuracy", static_cast<double>(r.correct) / static_cast<double>(r.count)}});
            }
          }
          extra.sampler_position = 0;
          extra.user.clear();
        });
    if (!more) break;
  }
  rg.finish();
  if (rg.slot() != 0) return;  // slot 0 of the last quorum closes the run
  eval_result r;
  for (auto&& b : whole_test(data)) r += model.eval_step(b);
  std::printf("replica %d: %d failure(s) lived through, %d heal(s)\n", me, rg.failures(), rg.heals());
  std::printf("final test_accuracy %.4f\n", static_cast<double>(r.correct) / static_cast<double>(r.count));
  export_model(o, model, 0);
  std::printf("final parameter checksum %016llx\n", static_cast<unsigned long long>(parameter_checksum(model)));
}

}  // namespace example::fm
