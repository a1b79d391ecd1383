// examples/fashion_mnist/common.hpp: what every mode of the example shares: the data (with
// --limit-train/--limit-test), each rank's loaders, the trainer's options (schedule, checkpoint,
// metrics, trace, the launcher's restart test hook) and the closing lines.
#pragma once

#include <signal.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <partrain/partrain.hpp>
#include <ranges>
#include <string>
#include <string_view>

#include "options.hpp"

namespace example::fm {

using namespace partrain;

struct datasets {
  in_memory_dataset train, test;
  std::size_t n_train = 0, n_test = 0;  // after --limit-train / --limit-test
};

inline datasets load_data(const options& o) {
  const std::filesystem::path dir = o.data.empty() ? fashion_mnist_dir() : std::filesystem::path(o.data);
  datasets d{load_fashion_mnist(fashion_mnist_split::train, fashion_mnist_normalization(), dir),
             load_fashion_mnist(fashion_mnist_split::test, fashion_mnist_normalization(), dir)};
  d.n_train = o.limit_train ? std::min(o.limit_train, d.train.size()) : d.train.size();
  d.n_test = o.limit_test ? std::min(o.limit_test, d.test.size()) : d.test.size();
  return d;
}

// The tests' faults: PARTRAIN_EXAMPLE_KILL_AT_STEP=k (rank 1 SIGKILLs itself at step k), or a list
// R:k,R:k,... (rank, or replica, R at step k). The step `replica` dies at; -1: none.
[[nodiscard]] inline std::int64_t injected_failure_step(int replica) {
  const char* env = std::getenv("PARTRAIN_EXAMPLE_KILL_AT_STEP");
  if (!env) return -1;
  const std::string_view list = env;
  if (list.find(':') == std::string_view::npos) return replica == 1 ? std::strtoll(env, nullptr, 10) : -1;
  for (std::size_t at = 0; at < list.size();) {
    const std::size_t end = std::min(list.find(',', at), list.size());
    const std::string item(list.substr(at, end - at));
    const std::size_t colon = item.find(':');
    if (colon != std::string::npos && std::strtol(item.c_str(), nullptr, 10) == replica) {
      return std::strtoll(item.c_str() + colon + 1, nullptr, 10);
    }
    at = end + 1;
  }
  return -1;
}

// What every mode shares: the schedule (cosine by epoch, or --lr-warmup steps then cosine by step
// over the run's optimizer steps: batches_per_epoch / --accumulate, times the epochs), gradient
// accumulation, checkpoint, metrics, trace and the launcher's restart test hook
// (PARTRAIN_EXAMPLE_KILL_AT_STEP, injected_failure_step: at attempt 0 only).
inline trainer_options fit_options(const options& o, trace_recorder& trace, std::size_t batches_per_epoch) {
  trainer_options t{.epochs = o.epochs, .lr = cosine_lr{.base = o.lr, .epochs = o.epochs}, .metrics = o.metrics,
                    .log_every = o.log_every, .trace = &trace};
  t.gradient_accumulation_steps = o.accumulate;
  if (o.lr_warmup > 0) {
    const auto warmup = static_cast<std::size_t>(o.lr_warmup);
    const std::size_t steps = (batches_per_epoch + o.accumulate - 1) / o.accumulate;
    t.lr = {};
    t.step_lr = warmup_cosine_lr{.base = o.lr, .warmup_steps = warmup, .total_steps = std::max(warmup + 1, steps * o.epochs)};
  }
  t.loop = o.loop == "plain" ? loop_style::plain : o.loop == "coroutine" ? loop_style::coroutine : loop_style::ranges;
  if (!o.checkpoint.empty()) t.checkpoint = std::filesystem::path(o.checkpoint) / "fashion_mnist.ckpt";
  const char* rank = std::getenv("RANK");  // partrun's and torchrun's (the restart tests' launchers)
  const char* attempt = std::getenv("PARTRAIN_RESTART_COUNT");  // partrun's, else torchrun's
  if (!attempt) attempt = std::getenv("TORCHELASTIC_RESTART_COUNT");
  const int me = rank ? std::atoi(rank) : -1;
  const std::int64_t kill_at = me >= 0 ? injected_failure_step(me) : -1;
  if (kill_at >= 0 && attempt && std::string_view(attempt) == "0") {
    t.before_step = [k = static_cast<std::size_t>(kill_at), me](std::size_t step) {
      if (step != k) return;
      std::printf("rank %d: injected failure at step %zu\n", me, step);
      std::fflush(stdout);
      ::raise(SIGKILL);
    };
  }
  return t;
}

// --optimizer: the sharded modes' optimizer options, and an optimizer over a model's parameters
// for the others (one type, any_optimizer, so each mode's policy is compiled once).
[[nodiscard]] inline shard_optimizer_options optimizer_options(const options& o) {
  if (o.optimizer == "adamw") return adamw_options{.lr = o.lr, .weight_decay = o.weight_decay};
  return sgd_options{.lr = o.lr, .momentum = o.momentum};
}
template <class Model>
[[nodiscard]] any_optimizer make_optimizer(Model& model, const options& o) {
  if (o.optimizer == "adamw") return adamw(model, {.lr = o.lr, .weight_decay = o.weight_decay});
  return sgd(model, {.lr = o.lr, .momentum = o.momentum});
}

// prefetch_batches for the calling thread's CPUs: a rank asks on its own thread, after pinning.
[[nodiscard]] inline std::size_t prefetch_here(const options& o) {
  return prefetch_batches(o, partrain::allowed_cpus().size());
}

// dp and pipeline: every step sees the whole batch, so one shuffled order and the whole test set.
inline auto shuffled_train(const datasets& d, const options& o) {
  return loader(d.train, views::shuffled(d.n_train, o.seed),
                {.batch_size = o.batch_size, .prefetch = prefetch_here(o)});
}
inline auto whole_test(const datasets& d) {
  return loader(d.test, std::views::iota(std::size_t{0}, d.n_test), {.batch_size = 1000, .prefetch = 0});
}

inline trace_recorder make_trace(const options& o) {
  return o.trace.empty() ? trace_recorder::from_env() : trace_recorder(std::filesystem::path(o.trace));
}

// DDP, ZeRO and the local modes: each rank its share of every epoch's shuffled order, and a
// contiguous block of the test set (every example counted exactly once).
inline auto rank_train(const datasets& d, const options& o, int rank, int world) {
  return loader(d.train, views::distributed(d.n_train, world, rank, {.shuffle = true, .seed = o.seed}),
                {.batch_size = o.batch_size, .prefetch = prefetch_here(o)});
}
inline auto rank_test(const datasets& d, int rank, int world) {
  return loader(d.test, views::shard(d.n_test, world, rank), {.batch_size = 1000, .prefetch = 0});
}

// --init-from FILE: the weights of a safetensors file, loaded on every rank into the model before
// a mode wraps it (DDP, ZeRO and FSDP start from the values they are given).
template <class Model>
void init_from(const options& o, Model& model, int rank) {
  if (o.init_from.empty()) return;
  load_safetensors(o.init_from, model);
  if (rank == 0) {
    std::printf("initialized from %s (parameter checksum %016llx)\n", o.init_from.c_str(),
                static_cast<unsigned long long>(parameter_checksum(model)));
  }
}
// --export FILE: rank 0 writes the whole trained model (under FSDP the summoned full parameters).
template <class Model>
void export_model(const options& o, Model& model, int rank) {
  if (o.export_to.empty() || rank != 0) return;
  save_safetensors(o.export_to, model, {.metadata = {{"model", o.model}}});
  std::printf("exported %s (parameter checksum %016llx)\n", o.export_to.c_str(),
              static_cast<unsigned long long>(parameter_checksum(model)));
}

inline void print_end(process_group& pg, std::uint64_t checksum) {
  // Bytes this rank sent (ring-algorithm bytes, comm_traffic), what the communication modes save.
  std::printf("rank %d sent %.1f MB\n", pg.rank(), static_cast<double>(pg.traffic().bytes_sent) / 1e6);
  if (pg.rank() == 0) std::printf("final parameter checksum %016llx\n", static_cast<unsigned long long>(checksum));
}

}  // namespace example::fm
