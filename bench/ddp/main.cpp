// bench_ddp: what distributed_data_parallel costs and gains on the example's host MLP
// (784-256-128-10, OpenBLAS with one thread per rank), in samples/s over the same batches:
//   0. the GEMM-bound limit: the step's eight GEMMs alone (same shapes, one thread); in the
//      paired rounds also with the optimizer's pass over the weights each step (the floor of a
//      step whose optimizer runs as a pass of its own)
//   1. a plain loop without partrain's policy: model.train_step + sgd.step
//   2. DDP at world size 1 (local backend): the policy's own overhead
//   3. DDP at 2 ranks over each backend built in: gloo (two forked processes), mpi (two processes
//      under mpirun, shared memory), local (two threads of one process) and local_inline (the
//      same with collectives on the ranks' own threads and each rank pinned to a core, as the
//      main job runs); overlap on and off; and ZeRO-2 on local_inline (zero2_inline), whose step
//      runs over shared memory (each rank averages, steps and hands out its half in one meeting)
//   4. the gloo run with the timeline on (trace spans for every step and bucket all_reduce)
// then where a step's time goes (compute, optimizer, waiting for communication, the rest), how
// much communication overlap hid, and what tracing costs; last, paired rounds (the GEMMs on one
// and on two threads, one rank, two ranks per backend, back to back) for the scaling at 2 ranks
// and the share of the GEMM-bound limit.
//   bench_ddp [--quick] [--batch-size N] [--steps N]
//   (bench_ddp --mpi-rank FILE [--mpi-once] ... is what it runs under mpirun for the mpi rows)
#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <latch>
#include <string>
#include <string_view>
#include <thread>
#include <unistd.h>
#include <utility>
#include <vector>

#if defined(PARTRAIN_WITH_CUDA)
#include <cuda_runtime.h>
#endif

#include <cblas.h>

#include <partrain/comm/local.hpp>
#include <partrain/data/batch.hpp>
#include <partrain/data/fashion_mnist.hpp>
#include <partrain/launch/spawn.hpp>
#include <partrain/optim/sgd.hpp>
#include <partrain/parallel/ddp.hpp>
#include <partrain/parallel/zero.hpp>
#include <partrain/rendezvous/init.hpp>
#include <partrain/train/trace.hpp>

#include "fashion_batches.hpp"
#include "median.hpp"
#include "mlp_host.hpp"

namespace {

using namespace partrain;
using clock_type = std::chrono::steady_clock;

struct config {
  std::size_t batch = 64;
  std::size_t steps = 300;
  std::size_t warmup = 20;
  int repeats = 3;
  bool quick = false;
};

using partrain::bench::dataset_batches;

double seconds_since(clock_type::time_point t0) {
  return std::chrono::duration<double>(clock_type::now() - t0).count();
}

using ::partrain::bench::median;

// f(0) and f(1) on two threads started together; their two results.
template <class F>
std::array<double, 2> on_two_threads(F f) {
  std::array<double, 2> out{};
  std::latch start(2);
  {
    std::jthread other([&] {
      start.arrive_and_wait();
      out[1] = f(1);
    });
    start.arrive_and_wait();
    out[0] = f(0);
  }
  return out;
}

// The loop without partrain's policy: model.train_step + sgd.step. `between` (if set) runs after
// each backward, before the step: the ladder below puts a barrier or an all_reduce there.
double plain_loop(const std::vector<batch>& batches, const config& c, const std::function<void(models::mlp_host&)>& between = {}) {
  models::mlp_host model({}, 0);
  sgd opt(model, {.lr = 0.05, .momentum = 0.9});
  auto one = [&](const batch& b) {
    (void)model.train_step(b);
    if (between) between(model);
    opt.step();
  };
  for (std::size_t i = 0; i < c.warmup; ++i) one(batches[i]);
  const auto t0 = clock_type::now();
  for (std::size_t i = 0; i < c.steps; ++i) one(batches[c.warmup + i]);
  return static_cast<double>(c.steps * c.batch) / seconds_since(t0);
}

// Two local ranks running the plain loop with one thing of DDP's added per step: a barrier (the
// ranks meet), or the average of all gradients as DDP takes it (all_reduce_divided of one flat
// buffer in this model; it meets too). `opts`: the local_inline row's (collectives on the ranks'
// own threads, pinned), so the rungs take that row apart. Samples/s of both ranks together (rank
// 0's clock, the slower rank decides).
double ladder_sps(const std::vector<batch>& a, const std::vector<batch>& b, const config& c, bool all_reduce,
                  const process_group_options& opts) {
  double sps = 0;
  run_local(2, [&](local_group& g) {
    auto meet = [&](models::mlp_host& m) {
      if (!all_reduce) {
        g.barrier().wait();
        return;
      }
      g.all_reduce_divided(m.flat_grads(), 2.0).wait();
    };
    const double mine = plain_loop(g.rank() == 0 ? a : b, c, meet);
    if (g.rank() == 0) sps = 2 * mine;
  }, opts);
  return sps;
}

struct ddp_result {
  double samples_per_s = 0;
  double comm_ms = 0;  // per step: first bucket launch to last completion
  double wait_ms = 0;  // per step: what train_step waited for after the model's step
  double hidden = 0;   // fraction of communication time hidden by overlap
  double step_ms = 0;  // per step, wall
  double train_step_ms = 0;  // per step: ddp.train_step (forward, backward, launches, the wait)
  double opt_ms = 0;         // per step: the optimizer

  void write(std::ostream& out) const {
    out << samples_per_s << ' ' << comm_ms << ' ' << wait_ms << ' ' << hidden << ' ' << step_ms << ' ' << train_step_ms
        << ' ' << opt_ms << '\n';
  }
  bool read(std::istream& in) {
    return static_cast<bool>(in >> samples_per_s >> comm_ms >> wait_ms >> hidden >> step_ms >> train_step_ms >> opt_ms);
  }
};

template <class Group>
ddp_result ddp_loop(Group& pg, const std::vector<batch>& batches, const config& c, bool overlap,
                    trace_recorder* trace = nullptr) {
  models::mlp_host model({}, 0);
  ddp_options o{.overlap = overlap};
  if (trace) o.on_bucket_launch = trace->bucket_spans();  // what the example does with --trace
  distributed_data_parallel ddp(model, pg, o);
  sgd opt(model, {.lr = 0.05, .momentum = 0.9});
  trace_recorder off;
  trace_recorder& rec = trace ? *trace : off;
  double train_s = 0, opt_s = 0;
  auto one_step = [&](const batch& b, std::size_t i) {
    auto step = rec.span("step", trace_track::step, "step", static_cast<std::int64_t>(i));
    auto fb = rec.span("forward_backward");
    const auto t0 = clock_type::now();
    (void)ddp.train_step(b);
    const auto t1 = clock_type::now();
    fb.end();
    auto os = rec.span("optimizer");
    opt.step();
    train_s += std::chrono::duration<double>(t1 - t0).count();
    opt_s += seconds_since(t1);
  };
  for (std::size_t i = 0; i < c.warmup; ++i) one_step(batches[i], i);
  pg.barrier().wait();
  ddp.stats().reset_timing();
  train_s = opt_s = 0;
  const auto t0 = clock_type::now();
  for (std::size_t i = 0; i < c.steps; ++i) one_step(batches[c.warmup + i], c.warmup + i);
  pg.barrier().wait();  // the slowest rank decides the rate
  const double s = seconds_since(t0);
  const auto& st = ddp.stats();
  const double steps = static_cast<double>(std::max<std::size_t>(st.synced_steps, 1));
  const double n = static_cast<double>(c.steps);
  return {static_cast<double>(c.steps * c.batch * static_cast<std::size_t>(pg.size())) / s,
          1e3 * st.comm_s / steps,
          1e3 * st.wait_s / steps,
          st.hidden_fraction(),
          1e3 * s / n,
          1e3 * train_s / n,
          1e3 * opt_s / n};
}

// ZeRO-2 on the same model and optimizer (on threads: the shared-memory step, which averages,
// steps and hands out each rank's half in one meeting). Its train_step holds the whole step; the
// meeting (what it reports as exposed reduction: the average, the update and the hand-out, and
// any wait for the other rank) is counted as the optimizer's, the rest as forward and backward.
ddp_result zero_loop(process_group& pg, const std::vector<batch>& batches, const config& c) {
  models::mlp_host model({}, 0);
  sharded_data_parallel zero(model, pg, sgd_options{.lr = 0.05, .momentum = 0.9}, {.stage = 2});
  for (std::size_t i = 0; i < c.warmup; ++i) (void)zero.train_step(batches[i]);
  pg.barrier().wait();
  const double exposed0 = zero.exposed_reduce_seconds();
  const auto t0 = clock_type::now();
  for (std::size_t i = 0; i < c.steps; ++i) (void)zero.train_step(batches[c.warmup + i]);
  pg.barrier().wait();
  const double s = seconds_since(t0);
  const double n = static_cast<double>(c.steps);
  ddp_result r;
  r.samples_per_s = static_cast<double>(c.steps * c.batch * static_cast<std::size_t>(pg.size())) / s;
  r.opt_ms = r.comm_ms = 1e3 * (zero.exposed_reduce_seconds() - exposed0) / n;
  r.step_ms = 1e3 * s / n;
  r.train_step_ms = r.step_ms - r.opt_ms;
  return r;
}

// The GEMM-bound limit of one step: the eight sgemm calls the MLP makes for a batch (forward:
// three; backward: three weight gradients and the two input gradients below the top), same
// shapes, one OpenBLAS thread. Returns milliseconds per step (median of rounds). With sgd, each
// step also runs the example's optimizer (SGD, momentum 0.9) over the weights and the gradients
// the GEMMs wrote (233k of the MLP's 235k parameters; lr 0, so the values stay put while every
// buffer is read and written as in training): the floor a step with an optimizer pass of its own
// can reach, whatever its other passes cost.
double gemm_ms_per_step(std::size_t batch, const config& c, int rounds = 3, bool sgd = false) {
  const int n = static_cast<int>(batch);
  const int w[] = {784, 256, 128, 10};
  std::vector<std::vector<float>> act(4), wt(3), gw(3), delta(4);
  for (int l = 0; l < 4; ++l) {
    act[static_cast<std::size_t>(l)].assign(batch * static_cast<std::size_t>(w[l]), 0.5f);
    delta[static_cast<std::size_t>(l)].assign(batch * static_cast<std::size_t>(w[l]), 0.25f);
  }
  for (int l = 0; l < 3; ++l) {
    wt[static_cast<std::size_t>(l)].assign(static_cast<std::size_t>(w[l] * w[l + 1]), 0.01f);
    gw[static_cast<std::size_t>(l)].assign(static_cast<std::size_t>(w[l] * w[l + 1]), 0.0f);
  }
  std::vector<std::vector<float>> momentum(3);
  for (int l = 0; l < 3; ++l) momentum[static_cast<std::size_t>(l)].assign(wt[static_cast<std::size_t>(l)].size(), 0.0f);
  const auto coeffs = detail::optim::sgd_coeffs_of<float>({.lr = 0, .momentum = 0.9});
  auto step = [&] {
    for (int l = 0; l < 3; ++l) {  // out[n, w1] = in[n, w0] . W[w1, w0]^T
      const auto L = static_cast<std::size_t>(l);
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, w[l + 1], w[l], 1.0f, act[L].data(), w[l], wt[L].data(),
                  w[l], 1.0f, act[L + 1].data(), w[l + 1]);
    }
    for (int l = 2; l >= 0; --l) {
      const auto L = static_cast<std::size_t>(l);
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, w[l + 1], w[l], n, 1.0f, delta[L + 1].data(), w[l + 1],
                  act[L].data(), w[l], 0.0f, gw[L].data(), w[l]);
      if (l > 0) {
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, w[l], w[l + 1], 1.0f, delta[L + 1].data(), w[l + 1],
                    wt[L].data(), w[l], 0.0f, delta[L].data(), w[l]);
      }
    }
    if (!sgd) return;
    for (std::size_t l = 0; l < 3; ++l) {
      detail::optim::sgd_update(tensor_view<float>(wt[l].data(), {wt[l].size()}),
                                tensor_view<const float>(gw[l].data(), {gw[l].size()}), momentum[l].data(), coeffs, false);
    }
  };
  openblas_set_num_threads(1);
  for (std::size_t i = 0; i < c.warmup; ++i) step();
  std::vector<double> ms;
  for (int r = 0; r < rounds; ++r) {
    const auto t0 = clock_type::now();
    for (std::size_t i = 0; i < c.steps; ++i) step();
    ms.push_back(1e3 * seconds_since(t0) / static_cast<double>(c.steps));
  }
  return median(std::move(ms));
}

// The same GEMMs on two threads at once, each with its own buffers: what the two cores give when
// both run GEMMs (shared caches, memory and clocks), the most two ranks here can reach. Returns
// the samples/s of both together.
double gemm_two_threads_sps(std::size_t batch, const config& c, int rounds = 3) {
  const auto ms = on_two_threads([&](int) { return gemm_ms_per_step(batch, c, rounds); });
  return 1e3 * static_cast<double>(batch) / ms[0] + 1e3 * static_cast<double>(batch) / ms[1];
}

// The plain loop on two threads at once, each its own model and batches, nothing shared and no
// communication: the most two ranks of this model can reach here. Samples/s of both together.
double plain_two_threads_sps(const std::vector<batch>& a, const std::vector<batch>& b, const config& c) {
  const auto sps = on_two_threads([&](int t) { return plain_loop(t == 0 ? a : b, c); });
  return sps[0] + sps[1];
}

// DDP's own cost: a model that computes nothing, with the MLP's parameter sizes and its gradients
// back to back (as mlp_host keeps them), on 2 local ranks, overlap off. Per step: what
// train_step costs (the bucket work, the all_reduce, the ranks meeting), and the local backend's
// all_reduce of the same gradients alone. Microseconds, median of rounds.
struct idle_model {
  struct param {
    float* v;
    float* g;
    std::size_t n;
    [[nodiscard]] tensor_view<float> value() const { return {v, n}; }
    [[nodiscard]] tensor_view<float> grad() const { return {g, n}; }
  };
  std::vector<float> values, grads;
  std::vector<param> ps;
  idle_model() {
    const std::size_t sizes[] = {784 * 256, 256, 256 * 128, 128, 128 * 10, 10};
    std::size_t total = 0;
    for (auto n : sizes) total += n;
    values.assign(total, 1.0f);
    grads.assign(total, 0.5f);
    std::size_t off = 0;
    for (auto n : sizes) {
      ps.push_back({values.data() + off, grads.data() + off, n});
      off += n;
    }
  }
  [[nodiscard]] std::vector<param>& parameters() noexcept { return ps; }
  double train_step(const int&) { return 0; }
  [[nodiscard]] eval_result eval_step(const int&) { return {}; }
};

std::pair<double, double> ddp_cost_us(const config& c, process_group_options opts = {}) {
  const int steps = c.quick ? 200 : 1000;
  std::vector<double> ddp_us, ar_us;
  for (int r = 0; r < (c.quick ? 1 : 7); ++r) {
    run_local(2, [&](local_group& g) {
      idle_model m;
      distributed_data_parallel ddp(m, g, {.overlap = false});
      auto timed = [&](auto&& f) {
        for (int i = 0; i < steps / 10; ++i) f();
        g.barrier().wait();
        const auto t0 = clock_type::now();
        for (int i = 0; i < steps; ++i) f();
        g.barrier().wait();
        return 1e6 * seconds_since(t0) / steps;
      };
      const double d = timed([&] { (void)ddp.train_step(0); });
      const double a = timed([&] {
        g.all_reduce(tensor_view<float>(m.grads.data(), m.grads.size()), reduce_op::sum).wait();
      });
      if (g.rank() == 0) {
        ddp_us.push_back(d);
        ar_us.push_back(a);
      }
    }, opts);
  }
  return {median(std::move(ddp_us)), median(std::move(ar_us))};
}

// Every rank of a 2-rank job, whatever its backend: overlap on (median of the repeats; traced
// runs interleaved when asked), then off. Rank 0 writes on, off and traced to result_file.
// `once`: one run with overlap on, nothing else (a paired round's).
void measure_two_ranks(process_group& pg, const in_memory_dataset& train, const config& c, bool with_trace,
                       const std::filesystem::path& result_file, const std::filesystem::path& trace_file,
                       bool once = false, bool sharded = false) {
  const std::size_t need = c.warmup + c.steps;
  // Rank r starts r * need batches in, so the ranks train on different rows.
  const auto mine = dataset_batches(train, c.batch, need, static_cast<std::size_t>(pg.rank()) * need);
  if (once) with_trace = false;
  std::vector<ddp_result> ons, traceds;
  for (int r = 0; r < (once ? 1 : c.repeats); ++r) {
    ons.push_back(sharded ? zero_loop(pg, mine, c) : ddp_loop(pg, mine, c, true));
    if (with_trace) {
      trace_recorder rec(trace_file);
      rec.start(pg);
      traceds.push_back(ddp_loop(pg, mine, c, true, &rec));
      (void)rec.finish(pg);  // the merge is not timed
    }
  }
  auto by_rate = [](const ddp_result& a, const ddp_result& b) { return a.samples_per_s < b.samples_per_s; };
  std::sort(ons.begin(), ons.end(), by_rate);
  std::sort(traceds.begin(), traceds.end(), by_rate);
  const ddp_result on = ons[ons.size() / 2];
  const ddp_result traced = with_trace ? traceds[traceds.size() / 2] : ddp_result{};
  const ddp_result off = once || sharded ? ddp_result{} : ddp_loop(pg, mine, c, false);
  if (pg.rank() == 0) {
    const auto tmp = result_file.string() + ".tmp";
    {
      std::ofstream out(tmp);
      on.write(out);
      off.write(out);
      traced.write(out);
    }
    std::filesystem::rename(tmp, result_file);
  }
}

struct two_rank_results {
  ddp_result on, off, traced;
};

two_rank_results read_results(const std::filesystem::path& result_file, const char* backend) {
  two_rank_results r;
  std::ifstream in(result_file);
  if (!r.on.read(in) || !r.off.read(in) || !r.traced.read(in)) {
    throw error(error_kind::internal, std::string("bench_ddp: the ") + backend + " job's rank 0 left no readable results in " +
                                          result_file.string());
  }
  in.close();
  std::filesystem::remove(result_file);
  return r;
}

void row(const char* mode, int ranks, const config& c, double sps, const ddp_result* d) {
  if (d) {
    std::printf("%-37s %5d %10zu %7zu %11.0f %13.3f %13.3f %8.2f\n", mode, ranks, c.batch, c.steps, sps, d->comm_ms,
                d->wait_ms, d->hidden);
  } else {
    std::printf("%-37s %5d %10zu %7zu %11.0f %13s %13s %8s\n", mode, ranks, c.batch, c.steps, sps, "-", "-", "-");
  }
}

bool gpu_present() {
#if defined(PARTRAIN_WITH_CUDA)
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
#else
  return false;
#endif
}

}  // namespace

int main(int argc, char** argv) {
  config c;
  const char* mpi_result = nullptr;  // --mpi-rank FILE: one rank of the mpi rows, under mpirun
  bool mpi_once = false;             // --mpi-once: that job is a paired round's single run
  std::string forwarded;             // the options, for the mpirun command line
  for (int i = 1; i < argc; ++i) {
    const std::string_view a = argv[i];
    auto next = [&]() -> std::size_t {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "bench_ddp: %s needs a value\n", argv[i]);
        std::exit(2);
      }
      const long v = std::atol(argv[++i]);
      if (v <= 0) {
        std::fprintf(stderr, "bench_ddp: %s must be a positive integer, got '%s'\n", argv[i - 1], argv[i]);
        std::exit(2);
      }
      return static_cast<std::size_t>(v);
    };
    if (a == "--quick") {
      c.steps = 60;
      c.warmup = 5;
      c.repeats = 1;
      c.quick = true;
      forwarded += " --quick";
    } else if (a == "--batch-size") {
      c.batch = next();
      forwarded += " --batch-size " + std::to_string(c.batch);
    } else if (a == "--steps") {
      c.steps = next();
      forwarded += " --steps " + std::to_string(c.steps);
    } else if (a == "--mpi-rank" && i + 1 < argc) {
      mpi_result = argv[++i];
    } else if (a == "--mpi-once") {
      mpi_once = true;
    } else {
      std::fprintf(stderr, "bench_ddp: unknown option '%s' (expected --quick, --batch-size N, --steps N)\n", argv[i]);
      return 2;
    }
  }
  try {
    const in_memory_dataset train = partrain::bench::load_fashion_train();
    const std::size_t need = c.warmup + c.steps;
    const auto tmp = std::filesystem::temp_directory_path();
    const std::string tag = "bench_ddp_" + std::to_string(::getpid());

    if (mpi_result) {
#if defined(PARTRAIN_WITH_MPI)
      auto pg = init_process_group("mpi://");
      measure_two_ranks(*pg, train, c, false, mpi_result, {}, mpi_once);
      return 0;
#else
      std::fprintf(stderr, "bench_ddp: --mpi-rank needs a build with MPI\n");
      return 2;
#endif
    }

    std::printf("bench_ddp: MLP 784-256-128-10 on Fashion-MNIST, OpenBLAS 1 thread per rank, %u cores\n",
                std::max(1u, static_cast<unsigned>(sysconf(_SC_NPROCESSORS_ONLN))));

    // 0: the GEMMs alone.
    const double gemm_ms = gemm_ms_per_step(c.batch, c);
    const double gemm_sps = 1e3 * static_cast<double>(c.batch) / gemm_ms;
    std::printf("GEMM-bound limit: the step's 8 GEMMs take %.3f ms at batch %zu (one thread): %.0f samples/s per core, "
                "%.0f on 2 cores\n\n",
                gemm_ms, c.batch, gemm_sps, 2 * gemm_sps);

    std::printf("%-37s %5s %10s %7s %11s %13s %13s %8s\n", "mode", "ranks", "batch/rank", "steps", "samples/s",
                "comm ms/step", "wait ms/step", "hidden");

    // 1 and 2, interleaved so that drift in the machine's load hits both alike.
    const auto batches0 = dataset_batches(train, c.batch, need, 0);
    std::vector<double> plain, ddp1;
    ddp_result d1;
    auto world1 = make_local_world(1);
    for (int r = 0; r < c.repeats; ++r) {
      plain.push_back(plain_loop(batches0, c));
      d1 = ddp_loop(*world1[0], batches0, c, true);
      ddp1.push_back(d1.samples_per_s);
    }
    const double plain_sps = median(plain), ddp1_sps = median(ddp1);
    row("plain loop (no policy)", 1, c, plain_sps, nullptr);
    d1.samples_per_s = ddp1_sps;
    row("DDP world 1 (local)", 1, c, ddp1_sps, &d1);
    std::fflush(stdout);

    // The local backend as the main job runs it: collectives on the ranks' own threads, each
    // rank pinned to a core (process_group_options::inline_collectives, pin_threads).
    process_group_options local_inline;
    local_inline.inline_collectives = true;
    local_inline.pin_threads = true;
    const auto [ddp_us, all_reduce_us] = ddp_cost_us(c);
    const auto [ddp_inline_us, all_reduce_inline_us] = ddp_cost_us(c, local_inline);
    std::printf("DDP's own cost on 2 local ranks (a model that computes nothing, the MLP's 235k gradients): %.1f us per "
                "step, of which the all_reduce alone %.1f us; inline and pinned %.1f us, all_reduce %.1f us\n",
                ddp_us, all_reduce_us, ddp_inline_us, all_reduce_inline_us);

    // 3: two ranks on each backend; rank 0 writes its figures for this process to print. `once`:
    // one run with overlap on (a paired round's), otherwise the repeats, overlap off and tracing.
    const std::filesystem::path trace_file = tmp / (tag + "_trace.json");
    auto run_backend = [&](const char* name, bool once) -> two_rank_results {
      const auto file = tmp / (tag + "_" + name + ".txt");
      if (std::string_view(name) == "gloo") {
        spawn(2, [&](int) {
          auto pg = init_process_group("env://", {.backend = "gloo"});
          measure_two_ranks(*pg, train, c, true, file, trace_file, once);
        });
        std::filesystem::remove(trace_file);
      } else if (std::string_view(name) == "mpi") {
#if defined(PARTRAIN_WITH_MPI)
        const std::string cmd = std::string(PARTRAIN_MPIEXEC) + " -np 2 " + argv[0] + forwarded + " --mpi-rank " +
                                file.string() + (once ? " --mpi-once" : "") + " 2>&1";
        if (std::system(cmd.c_str()) != 0) throw error(error_kind::internal, "bench_ddp: the mpi job failed: " + cmd);
#endif
      } else {
        const std::string_view n = name;
        run_local(2, [&](local_group& g) { measure_two_ranks(g, train, c, false, file, {}, once, n == "zero2_inline"); },
                  n == "local" ? process_group_options{} : local_inline);
      }
      return read_results(file, name);
    };
    struct backend_run {
      const char* name;
      two_rank_results r;
      std::vector<double> round_sps;  // the paired rounds' 2-rank samples/s
    };
    std::vector<backend_run> runs;
    runs.push_back({"gloo", {}, {}});
#if defined(PARTRAIN_WITH_MPI)
    runs.push_back({"mpi", {}, {}});
#endif
    runs.push_back({"local", {}, {}});
    runs.push_back({"local_inline", {}, {}});
    runs.push_back({"zero2_inline", {}, {}});  // ZeRO-2 on local_inline: the shared-memory step
    for (auto& b : runs) b.r = run_backend(b.name, false);
    for (auto& b : runs) {
      if (std::string_view(b.name) == "zero2_inline") {
        row("ZeRO-2 2 ranks local_inline (shared)", 2, c, b.r.on.samples_per_s, &b.r.on);
        continue;
      }
      const std::string on = std::string("DDP 2 ranks ") + b.name + ", overlap on";
      const std::string off = std::string("DDP 2 ranks ") + b.name + ", overlap off";
      row(on.c_str(), 2, c, b.r.on.samples_per_s, &b.r.on);
      row(off.c_str(), 2, c, b.r.off.samples_per_s, &b.r.off);
    }
    const auto& gloo = runs.front().r;
    row("DDP 2 ranks gloo, on, traced", 2, c, gloo.traced.samples_per_s, &gloo.traced);

    // Where a step's time goes (rank 0, overlap on): the model's forward and backward (train_step
    // less the wait for the last buckets), the optimizer, the wait, and the rest of the loop.
    std::printf("\nwhere a step's time goes (ms per step, rank 0, overlap on)\n%-26s %8s %9s %9s %9s %8s %9s\n", "run",
                "step", "compute", "optimizer", "comm wait", "other", "vs GEMMs");
    auto split = [&](const char* name, const ddp_result& d) {
      const double compute = d.train_step_ms - d.wait_ms;
      std::printf("%-26s %8.3f %9.3f %9.3f %9.3f %8.3f %9.2f\n", name, d.step_ms, compute, d.opt_ms, d.wait_ms,
                  d.step_ms - d.train_step_ms - d.opt_ms, d.step_ms / gemm_ms);
    };
    split("DDP world 1 (local)", d1);
    for (auto& b : runs) {
      const bool z = std::string_view(b.name) == "zero2_inline";
      split(z ? "ZeRO-2 2 ranks (shared)*" : (std::string("DDP 2 ranks ") + b.name).c_str(), b.r.on);
    }

    std::printf("* its optimizer column is the whole shared-memory step: the average, the update of its half, the "
                "hand-out and any wait for the other rank\n");
    // A second view of overlap that does not rely on DDP's own timers: the step time it saved,
    // against the communication time per step measured with overlap off.
    std::printf("\n");
    for (auto& b : runs) {
      if (std::string_view(b.name) == "zero2_inline") continue;  // one meeting after backward: nothing to overlap
      const double step_ms_on = 1e3 * 2.0 * static_cast<double>(c.batch) / b.r.on.samples_per_s;
      const double step_ms_off = 1e3 * 2.0 * static_cast<double>(c.batch) / b.r.off.samples_per_s;
      std::printf("overlap %-12s step %.3f ms (on) vs %.3f ms (off); saved %.3f ms of %.3f ms communication per step\n",
                  b.name, step_ms_on, step_ms_off, step_ms_off - step_ms_on, b.r.off.comm_ms);
    }
    if (gpu_present()) {
      std::printf("cuda: a GPU is present, but this bench has no CUDA rows yet (mlp_cuda is tested by test_mlp_cuda)\n");
    } else {
      std::printf("cuda rows: skipped: no GPU\n");
    }
    // Tracing's cost as a fraction of the untraced step time (step time = 1 / rate); noise on a
    // busy machine can make it slightly negative.
    const double trace_overhead = gloo.on.samples_per_s / gloo.traced.samples_per_s - 1.0;
    std::printf("tracing (gloo): overhead %.4f of the step\n", trace_overhead);
    // Paired rounds: the machine's speed drifts between runs (other tenants of its host: one
    // rank's rate moved 30% from one run of this program to the next), so each ratio comes from
    // runs made back to back, one thread's GEMMs, DDP at 1 rank, then 2 ranks on each backend,
    // and the keys are the medians of the rounds' ratios.
    const int rounds = c.quick ? 1 : 5;
    std::vector<double> g1s, gs1s, g2s, d1s, p2s, bar2s, ar2s;
    const auto batches1 = dataset_batches(train, c.batch, need, need);
    std::printf("\npaired rounds, samples/s (each: the GEMMs on 1 and on 2 threads, DDP at 1 rank, then 2 ranks on each "
                "backend, back to back; 'barrier' and 'all_reduce': the plain loop as 2 local ranks, inline and pinned as "
                "local_inline, that meet, or meet and average their gradients, each step; 'GEMMs+SGD': one thread's GEMMs and the "
                "optimizer's pass alone)\n%-6s %10s %10s %10s %10s %10s %10s %10s", "round", "GEMMs 1t", "GEMMs+SGD", "GEMMs 2t",
                "plain 2t", "barrier", "all_reduce", "DDP 1");
    for (auto& b : runs) std::printf(" %10s", b.name);
    std::printf("\n");
    for (int r = 0; r < rounds; ++r) {
      g1s.push_back(1e3 * static_cast<double>(c.batch) / gemm_ms_per_step(c.batch, c, 1));
      gs1s.push_back(1e3 * static_cast<double>(c.batch) / gemm_ms_per_step(c.batch, c, 1, true));
      g2s.push_back(gemm_two_threads_sps(c.batch, c, 1));
      p2s.push_back(plain_two_threads_sps(batches0, batches1, c));
      bar2s.push_back(ladder_sps(batches0, batches1, c, false, local_inline));
      ar2s.push_back(ladder_sps(batches0, batches1, c, true, local_inline));
      d1s.push_back(ddp_loop(*world1[0], batches0, c, true).samples_per_s);
      std::printf("%-6d %10.0f %10.0f %10.0f %10.0f %10.0f %10.0f %10.0f", r, g1s.back(), gs1s.back(), g2s.back(),
                  p2s.back(), bar2s.back(), ar2s.back(), d1s.back());
      for (auto& b : runs) {
        b.round_sps.push_back(run_backend(b.name, true).on.samples_per_s);
        std::printf(" %10.0f", b.round_sps.back());
      }
      std::printf("\n");
      std::fflush(stdout);
    }
    // Per round: scaling_2 = 2-rank samples/s / (2 x one rank's), at the same per-rank batch; the
    // fastest backend against 2 x one thread's GEMMs and against the GEMMs on 2 threads at once.
    auto median_of = [&](auto ratio) {
      std::vector<double> v;
      for (std::size_t r = 0; r < d1s.size(); ++r) v.push_back(ratio(r));
      return median(v);
    };
    auto best_in = [&](std::size_t r) {
      double best = 0;
      for (auto& b : runs) best = std::max(best, b.round_sps[r]);
      return best;
    };
    std::string keys;
    std::string best_name;
    double best_scaling = 0;
    for (auto& b : runs) {
      const double scaling = median_of([&](std::size_t r) { return b.round_sps[r] / (2.0 * d1s[r]); });
      char buf[160];
      // Inline collectives finish inside the launch, so nothing is left to wait for: DDP's timers
      // would call all of it hidden, which is not overlap.
      if (std::string_view(b.name) == "local_inline" || std::string_view(b.name) == "zero2_inline") {
        std::snprintf(buf, sizeof buf, " scaling_2_%s=%.3f", b.name, scaling);
      } else {
        std::snprintf(buf, sizeof buf, " scaling_2_%s=%.3f overlap_hidden_%s=%.3f", b.name, scaling, b.name, b.r.on.hidden);
      }
      keys += buf;
      if (scaling > best_scaling) {
        best_scaling = scaling;
        best_name = b.name;
      }
    }
    const double best_vs_limit = median_of([&](std::size_t r) { return best_in(r) / (2 * g1s[r]); });
    const double best_vs_2t = median_of([&](std::size_t r) { return best_in(r) / g2s[r]; });
    const double two_threads = median_of([&](std::size_t r) { return g2s[r] / (2 * g1s[r]); });
    const double step_vs_gemm = median_of([&](std::size_t r) { return g1s[r] / d1s[r]; });
    const double sgd_floor = median_of([&](std::size_t r) { return g1s[r] / gs1s[r]; });
    const double plain_2t = median_of([&](std::size_t r) { return p2s[r] / (2.0 * d1s[r]); });
    const double barrier_2 = median_of([&](std::size_t r) { return bar2s[r] / (2.0 * d1s[r]); });
    const double all_reduce_2 = median_of([&](std::size_t r) { return ar2s[r] / (2.0 * d1s[r]); });
    std::printf("medians of the rounds: best scaling_2 %.3f (%s); the fastest 2-rank run at %.3f of the 2-core "
                "GEMM-bound limit (2 x one thread's GEMMs) and %.3f of the GEMMs on 2 threads at once, which run at "
                "%.3f of 2 x one thread's; the plain loop on 2 threads at once (no communication) at %.3f of 2 x DDP's "
                "one rank, with a barrier per step at %.3f, with the gradients' all_reduce at %.3f; one rank's step at %.3f of "
                "its GEMMs' time, of which the GEMMs and the optimizer's pass alone take %.3f\n",
                best_scaling, best_name.c_str(), best_vs_limit, best_vs_2t, two_threads, plain_2t, barrier_2, all_reduce_2,
                step_vs_gemm, sgd_floor);
    std::printf("summary: ddp1_vs_plain=%.3f scaling_2=%.3f overlap_hidden=%.3f trace_overhead=%.4f%s "
                "step_vs_gemm=%.3f gemm_sgd_vs_gemm=%.3f best_vs_gemm_limit=%.3f gemm_2threads_vs_limit=%.3f best_vs_gemm_2threads=%.3f "
                "plain_2threads_scaling=%.3f barrier_2ranks_scaling=%.3f allreduce_2ranks_scaling=%.3f ddp2_cost_us=%.1f "
                "allreduce_us=%.1f ddp2_inline_cost_us=%.1f\n",
                ddp1_sps / plain_sps, best_scaling, gloo.on.hidden, trace_overhead, keys.c_str(), step_vs_gemm, sgd_floor,
                best_vs_limit, two_threads, best_vs_2t, plain_2t, barrier_2, all_reduce_2, ddp_us, all_reduce_us,
                ddp_inline_us);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_ddp: %s\n", e.what());
    return 1;
  }
  return 0;
}
