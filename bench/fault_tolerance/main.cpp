// bench_fault_tolerance: fault-tolerant data parallelism (parallel/replica_group.hpp) on the
// example MLP (784-256-128-10), DDP + SGD with momentum, 64 rows per rank.
//   quorum_overhead  the fault-free cost of replica_group's step (its commit round, the heartbeat
//                    thread) as a fraction of plain DDP's step: 2 ranks as threads, collectives
//                    inline on pinned ranks (the main job's backend), alternated windows, medians
//   trainer_overhead the same for replica_trainer, the loop the example runs (its rows fetched from
//                    a dataset, its loss and rows counted in the step's reduction)
//   recovery_s       2 slots + 1 spare as Gloo processes over loopback; slot 1's process SIGKILLs
//                    itself mid-run: seconds from the kill to the next step slot 0 commits (median
//                    of the runs), with the spare's heal (bytes, seconds) and the steps redone
//   restart_s        for comparison, a restart: the Fashion-MNIST example (2 Gloo ranks, a checkpoint
//                    each epoch) under partrun --max-restarts 1 with rank 1 SIGKILLed mid-epoch, its
//                    whole run's time minus the same run's without the kill, and the steps redone
//   bench_fault_tolerance [--quick] [--steps N] [--windows N] [--kills N]
#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <csignal>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <partrain/comm/gloo.hpp>
#include <partrain/launch/process.hpp>
#include <partrain/comm/local.hpp>
#include <partrain/data/in_memory_dataset.hpp>
#include <partrain/data/batch.hpp>
#include <partrain/model/sequential.hpp>
#include <partrain/optim/adamw.hpp>
#include <partrain/optim/sgd.hpp>
#include <partrain/optim/state_io.hpp>
#include <partrain/parallel/ddp.hpp>
#include <partrain/parallel/lighthouse.hpp>
#include <partrain/parallel/replica_group.hpp>
#include <partrain/train/replica_state.hpp>
#include <partrain/train/replica_trainer.hpp>
#include <partrain/rendezvous/tcp_store.hpp>
#include <partrain/rendezvous/tcp_store_server.hpp>

#include "median.hpp"
#include "mlp_host.hpp"
#include "vit_layers.hpp"

extern char** environ;

namespace {

using namespace partrain;
using namespace std::chrono_literals;
using ::partrain::bench::median;
using mlp = models::mlp_host;

constexpr std::size_t per_rank = 64;

// Synthetic rows: the step's cost does not depend on the values.
struct rows {
  std::vector<float> x;
  std::vector<std::int32_t> y;
  explicit rows(std::size_t slots) : x(slots * per_rank * 784), y(slots * per_rank) {
    for (std::size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>((i * 2654435761u) % 1000) / 1000.0f - 0.5f;
    for (std::size_t i = 0; i < y.size(); ++i) y[i] = static_cast<std::int32_t>((i * 7) % 10);
  }
  [[nodiscard]] batch of(int slot) const {
    const auto s = static_cast<std::size_t>(slot);
    return {tensor_view<const float>(x.data() + s * per_rank * 784, shape{per_rank, 784}),
            tensor_view<const std::int32_t>(y.data() + s * per_rank, per_rank), {}};
  }
};

// DDP bound to the group of the replica's quorum: made anew when the quorum changes (a group
// made later may sit at the address of one destroyed, so the quorum's id is what tells).
template <class M>
struct ddp_in_quorum {
  M& model;
  const replica_group& rg;
  std::optional<distributed_data_parallel<M>> ddp{};
  std::int64_t bound = -1;
  double step(process_group& g, const batch& b) {
    if (rg.current_quorum().id != bound) {
      ddp.reset();
      ddp.emplace(model, g);
      bound = rg.current_quorum().id;
    }
    return ddp->train_step(b);
  }
};

tcp_store_options client(std::uint16_t port) { return {.port = port, .timeout = 30s, .reconnect_timeout = 1s}; }

// The loops a window times: plain DDP, DDP inside replica_group (a hand-written step), and
// replica_trainer (the loop the example runs: its rows fetched from a dataset, its loss counted).
enum class loop { plain, in_group, trainer };

// Seconds per step on rank 0 of a window of `steps` steps (after one untimed step).
double window(loop kind, std::size_t steps, const rows& data) {
  const bool ft = kind != loop::plain;
  process_group_options o;
  o.inline_collectives = o.pin_threads = true;
  std::optional<tcp_store_server> server;
  std::optional<lighthouse> lh;
  if (ft) {
    server.emplace();
    lh.emplace(std::make_shared<tcp_store>(client(server->port())), lighthouse_options{.replicas = 2, .policy = {.slots = 2}});
  }
  local_group_registry registry(o);
  std::vector<double> secs(2);
  run_local(2, [&](local_group& g) {
    mlp model({}, 1);
    sgd opt(model, {.lr = 0.01, .momentum = 0.9});
    const auto r = static_cast<std::size_t>(g.rank());
    if (!ft) {
      distributed_data_parallel ddp(model, g);
      const auto b = data.of(g.rank());
      (void)ddp.train_step(b);
      opt.step();
      g.barrier().wait();
      const auto t0 = std::chrono::steady_clock::now();
      for (std::size_t s = 0; s < steps; ++s) {
        (void)ddp.train_step(b);
        opt.step();
      }
      g.barrier().wait();
      secs[r] = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / static_cast<double>(steps);
      return;
    }
    auto groups = [&](std::int64_t id, int rank, int size) { return registry.make(id, rank, size); };
    if (kind == loop::trainer) {
      // One epoch of steps + 1 global batches of the same 128 rows (the step's cost does not depend
      // on which rows); the clock starts at step 1.
      host_buffer<float> x(shape{data.y.size(), 784});
      std::copy(data.x.begin(), data.x.end(), x.data());
      const in_memory_dataset set(std::move(x), data.y, 10);
      std::chrono::steady_clock::time_point t0;
      replica_trainer trainer(model, opt, set,
                              {.batch_size = per_rank, .slots = 2, .epochs = steps + 1, .before_step = [&](std::int64_t s) {
                                 if (s == 1) t0 = std::chrono::steady_clock::now();
                               }});
      replica_group rg(std::make_shared<tcp_store>(client(server->port())), groups, trainer.state(), {.replica = g.rank()});
      trainer.run(rg);
      secs[r] = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / static_cast<double>(steps);
      rg.finish();
      return;
    }
    replica_group rg(std::make_shared<tcp_store>(client(server->port())), groups, replica_state_of(model, opt),
                     {.replica = g.rank()});
    ddp_in_quorum<mlp> d{model, rg};
    auto compute = [&](process_group& pg, int slot, std::int64_t) { (void)d.step(pg, data.of(slot)); };
    auto apply = [&] { opt.step(); };
    rg.step(compute, apply);
    g.barrier().wait();
    const auto t0 = std::chrono::steady_clock::now();
    for (std::size_t s = 0; s < steps; ++s) rg.step(compute, apply);
    g.barrier().wait();
    secs[r] = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / static_cast<double>(steps);
    rg.finish();
  }, o);
  return secs[0];
}

// The heal of a ViT replica (the example's ViT; its parameters and AdamW's two moments): 2 slots
// and a spare as threads, slot 1's thread ends before step 2 and the spare heals from slot 0.
struct heal_figure {
  double seconds = -1;
  std::int64_t bytes = 0;
};
heal_figure vit_heal() {
  struct gone {};
  tcp_store_server server;
  lighthouse lh(std::make_shared<tcp_store>(client(server.port())),
                {.replicas = 3, .policy = {.slots = 2}, .heartbeat_timeout = 1000ms});
  local_group_registry registry({.timeout = 30s});
  const rows data(2);
  heal_figure out;
  std::mutex mutex;
  {
    std::vector<std::jthread> threads;
    for (int r = 0; r < 3; ++r) {
      threads.emplace_back([&, r] {
        using vit = sequential<models::layers::host_model, models::layers::softmax_cross_entropy>;
        vit model(models::layers::make_vit({}, 1), models::layers::softmax_cross_entropy{});
        adamw opt(model, {.lr = 1e-3});
        try {
          replica_group rg(std::make_shared<tcp_store>(client(server.port())),
                           [&](std::int64_t id, int rank, int size) { return registry.make(id, rank, size); },
                           replica_state_of(model, opt), {.replica = r});
          ddp_in_quorum<vit> d{model, rg};
          while (rg.current_step() < 4) {
            const bool more = rg.step(
                [&](process_group& pg, int slot, std::int64_t step) {
                  if (r == 1 && step == 2) throw gone{};
                  (void)d.step(pg, data.of(slot));
                },
                [&] { opt.step(); });
            if (!more) break;
          }
          rg.finish();
          for (const auto& e : rg.events()) {
            if (e.what != replica_event::kind::healed) continue;
            std::lock_guard lock(mutex);
            out = {e.seconds, e.bytes};
          }
        } catch (const gone&) {
        } catch (const std::exception& e) {
          std::fprintf(stderr, "vit heal, replica %d: %s\n", r, e.what());
        }
      });
    }
  }
  return out;
}

// What one killed run measured, in shared memory the processes write.
struct recovery_record {
  double killed_at = 0;      // steady_clock seconds when the victim killed itself
  double committed_at = 0;   // ... when slot 0 next committed a step
  double heal_seconds = 0;   // the spare's transfer
  std::int64_t heal_bytes = 0;
  std::int64_t kill_step = 0;
  std::int64_t resumed_step = 0;  // the step slot 0 committed after the failure
  int ok = 0;
};

double now_s() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

recovery_record recovery_run(std::int64_t kill_step, std::int64_t steps) {
  auto* rec = static_cast<recovery_record*>(
      ::mmap(nullptr, sizeof(recovery_record), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0));
  if (rec == MAP_FAILED) throw std::runtime_error("mmap failed");
  *rec = {};
  rec->kill_step = kill_step;
  const rows data(2);
  std::vector<pid_t> pids;
  {
    tcp_store_server server;
    const auto port = server.port();
    std::fflush(nullptr);
    for (int r = 0; r < 3; ++r) {
      const pid_t pid = ::fork();
      if (pid < 0) throw std::runtime_error("fork failed");
      if (pid > 0) {
        pids.push_back(pid);
        continue;
      }
      int code = 0;
      try {
        auto control = std::make_shared<tcp_store>(client(port));
        auto rdzv = std::make_shared<tcp_store>(client(port));
        mlp model({}, 1);
        sgd opt(model, {.lr = 0.01, .momentum = 0.9});
        replica_group rg(control, gloo_groups_by_id(rdzv, {.timeout = 5s}), replica_state_of(model, opt), {.replica = r});
        ddp_in_quorum<mlp> d{model, rg};
        while (rg.current_step() < steps) {
          const int failures = rg.failures();
          const bool more = rg.step(
              [&](process_group& pg, int slot, std::int64_t step) {
                if (r == 1 && step == kill_step) {
                  rec->killed_at = now_s();
                  ::raise(SIGKILL);
                }
                (void)d.step(pg, data.of(slot));
              },
              [&] { opt.step(); });
          if (!more) break;
          if (r == 0 && failures == 0 && rg.failures() == 1) {
            rec->committed_at = now_s();
            rec->resumed_step = rg.current_step() - 1;
          }
        }
        for (const auto& e : rg.events()) {
          if (e.what == replica_event::kind::healed) {
            rec->heal_seconds = e.seconds;
            rec->heal_bytes = e.bytes;
          }
        }
        rg.finish();
      } catch (const std::exception& e) {
        std::fprintf(stderr, "replica %d: %s\n", r, e.what());
        code = 1;
      }
      std::fflush(nullptr);
      ::_exit(code);
    }
    auto s = std::make_shared<tcp_store>(client(port));
    lighthouse lh(s, {.replicas = 3, .policy = {.slots = 2}});
    int failed = 0;
    for (std::size_t i = 0; i < pids.size(); ++i) {
      int st = 0;
      ::waitpid(pids[i], &st, 0);
      const bool ok = WIFEXITED(st) && WEXITSTATUS(st) == 0;
      if (i != 1 && !ok) ++failed;
    }
    rec->ok = failed == 0 ? 1 : 0;
  }
  const recovery_record out = *rec;
  ::munmap(rec, sizeof(recovery_record));
  return out;
}

#if defined(PARTRAIN_BENCH_PARTRUN) && defined(PARTRAIN_BENCH_FASHION_MNIST)
// Seconds of one partrun job of the example (its output dropped); -1 when it failed.
double timed_job(const std::vector<std::string>& env_extra, const std::string& checkpoint_dir, int epochs) {
  std::vector<std::string> env;
  for (char** e = environ; *e; ++e) env.emplace_back(*e);
  env.insert(env.end(), env_extra.begin(), env_extra.end());
  std::filesystem::remove_all(checkpoint_dir);
  std::vector<child_process> job;
  const auto t0 = std::chrono::steady_clock::now();
  job.push_back(child_process::exec(PARTRAIN_BENCH_PARTRUN,
                                    {"--standalone", "--nproc-per-node", "2", "--max-restarts", "1", PARTRAIN_BENCH_FASHION_MNIST,
                                     "--limit-train", "6400", "--limit-test", "500", "--epochs", std::to_string(epochs),
                                     "--checkpoint", checkpoint_dir, "--log-every", "0"},
                                    env, {.capture_output = true, .on_line = [](std::string_view) {}}));
  const auto out = supervise(job, {.timeout = std::chrono::minutes(5)});
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::filesystem::remove_all(checkpoint_dir);
  return out.ok() ? s : -1;
}
#endif

}  // namespace

int main(int argc, char** argv) {
  std::size_t steps = 200, windows = 5, kills = 3;
  for (int i = 1; i < argc; ++i) {
    const std::string_view a = argv[i];
    if (a == "--quick") {
      steps = 5;
      windows = 1;
      kills = 1;
    } else if ((a == "--steps" || a == "--windows" || a == "--kills") && i + 1 < argc) {
      (a == "--steps" ? steps : a == "--windows" ? windows : kills) = std::max<std::size_t>(1, std::strtoull(argv[++i], nullptr, 10));
    } else {
      std::fprintf(stderr, "bench_fault_tolerance: unknown argument %s (expected --quick, --steps N, --windows N, --kills N)\n", argv[i]);
      return 2;
    }
  }
  const rows data(2);
  std::vector<double> plain, ft, trained;
  for (std::size_t w = 0; w < windows; ++w) {  // alternated
    plain.push_back(window(loop::plain, steps, data));
    ft.push_back(window(loop::in_group, steps, data));
    trained.push_back(window(loop::trainer, steps, data));
  }
  const double overhead = median(ft) / median(plain) - 1.0;
  const double trainer_overhead = median(trained) / median(plain) - 1.0;
  std::printf("fault-free step, 2 ranks (threads, inline collectives), %zu rows per rank, DDP + SGD; medians of %zu alternated windows of %zu steps\n\n",
              per_rank, windows, steps);
  std::printf("%-28s %12s\n", "loop", "ms/step");
  std::printf("%-28s %12.4f\n", "plain DDP", median(plain) * 1e3);
  std::printf("%-28s %12.4f\n", "DDP in replica_group", median(ft) * 1e3);
  std::printf("%-28s %12.4f\n", "replica_trainer", median(trained) * 1e3);
  std::printf("%-28s %12.4f\n", "overhead (fraction)", overhead);
  std::printf("%-28s %12.4f\n\n", "trainer's (fraction)", trainer_overhead);

  std::printf("recovery: 2 slots + 1 spare (gloo processes), slot 1 SIGKILLed; heartbeat 100 ms, timeout 1000 ms\n\n");
  std::printf("%-5s %10s %12s %12s %12s %14s\n", "run", "kill step", "recovery s", "heal s", "heal bytes", "steps redone");
  std::vector<double> recoveries;
  for (std::size_t k = 0; k < kills; ++k) {
    const std::int64_t kill_step = 10 + static_cast<std::int64_t>(k) * 7;
    const auto r = recovery_run(kill_step, kill_step + 10);
    if (!r.ok || r.committed_at <= 0 || r.killed_at <= 0) {
      std::fprintf(stderr, "bench_fault_tolerance: recovery run %zu did not recover\n", k);
      return 1;
    }
    const double rec_s = r.committed_at - r.killed_at;
    recoveries.push_back(rec_s);
    std::printf("%-5zu %10lld %12.3f %12.4f %12lld %14lld\n", k, static_cast<long long>(r.kill_step), rec_s, r.heal_seconds,
                static_cast<long long>(r.heal_bytes), static_cast<long long>(r.resumed_step - r.kill_step + 1));
  }
  double restart_s = -1;
#if defined(PARTRAIN_BENCH_PARTRUN) && defined(PARTRAIN_BENCH_FASHION_MNIST)
  // 6400 images, 2 ranks of 64: an epoch is 50 steps; the kill at step 90 loses 40 steps of work
  // (the checkpoint is at the epoch's end), then every rank's process starts again and resumes.
  const std::string dir = (std::filesystem::temp_directory_path() / ("bench_ft_ckpt_" + std::to_string(::getpid()))).string();
  std::vector<double> clean_s, killed_s;
  for (std::size_t k = 0; k < (kills > 1 ? 2u : 1u); ++k) {
    clean_s.push_back(timed_job({}, dir, 2));
    killed_s.push_back(timed_job({"PARTRAIN_EXAMPLE_KILL_AT_STEP=90"}, dir, 2));
  }
  if (median(clean_s) > 0 && median(killed_s) > 0) restart_s = median(killed_s) - median(clean_s);
  std::printf("\nrestart instead: the example, 2 gloo ranks, partrun --max-restarts 1, checkpoint each 50-step epoch, rank 1 killed at step 90\n\n");
  std::printf("%-24s %10s\n", "run", "seconds");
  std::printf("%-24s %10.3f\n", "without the kill", median(clean_s));
  std::printf("%-24s %10.3f\n", "killed, restarted", median(killed_s));
  std::printf("%-24s %10.3f   (40 steps redone, every process started again)\n", "cost of the failure", restart_s);
#else
  std::printf("\nrestart comparison left out: built without partrun or the Fashion-MNIST example\n");
#endif
  const auto vit = vit_heal();
  std::printf("\nheal of the example's ViT (parameters and AdamW state as checkpoint bytes), 2 slots + 1 spare as threads\n\n");
  std::printf("%-24s %10s %12s\n", "model", "heal s", "heal bytes");
  std::printf("%-24s %10.4f %12lld\n", "ViT dim 64, 4 blocks", vit.seconds, static_cast<long long>(vit.bytes));
  std::printf("summary: quorum_overhead=%.4f trainer_overhead=%.4f recovery_s=%.3f restart_s=%.3f vit_heal_s=%.4f\n",
              overhead, trainer_overhead, median(recoveries), restart_s, vit.seconds);
  return 0;
}
