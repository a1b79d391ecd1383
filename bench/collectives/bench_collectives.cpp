// bench_collectives: time, algbw and busbw (nccl-tests definitions) of all_reduce, all_gather,
// reduce_scatter and broadcast for the local backend (2 threads), the gloo backend (2 processes
// over loopback) next to the same calls made on Gloo directly, a single-thread memcpy of the same
// bytes, the mpi backend (2 processes under mpirun, shared memory) next to the same calls made on
// MPI directly, and NCCL over the visible GPUs when there are any. Wrapper and raw engine are timed
// call by call in pairs (31 to 301 per size; Gloo's raw calls on the wrapper's own context): each
// row reports the median call of each and the median pair's ratio, so that a slow moment (another
// process on the core) does not decide a ratio.
//
//   size S = bytes of the whole buffer (for all_gather/reduce_scatter: count per rank x ranks)
//   algbw = S / t;  busbw = algbw x {all_reduce 2(n-1)/n, all_gather/reduce_scatter (n-1)/n, broadcast 1}
//
// Usage: bench_collectives [--quick]   (--quick: two small sizes, one iteration; the smoke test)
//        (bench_collectives --mpi-rank [--quick] is what it runs under mpirun for the mpi rows)
#include <partrain/comm/local.hpp>

#if defined(PARTRAIN_WITH_GLOO)
#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/broadcast.h>
#include <gloo/math.h>
#include <gloo/reduce_scatter.h>

#include <partrain/comm/gloo.hpp>
#include <partrain/rendezvous/file_store.hpp>
#endif

#if defined(PARTRAIN_WITH_MPI)
#include <partrain/comm/mpi.hpp>
#endif

#if defined(PARTRAIN_WITH_NCCL)
#include <cuda_runtime.h>
#include <nccl.h>
#endif

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include <sys/wait.h>
#include <unistd.h>

using namespace partrain;
using clk = std::chrono::steady_clock;

namespace {

constexpr int world = 2;
constexpr double KiB = 1024.0, MiB = 1024.0 * 1024.0;

enum class op_kind { all_reduce, all_gather, reduce_scatter, broadcast };
constexpr op_kind all_ops[] = {op_kind::all_reduce, op_kind::all_gather, op_kind::reduce_scatter, op_kind::broadcast};

const char* name(op_kind k) {
  switch (k) {
    case op_kind::all_reduce: return "all_reduce";
    case op_kind::all_gather: return "all_gather";
    case op_kind::reduce_scatter: return "reduce_scatter";
    case op_kind::broadcast: return "broadcast";
  }
  return "?";
}

double bus_factor(op_kind k, int n) {
  switch (k) {
    case op_kind::all_reduce: return 2.0 * (n - 1) / n;
    case op_kind::all_gather: case op_kind::reduce_scatter: return static_cast<double>(n - 1) / n;
    case op_kind::broadcast: return 1.0;
  }
  return 1.0;
}

struct plan {
  std::vector<std::size_t> sizes;  // bytes S
  bool quick = false;
  // Fewer repetitions as buffers grow: about 64 MiB moved per size, at least one.
  [[nodiscard]] int iters(std::size_t bytes) const {
    if (quick) return 1;
    return static_cast<int>(std::clamp<std::size_t>((64u << 20) / bytes, 1, 20));
  }
  [[nodiscard]] bool warmup(std::size_t bytes) const { return !quick && bytes <= (16u << 20); }
};

std::string human(std::size_t bytes) {
  char b[32];
  if (bytes >= (1u << 20)) std::snprintf(b, sizeof b, "%g MiB", static_cast<double>(bytes) / MiB);
  else std::snprintf(b, sizeof b, "%g KiB", static_cast<double>(bytes) / KiB);
  return b;
}

// Seconds per call of f (all ranks call it the same number of times).
template <class F>
double time_calls(const plan& p, std::size_t bytes, F&& f) {
  if (p.warmup(bytes)) f();
  const int n = p.iters(bytes);
  const auto t0 = clk::now();
  for (int i = 0; i < n; ++i) f();
  return std::chrono::duration<double>(clk::now() - t0).count() / n;
}

// One row of a wrapper-against-raw table: seconds per call of our wrapper (a) and of the engine
// called directly (b), and each pair's b/a ratio (= wrapper/raw busbw).
struct row_samples {
  std::vector<double> ta, tb, ratio;
};

// Times `pairs` pairs of calls into `s`, every rank running the same calls, the order inside a
// pair alternating (a b, b a, ...) so neither side always goes first after the other. Loopback
// TCP on a small VM swings by 2-3x from one millisecond to the next, so rounds of several calls
// (7 rounds of 8 calls at 1 MiB, as before) gave wrapper/raw ratios from 0.3 to 1.3 between two
// runs of the same binaries; adjacent calls share their conditions, so each pair gives a ratio.
template <class A, class B>
void time_pairs(int pairs, row_samples& s, A&& a, B&& b) {
  const auto once = [](auto& f) {
    const auto t0 = clk::now();
    f();
    return std::chrono::duration<double>(clk::now() - t0).count();
  };
  for (int i = 0; i < pairs; ++i) {
    if (i % 2 == 0) {
      s.ta.push_back(once(a));
      s.tb.push_back(once(b));
    } else {
      s.tb.push_back(once(b));
      s.ta.push_back(once(a));
    }
    s.ratio.push_back(s.tb.back() / s.ta.back());
  }
}

double median_of(std::vector<double> v) {
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(v.size() / 2), v.end());
  return v[v.size() / 2];
}

double gbps(std::size_t bytes, double seconds) { return static_cast<double>(bytes) / seconds / 1e9; }

void print_header(const char* title) {
  std::printf("\n%s\n", title);
  std::printf("%-10s %-15s %10s %12s %10s %10s\n", "backend", "op", "size", "time_us", "algbw", "busbw");
}
void print_row(const char* backend, const char* op, std::size_t bytes, double t, double factor) {
  std::printf("%-10s %-15s %10s %12.1f %10.3f %10.3f\n", backend, op, human(bytes).c_str(), t * 1e6, gbps(bytes, t),
              gbps(bytes, t) * factor);
  std::fflush(stdout);
}

// Buffers for one op at total size S per rank, float elements, touched before timing.
struct buffers {
  std::vector<float> a, b;
  buffers(op_kind k, std::size_t bytes, int n, int rank) {
    const std::size_t total = bytes / sizeof(float), block = total / static_cast<std::size_t>(n);
    switch (k) {
      case op_kind::all_reduce: case op_kind::broadcast: a.assign(total, 1.0f + static_cast<float>(rank)); break;
      case op_kind::all_gather: a.assign(block, 1.0f); b.assign(total, 0.0f); break;
      case op_kind::reduce_scatter: a.assign(total, 1.0f); b.assign(block, 0.0f); break;
    }
  }
};

template <class G>
void run_op(G& g, op_kind k, buffers& buf) {
  switch (k) {
    case op_kind::all_reduce: g.all_reduce(tensor_view<float>(buf.a)).wait(); break;
    case op_kind::all_gather: g.all_gather(tensor_view<float>(buf.a), tensor_view<float>(buf.b)).wait(); break;
    case op_kind::reduce_scatter: g.reduce_scatter(tensor_view<float>(buf.a), tensor_view<float>(buf.b)).wait(); break;
    case op_kind::broadcast: g.broadcast(tensor_view<float>(buf.a), 0).wait(); break;
  }
}

// What a wrapper-against-raw sweep found (rank 0's view; -1 where nothing ran).
struct engine_result {
  double worst_vs_raw = -1;   // the lowest row's wrapper/raw busbw ratio at sizes >= 1 MiB
  double median_vs_raw = -1;  // the median row's at those sizes: the rows' centre, where the
                              // lowest also carries the rows' noise (a few % each on this VM)
  double all_reduce_1mib_busbw = -1;
};

// Every op at every size, our wrapper against the engine called directly, on `n` ranks (all run
// it; rank 0 prints the table under `label`). The pairs of a row (31 to 301, about 4 GiB moved
// per side) are spread over 3 sweeps of the whole table, so a slow stretch of the machine (a
// thread placed badly for a while) lands on a few pairs of many rows, not on all pairs of one:
// with one sweep, the same 1 MiB row at 101 pairs gave 0.87 in one run and 0.98 in the next.
// With 11 to 101 pairs (1 GiB), the lowest row >= 1 MiB still moved from 0.88 to 0.95 between
// runs: a 64 MiB row had 16 pairs.
// Each row reports the median call of each side and the median pair's ratio.
template <class Barrier, class Wrapper, class Raw>
engine_result sweep_against_raw(const plan& p, const char* label, int rank, int n, Barrier&& barrier, Wrapper&& wrapper,
                                Raw&& raw) {
  std::map<std::pair<int, std::size_t>, row_samples> rows;
  const int sweeps = p.quick ? 1 : 3;
  for (int sweep = 0; sweep < sweeps; ++sweep) {
    for (auto k : all_ops) {
      for (auto bytes : p.sizes) {
        buffers buf(k, bytes, n, rank);
        barrier();
        auto a = [&] { wrapper(k, buf); };
        auto b = [&] { raw(k, buf); };
        if (sweep == 0 && p.warmup(bytes)) {
          a();
          b();
        }
        const int pairs = p.quick ? 1 : static_cast<int>(std::clamp<std::size_t>((std::size_t{1} << 32) / bytes, 31, 301));
        time_pairs((pairs + sweeps - 1) / sweeps, rows[{static_cast<int>(k), bytes}], a, b);
      }
    }
  }
  engine_result res;
  if (rank != 0) return res;
  std::vector<double> ratios;  // rows >= 1 MiB
  for (auto k : all_ops) {
    for (auto bytes : p.sizes) {
      auto& row = rows[{static_cast<int>(k), bytes}];
      const double tw = median_of(row.ta), tr = median_of(row.tb), ratio = median_of(row.ratio);
      const double f = bus_factor(k, n), bw = gbps(bytes, tw) * f, rbw = gbps(bytes, tr) * f;
      std::printf("%-10s %-15s %10s %12.1f %10.3f %10.3f %12.1f %10.3f %8.3f\n", label, name(k), human(bytes).c_str(),
                  tw * 1e6, gbps(bytes, tw), bw, tr * 1e6, rbw, ratio);
      if (bytes >= (1u << 20)) ratios.push_back(ratio);
      if (k == op_kind::all_reduce && bytes == (1u << 20)) res.all_reduce_1mib_busbw = bw;
    }
  }
  std::fflush(stdout);
  if (!ratios.empty()) {
    res.worst_vs_raw = *std::min_element(ratios.begin(), ratios.end());
    res.median_vs_raw = median_of(ratios);
  }
  return res;
}

// ---- memcpy -------------------------------------------------------------------------------
std::map<std::size_t, double> bench_memcpy(const plan& p) {
  std::printf("\nmemcpy (one thread): GB/s = S / t\n%-10s %-15s %10s %12s %10s\n", "backend", "op", "size", "time_us", "GB/s");
  std::map<std::size_t, double> out;
  for (auto bytes : p.sizes) {
    std::vector<char> src(bytes, 1), dst(bytes, 0);
    const double t = time_calls(p, bytes, [&] {
      std::memcpy(dst.data(), src.data(), bytes);
      asm volatile("" : : "r"(dst.data()) : "memory");  // keep the copy
    });
    out[bytes] = gbps(bytes, t);
    std::printf("%-10s %-15s %10s %12.1f %10.3f\n", "memcpy", "copy", human(bytes).c_str(), t * 1e6, out[bytes]);
  }
  return out;
}

// ---- local ---------------------------------------------------------------------------------
std::map<std::pair<int, std::size_t>, double> bench_local(const plan& p) {
  print_header("local (2 threads of one process)");
  std::map<std::pair<int, std::size_t>, double> busbw;
  for (auto k : all_ops) {
    for (auto bytes : p.sizes) {
      double t0 = 0;
      run_local(world, [&](local_group& g) {
        buffers buf(k, bytes, world, g.rank());
        g.barrier().wait();
        const double t = time_calls(p, bytes, [&] { run_op(g, k, buf); });
        if (g.rank() == 0) t0 = t;
      });
      print_row("local", name(k), bytes, t0, bus_factor(k, world));
      busbw[{static_cast<int>(k), bytes}] = gbps(bytes, t0) * bus_factor(k, world);
    }
  }
  return busbw;
}

// ---- gloo ----------------------------------------------------------------------------------
#if defined(PARTRAIN_WITH_GLOO)
// The same operation issued on Gloo directly (on the wrapper's context: see bench_gloo).
void raw_gloo(const std::shared_ptr<gloo::Context>& ctx, op_kind k, buffers& buf, std::chrono::milliseconds timeout) {
  switch (k) {
    case op_kind::all_reduce: {
      gloo::AllreduceOptions o(ctx);
      o.setOutput(buf.a.data(), buf.a.size());
      o.setReduceFunction(static_cast<void (*)(void*, const void*, const void*, std::size_t)>(&gloo::sum<float>));
      o.setTimeout(timeout);
      gloo::allreduce(o);
      break;
    }
    case op_kind::all_gather: {
      gloo::AllgatherOptions o(ctx);
      o.setInput(buf.a.data(), buf.a.size());
      o.setOutput(buf.b.data(), buf.b.size());
      o.setTimeout(timeout);
      gloo::allgather(o);
      break;
    }
    case op_kind::reduce_scatter: {  // Gloo's own algorithm (in place; our block lands first)
      std::vector<float> scratch(buf.a);
      std::vector<int> counts(static_cast<std::size_t>(ctx->size), static_cast<int>(buf.b.size()));
      gloo::ReduceScatterHalvingDoubling<float> rs(ctx, {scratch.data()}, static_cast<int>(scratch.size()), counts);
      rs.run();
      std::memcpy(buf.b.data(), scratch.data(), buf.b.size() * sizeof(float));
      break;
    }
    case op_kind::broadcast: {
      gloo::BroadcastOptions o(ctx);
      o.setOutput(buf.a.data(), buf.a.size());
      o.setRoot(0);
      o.setTimeout(timeout);
      gloo::broadcast(o);
      break;
    }
  }
}


engine_result bench_gloo(const plan& p) {
  std::printf("\ngloo (2 processes, loopback TCP): partrain wrapper vs the same call on Gloo directly\n");
  std::printf("%-10s %-15s %10s %12s %10s %10s %12s %10s %8s\n", "backend", "op", "size", "time_us", "algbw", "busbw",
              "raw_us", "raw_busbw", "ratio");
  std::fflush(stdout);
  const auto dir = std::filesystem::temp_directory_path() / ("partrain-bench-gloo-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const auto result_file = dir / "ratio";
  const auto timeout = std::chrono::milliseconds(120'000);
  pid_t pids[world];
  for (int r = 0; r < world; ++r) {
    pids[r] = ::fork();
    if (pids[r] == 0) {
      int code = 0;
      try {
        auto st = std::make_shared<file_store>((dir / "store").string(), timeout);
        process_group_options opts;
        opts.timeout = timeout;
        gloo_options gopts;
        gopts.prefix = "wrapper/";
        gloo_group g(st, r, world, opts, gopts);
        // The raw calls run on the wrapper's own context (its connections and Gloo's loop thread),
        // between two of the wrapper's calls, so a ratio measures the wrapper and nothing else:
        // two contexts over loopback can each settle in a fast or a slow mode (~0.7 or ~2.9 ms
        // at 1 MiB), which made the ratio of two contexts range from 0.28 to 1.2 between runs.
        const auto& raw = g.context();
        const auto res = sweep_against_raw(
            p, "gloo", r, world, [&] { g.barrier().wait(); }, [&](op_kind k, buffers& buf) { run_op(g, k, buf); },
            [&](op_kind k, buffers& buf) { raw_gloo(raw, k, buf, timeout); });
        if (r == 0) {
          std::ofstream(result_file) << res.worst_vs_raw << " " << res.median_vs_raw << " " << res.all_reduce_1mib_busbw
                                     << "\n";
        }
      } catch (const std::exception& e) {
        std::fprintf(stderr, "gloo rank %d failed: %s\n", r, e.what());
        code = 1;
      }
      std::fflush(nullptr);
      ::_exit(code);
    }
  }
  bool ok = true;
  for (int r = 0; r < world; ++r) {
    int st = 0;
    ::waitpid(pids[r], &st, 0);
    ok = ok && WIFEXITED(st) && WEXITSTATUS(st) == 0;
  }
  engine_result res;
  if (ok) std::ifstream(result_file) >> res.worst_vs_raw >> res.median_vs_raw >> res.all_reduce_1mib_busbw;
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  return res;
}
#endif

// ---- mpi -----------------------------------------------------------------------------------
#if defined(PARTRAIN_WITH_MPI)
void raw_mpi(MPI_Comm comm, op_kind k, buffers& buf) {
  switch (k) {
    case op_kind::all_reduce:
      MPI_Allreduce(MPI_IN_PLACE, buf.a.data(), static_cast<int>(buf.a.size()), MPI_FLOAT, MPI_SUM, comm);
      break;
    case op_kind::all_gather:
      MPI_Allgather(buf.a.data(), static_cast<int>(buf.a.size()), MPI_FLOAT, buf.b.data(), static_cast<int>(buf.a.size()),
                    MPI_FLOAT, comm);
      break;
    case op_kind::reduce_scatter:
      MPI_Reduce_scatter_block(buf.a.data(), buf.b.data(), static_cast<int>(buf.b.size()), MPI_FLOAT, MPI_SUM, comm);
      break;
    case op_kind::broadcast: MPI_Bcast(buf.a.data(), static_cast<int>(buf.a.size()), MPI_FLOAT, 0, comm); break;
  }
}

// One rank of the mpi part (this program under mpirun): rank 0 prints the rows and, last, a
// line `mpi-result <lowest wrapper/raw ratio >= 1 MiB> <median one> <all_reduce busbw at 1 MiB>`.
int mpi_rank(const plan& p) {
  mpi_group g(process_group_options{.timeout = std::chrono::milliseconds(120'000)});
  MPI_Comm raw = MPI_COMM_NULL;
  {
    std::lock_guard lock(detail::mpi::runtime::instance().mutex());
    MPI_Comm_dup(MPI_COMM_WORLD, &raw);
  }
  const int n = g.size();
  // The raw calls run on this thread while the group's progress thread sleeps (nothing pending).
  const auto res = sweep_against_raw(
      p, "mpi", g.rank(), n, [&] { g.barrier().wait(); }, [&](op_kind k, buffers& buf) { run_op(g, k, buf); },
      [&](op_kind k, buffers& buf) {
        std::lock_guard lock(detail::mpi::runtime::instance().mutex());
        raw_mpi(raw, k, buf);
      });
  if (g.rank() == 0) {
    std::printf("mpi-result %.6f %.6f %.6f\n", res.worst_vs_raw, res.median_vs_raw, res.all_reduce_1mib_busbw);
  }
  std::lock_guard lock(detail::mpi::runtime::instance().mutex());
  MPI_Comm_free(&raw);
  return 0;
}

// Runs this program under mpirun for the mpi rows (2 ranks, shared memory between them).
engine_result bench_mpi(const plan& p, const char* self) {
  std::printf("\nmpi (2 processes under mpirun, Open MPI's shared memory): partrain wrapper vs the same call on MPI directly\n");
  std::printf("%-10s %-15s %10s %12s %10s %10s %12s %10s %8s\n", "backend", "op", "size", "time_us", "algbw", "busbw",
              "mpi_us", "mpi_busbw", "ratio");
  std::fflush(stdout);
  std::string cmd = std::string(PARTRAIN_MPIEXEC) + " -np 2 " + self + " --mpi-rank" + (p.quick ? " --quick" : "") + " 2>&1";
  engine_result res;
  FILE* pipe = ::popen(cmd.c_str(), "r");
  if (!pipe) return res;
  char line[512];
  while (std::fgets(line, sizeof line, pipe)) {
    if (std::sscanf(line, "mpi-result %lf %lf %lf", &res.worst_vs_raw, &res.median_vs_raw, &res.all_reduce_1mib_busbw) ==
        3) {
      continue;
    }
    std::fputs(line, stdout);
  }
  std::fflush(stdout);
  if (::pclose(pipe) != 0) return engine_result{};
  return res;
}
#endif

// ---- nccl ----------------------------------------------------------------------------------
#if defined(PARTRAIN_WITH_NCCL)
void bench_nccl(const plan& p) {
  int ndev = 0;
  if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
    std::printf("\nnccl: skipped (no GPU visible)\n");
    return;
  }
  std::vector<int> devs(static_cast<std::size_t>(ndev));
  for (int d = 0; d < ndev; ++d) devs[static_cast<std::size_t>(d)] = d;
  std::vector<ncclComm_t> comms(static_cast<std::size_t>(ndev));
  if (ncclCommInitAll(comms.data(), ndev, devs.data()) != ncclSuccess) {
    std::printf("\nnccl: skipped (ncclCommInitAll failed)\n");
    return;
  }
  char title[96];
  std::snprintf(title, sizeof title, "nccl (%d GPU%s, one process, ncclCommInitAll)", ndev, ndev > 1 ? "s" : "");
  print_header(title);
  std::vector<cudaStream_t> streams(static_cast<std::size_t>(ndev));
  for (int d = 0; d < ndev; ++d) {
    cudaSetDevice(d);
    cudaStreamCreate(&streams[static_cast<std::size_t>(d)]);
  }
  for (auto k : all_ops) {
    for (auto bytes : p.sizes) {
      const std::size_t total = bytes / sizeof(float), block = total / static_cast<std::size_t>(ndev);
      std::vector<float*> a(static_cast<std::size_t>(ndev)), b(static_cast<std::size_t>(ndev));
      for (int d = 0; d < ndev; ++d) {
        cudaSetDevice(d);
        cudaMalloc(&a[static_cast<std::size_t>(d)], bytes);
        cudaMalloc(&b[static_cast<std::size_t>(d)], bytes);
        cudaMemset(a[static_cast<std::size_t>(d)], 0, bytes);
      }
      auto once = [&] {
        ncclGroupStart();
        for (int d = 0; d < ndev; ++d) {
          const auto i = static_cast<std::size_t>(d);
          switch (k) {
            case op_kind::all_reduce: ncclAllReduce(a[i], a[i], total, ncclFloat, ncclSum, comms[i], streams[i]); break;
            case op_kind::all_gather: ncclAllGather(a[i], b[i], block, ncclFloat, comms[i], streams[i]); break;
            case op_kind::reduce_scatter: ncclReduceScatter(a[i], b[i], block, ncclFloat, ncclSum, comms[i], streams[i]); break;
            case op_kind::broadcast: ncclBroadcast(a[i], a[i], total, ncclFloat, 0, comms[i], streams[i]); break;
          }
        }
        ncclGroupEnd();
        for (int d = 0; d < ndev; ++d) {
          cudaSetDevice(d);
          cudaStreamSynchronize(streams[static_cast<std::size_t>(d)]);
        }
      };
      const double t = time_calls(p, bytes, once);
      print_row("nccl", name(k), bytes, t, bus_factor(k, ndev));
      for (int d = 0; d < ndev; ++d) {
        cudaSetDevice(d);
        cudaFree(a[static_cast<std::size_t>(d)]);
        cudaFree(b[static_cast<std::size_t>(d)]);
      }
    }
  }
  for (int d = 0; d < ndev; ++d) {
    cudaStreamDestroy(streams[static_cast<std::size_t>(d)]);
    ncclCommDestroy(comms[static_cast<std::size_t>(d)]);
  }
}
#endif

}  // namespace

int main(int argc, char** argv) {
  plan p;
  bool as_mpi_rank = false;
  for (int i = 1; i < argc; ++i) {
    const std::string_view a = argv[i];
    if (a == "--quick") {
      p.quick = true;
    } else if (a == "--mpi-rank") {
      as_mpi_rank = true;
    } else {
      std::fprintf(stderr, "bench_collectives: unknown argument '%s' (expected --quick or nothing)\n", argv[i]);
      return 2;
    }
  }
  if (p.quick) {
    p.sizes = {4u << 10, 1u << 20};
  } else {
    for (std::size_t s = 4u << 10; s <= (256u << 20); s *= 4) p.sizes.push_back(s);
  }
  if (as_mpi_rank) {
#if defined(PARTRAIN_WITH_MPI)
    return mpi_rank(p);
#else
    std::fprintf(stderr, "bench_collectives: --mpi-rank needs a build with MPI\n");
    return 2;
#endif
  }
  std::printf("bench_collectives: %d ranks, float32, sizes %s .. %s%s\n", world, human(p.sizes.front()).c_str(),
              human(p.sizes.back()).c_str(), p.quick ? " (--quick: 1 iteration)" : "");

  // Processes first: fork before this process has started any thread.
  engine_result gloo, mpi;
#if defined(PARTRAIN_WITH_GLOO)
  gloo = bench_gloo(p);
#else
  std::printf("\ngloo: skipped (built without Gloo)\n");
#endif
#if defined(PARTRAIN_WITH_MPI)
  mpi = bench_mpi(p, argv[0]);
#else
  std::printf("\nmpi: skipped (built without MPI)\n");
#endif
  const double gloo_vs_raw = gloo.worst_vs_raw;
  const double mpi_vs_gloo = mpi.all_reduce_1mib_busbw > 0 && gloo.all_reduce_1mib_busbw > 0
                                 ? mpi.all_reduce_1mib_busbw / gloo.all_reduce_1mib_busbw
                                 : -1;
  const auto local_bw = bench_local(p);
  const auto copy_bw = bench_memcpy(p);
#if defined(PARTRAIN_WITH_NCCL)
  bench_nccl(p);
#else
  std::printf("\nnccl: skipped (built without NCCL)\n");
#endif

  // local all_reduce busbw vs memcpy at 64 MiB (the largest size run when --quick)
  const std::size_t ref = p.quick ? p.sizes.back() : (64u << 20);
  const double local_vs_memcpy = local_bw.at({static_cast<int>(op_kind::all_reduce), ref}) / copy_bw.at(ref);
  std::printf(
      "\nsummary: gloo_vs_raw=%.3f local_vs_memcpy=%.3f mpi_vs_gloo=%.3f mpi_vs_raw=%.3f gloo_vs_raw_median=%.3f "
      "mpi_vs_raw_median=%.3f\n",
      gloo_vs_raw, local_vs_memcpy, mpi_vs_gloo, mpi.worst_vs_raw, gloo.median_vs_raw, mpi.median_vs_raw);
#if defined(PARTRAIN_WITH_GLOO)
  if (gloo_vs_raw < 0) {
    std::fprintf(stderr, "bench_collectives: the gloo part failed (see above)\n");
    return 1;
  }
#endif
#if defined(PARTRAIN_WITH_MPI)
  if (mpi.worst_vs_raw < 0) {
    std::fprintf(stderr, "bench_collectives: the mpi part failed (see above)\n");
    return 1;
  }
#endif
  return 0;
}
