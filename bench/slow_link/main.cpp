// bench_slow_link: what communicating less costs in accuracy and saves in bytes and time. Two
// ranks train the example's host MLP (784-256-128-10, SGD lr 0.05 momentum 0.9, the learning rate
// on a cosine from 0.05 to 0 over the run as in the example, batch 64 per rank) on the same
// Fashion-MNIST samples in every mode:
//   ddp            gradients all-reduced every step
//   local_sgd      post-local SGD: DDP for the first 10% of steps, then parameters averaged every 8
//   diloco         DiLoCo, H = 100, outer Nesterov SGD lr 0.7 momentum 0.9, fp32 outer gradients
//   diloco_int8    the same with per-tensor int8 outer gradients
//   streaming      streaming DiLoCo, H = 100, 2 fragments synced in turn, each exchange
//                  overlapping 5 inner steps
//   powersgd rN    PowerSGD rank N (1, 2, 4) as DDP's hook, plain all_reduce for the first 10%
// Local table: the ranks are threads (local backend); per mode the bytes rank 0 sent (ring-
// algorithm bytes, process_group::traffic()), the test accuracy of rank 0's model at the end
// (local SGD and DiLoCo synchronize once more first; streaming DiLoCo is taken as it stands),
// the training wall time (evaluations not counted), that time plus the bytes at 100 Mbit/s (a
// model, not a measurement), and the time to reach --target accuracy (0.88) both ways. Along the
// way rank 0's model is evaluated every --eval-every steps (at the first step after that where
// every rank holds the same model: after an average or an outer step); those points go to the
// CSV file --csv (default bench_slow_link.csv): mode, step, samples, seconds, seconds_100mbit,
// bytes_sent, test_accuracy (tools/plot_metrics.py --table draws it).
// Then, with --slow-link RATE[,RATE...] (tc rates, e.g. 100mbit,10mbit; needs root, ip and tc,
// and Gloo), the same modes for --slow-link-samples measured on a real slow link: two processes
// in two network namespaces joined by a veth pair shaped by `tc qdisc tbf` on both ends, over
// Gloo; the bench sets the namespaces up and removes them. Where that cannot run, it says why and
// exits 0. Their time to the target is an estimate: the local run's compute time to the target
// plus the bytes it had sent by then at the link's measured seconds per byte. With --to-target
// RATE, DDP and DiLoCo then train on such a link until they reach the target: measured.
// Last line:
//   summary: diloco_bytes_ratio=<ddp/diloco bytes to the same accuracy: the target, or the best
//              both reached> diloco_acc_gap=<ddp - diloco final accuracy, same samples>
//            powersgd_bytes_ratio=<ddp/powersgd rank-2 bytes>
//            [diloco_step_time_ratio_100mbit=<ddp/diloco wall s, the same steps on the 100mbit link>]
//            [diloco_time_ratio_<RATE>=<ddp/diloco s to the target on --to-target's link, measured>]
//            ddp_s_to_<target>_100mbit=<s> diloco_s_to_<target>_100mbit=<s> (modelled; "none" if not reached)
//   bench_slow_link [--quick] [--samples N] [--eval-every N] [--target ACC] [--csv FILE]
//                   [--slow-link RATES] [--slow-link-samples N] [--to-target RATE] [--modes LIST]
//                   [--constant-lr] [--diloco-h N] [--outer-lr X] [--outer-momentum X]
#include <fcntl.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <numbers>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <partrain/comm/local.hpp>
#include <partrain/data/batch.hpp>
#include <partrain/data/fashion_mnist.hpp>
#include <partrain/optim/sgd.hpp>
#include <partrain/parallel/ddp.hpp>
#include <partrain/parallel/diloco.hpp>
#include <partrain/parallel/local_sgd.hpp>
#include <partrain/parallel/powersgd.hpp>
#include <partrain/parallel/streaming_diloco.hpp>
#if defined(PARTRAIN_WITH_GLOO)
#include <partrain/launch/spawn.hpp>
#include <partrain/rendezvous/init.hpp>
#endif

#include "fashion_batches.hpp"
#include "mlp_host.hpp"

namespace {

using namespace partrain;
using clock_type = std::chrono::steady_clock;

constexpr int world = 2;
constexpr std::size_t batch_size = 64;
const sgd_options inner{.lr = 0.05, .momentum = 0.9};

// What the command line can change (the defaults are the figures docs/communication_efficient.md shows).
struct settings {
  bool cosine = true;            // inner lr: cosine from inner.lr down to 0 over the run (the example's schedule); else constant
  std::int64_t diloco_h = 100;   // DiLoCo's inner steps per round (H)
  double outer_lr = 0.7;         // DiLoCo's outer Nesterov SGD
  double outer_momentum = 0.9;
  std::vector<std::string> only;  // --modes: run these (keys) only; empty: all
};
settings cfg;

enum class mode { ddp, local_sgd, diloco, diloco_int8, streaming, powersgd_1, powersgd_2, powersgd_4 };
constexpr mode all_modes[] = {mode::ddp,       mode::local_sgd,  mode::diloco,     mode::diloco_int8,
                              mode::streaming, mode::powersgd_1, mode::powersgd_2, mode::powersgd_4};
constexpr std::size_t row_of(mode m) { return static_cast<std::size_t>(m); }  // rows follow all_modes

std::string name(mode m) {
  const std::string h = std::to_string(cfg.diloco_h);
  switch (m) {
    case mode::ddp: return "ddp";
    case mode::local_sgd: return "local_sgd (period 8)";
    case mode::diloco: return "diloco (H " + h + ", fp32)";
    case mode::diloco_int8: return "diloco (H " + h + ", int8)";
    case mode::streaming: return "diloco streaming (F 2)";
    case mode::powersgd_1: return "powersgd (rank 1)";
    case mode::powersgd_2: return "powersgd (rank 2)";
    case mode::powersgd_4: return "powersgd (rank 4)";
  }
  return "?";
}

// One evaluation along the way (rank 0's model, test set).
struct point {
  std::size_t step = 0;
  double seconds = 0;  // training time so far (evaluations not counted)
  std::uint64_t bytes = 0;
  double accuracy = 0;
};

// The mode's name in the CSV file and the summary (no spaces).
const char* key(mode m) {
  switch (m) {
    case mode::ddp: return "ddp";
    case mode::local_sgd: return "local_sgd";
    case mode::diloco: return "diloco";
    case mode::diloco_int8: return "diloco_int8";
    case mode::streaming: return "streaming_diloco";
    case mode::powersgd_1: return "powersgd_r1";
    case mode::powersgd_2: return "powersgd_r2";
    case mode::powersgd_4: return "powersgd_r4";
  }
  return "?";
}

struct measured {
  bool ran = false;  // false: left out by --modes
  std::uint64_t bytes = 0;
  double accuracy = 0;
  double seconds = 0;
  std::vector<point> curve;
};

// The first point at or past the target accuracy, if any.
std::optional<point> reached(const measured& r, double target) {
  for (const auto& p : r.curve) {
    if (p.accuracy >= target) return p;
  }
  return std::nullopt;
}

// The best accuracy along the way.
double best(const measured& r) {
  double b = 0;
  for (const auto& p : r.curve) b = std::max(b, p.accuracy);
  return b;
}

// Seconds on a link of `bits_per_s`, modelled: the measured time plus the bytes at that rate.
double at_rate(double seconds, std::uint64_t bytes, double bits_per_s) {
  return seconds + static_cast<double>(bytes) * 8 / bits_per_s;
}

struct eval_plan {
  std::size_t every = 0;           // 0: only at the end
  double stop_at = 0;              // > 0: stop at the first evaluation at or past this accuracy
  std::size_t schedule_steps = 0;  // the cosine schedule's length; 0: the run's steps
};

struct data {
  std::vector<batch> train;  // world batches per step: rank r takes batch step * world + r
  in_memory_dataset test;
};

double accuracy(models::mlp_host& m, const in_memory_dataset& test) {
  const auto f = test.features();
  const auto l = test.labels();
  eval_result r;
  for (std::size_t first = 0; first < test.size(); first += 1000) {
    const std::size_t n = std::min<std::size_t>(1000, test.size() - first);
    r += m.eval_step(batch{f.slice(first, first + n), tensor_view<const std::int32_t>(l.data() + first, n), {}});
  }
  return r.accuracy();
}

// DDP with its optimizer as one step, so every mode has the same train_step face.
template <class D, class O>
struct ddp_step {
  D& ddp;
  O& opt;
  template <class B>
  double train_step(const B& b) {
    const double loss = ddp.train_step(b);
    opt.step();
    return loss;
  }
};

// Whether every rank holds the same model right now (what an evaluation along the way waits for).
template <class Policy>
bool in_sync(Policy& p) {
  if constexpr (requires { p.synced_last_step(); }) {
    return p.synced_last_step();  // post-local SGD: after an average (or a warm-up step)
  } else if constexpr (requires { p.inner_step(); }) {
    return p.inner_step() == 0;  // DiLoCo: right after an outer step
  } else {
    return true;  // DDP; streaming DiLoCo is taken as it stands
  }
}

// One rank's run of a mode on group g; what rank 0 measured (the others return zeros).
template <class G>
measured train(mode md, G& g, const data& d, std::size_t steps, eval_plan plan = {}) {
  models::mlp_host m({}, 0);
  sgd opt(m, inner);
  const auto warmup = static_cast<std::int64_t>(steps / 10);
  measured out;
  out.ran = true;
  auto loop = [&](auto& policy) {
    g.barrier().wait();  // construction (parameter broadcasts) is not timed or counted
    g.reset_traffic();
    clock_type::duration trained{};
    auto t0 = clock_type::now();
    std::size_t next_eval = plan.every;
    const double schedule = static_cast<double>(plan.schedule_steps ? plan.schedule_steps : steps);
    std::size_t done = 0;
    while (done < steps) {
      if (cfg.cosine) opt.set_lr(inner.lr * (1 + std::cos(std::numbers::pi * static_cast<double>(done) / schedule)) / 2);
      policy.train_step(d.train[done * world + static_cast<std::size_t>(g.rank())]);
      ++done;
      if (plan.every && done >= next_eval && in_sync(policy)) {
        // Every rank stops the clock at the same step; rank 0 evaluates while the others wait
        // (with stop_at every rank evaluates its model, the same one, so all stop together).
        g.barrier().wait();
        trained += clock_type::now() - t0;
        double acc = 0;
        if (g.rank() == 0 || plan.stop_at > 0) acc = accuracy(m, d.test);
        if (g.rank() == 0) {
          out.curve.push_back({done, std::chrono::duration<double>(trained).count(), g.traffic().bytes_sent, acc});
        }
        next_eval += plan.every;
        g.barrier().wait();
        t0 = clock_type::now();
        if (plan.stop_at > 0 && acc >= plan.stop_at) break;
      }
    }
    // End on a model every rank agrees on: local SGD averages, DiLoCo ends its round early.
    if constexpr (requires { policy.average_parameters(); }) policy.average_parameters();
    if constexpr (requires { policy.sync(); }) {
      if (policy.inner_step() > 0) policy.sync();
    }
    // Streaming DiLoCo is measured as it stands: rank 0's parameters, each fragment some local
    // steps past its last outer step.
    g.barrier().wait();
    if (g.rank() == 0) {
      out.seconds = std::chrono::duration<double>(trained + (clock_type::now() - t0)).count();
      out.bytes = g.traffic().bytes_sent;
      out.accuracy = accuracy(m, d.test);
      const point last{done, out.seconds, out.bytes, out.accuracy};  // after the final sync
      if (!out.curve.empty() && out.curve.back().step == done) {
        out.curve.back() = last;
      } else {
        out.curve.push_back(last);
      }
    }
  };
  auto with_ddp = [&](ddp_options o) {
    distributed_data_parallel ddp(m, g, std::move(o));
    ddp_step step{ddp, opt};
    loop(step);
  };
  auto with_powersgd = [&](std::size_t rank) {
    auto state = std::make_shared<powersgd_state>(powersgd_options{.matrix_approximation_rank = rank, .start_iter = warmup});
    with_ddp({.hook = comm_hooks::powersgd(state)});
  };
  auto with_diloco = [&](outer_compression c) {
    diloco dl(m, opt, g,
              {.inner_steps = cfg.diloco_h,
               .outer_lr = cfg.outer_lr,
               .outer_momentum = cfg.outer_momentum,
               .nesterov = cfg.outer_momentum > 0,
               .compression = c});
    loop(dl);
  };
  switch (md) {
    case mode::ddp: with_ddp({}); break;
    case mode::local_sgd: {
      post_local_sgd lsgd(m, opt, g, {.period = 8, .warmup_steps = warmup});
      loop(lsgd);
      break;
    }
    case mode::diloco: with_diloco(outer_compression::none); break;
    case mode::diloco_int8: with_diloco(outer_compression::int8); break;
    case mode::streaming: {
      streaming_diloco sd(m, opt, g, {.inner_steps = cfg.diloco_h, .fragments = 2, .fragment_sync_delay = 5});
      loop(sd);
      break;
    }
    case mode::powersgd_1: with_powersgd(1); break;
    case mode::powersgd_2: with_powersgd(2); break;
    case mode::powersgd_4: with_powersgd(4); break;
  }
  return out;
}

measured run_local_mode(mode md, const data& d, std::size_t steps, eval_plan plan) {
  measured res;
  run_local(world, [&](local_group& g) {
    const auto r = train(md, g, d, steps, plan);
    if (g.rank() == 0) res = r;
  });
  return res;
}

// "12.34", or "-" when the target was not reached.
std::string seconds_or_dash(const std::optional<double>& s) {
  if (!s) return "-";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f", *s);
  return buf;
}

void print_header(const char* time_label, const std::string& to_target) {
  std::printf("%-24s %14s %10s %9s %9s %20s %16s\n", "mode", "bytes/rank", "vs ddp", "accuracy", "wall s", time_label,
              to_target.c_str());
}
void print_row(mode md, const measured& r, double ddp_bytes, double extra, const std::optional<double>& to_target) {
  if (!r.ran) {
    std::printf("%-24s %14s\n", name(md).c_str(), "(not run: --modes)");
    return;
  }
  const double ratio = r.bytes ? ddp_bytes / static_cast<double>(r.bytes) : 0;
  std::printf("%-24s %14llu %9.1fx %9.4f %9.2f %20.2f %16s\n", name(md).c_str(), static_cast<unsigned long long>(r.bytes), ratio,
              r.accuracy, r.seconds, extra, seconds_or_dash(to_target).c_str());
}

// The accuracy-over-time points of every mode, one CSV row each.
void write_curves(const std::filesystem::path& file, const std::vector<measured>& rows) {
  std::ofstream out(file);
  out << "mode,step,samples,seconds,seconds_100mbit,bytes_sent,test_accuracy\n";
  char line[256];
  for (std::size_t k = 0; k < rows.size(); ++k) {
    for (const auto& p : rows[k].curve) {
      std::snprintf(line, sizeof line, "%s,%zu,%zu,%.4f,%.4f,%llu,%.4f\n", key(all_modes[k]), p.step,
                    p.step * batch_size * world, p.seconds, at_rate(p.seconds, p.bytes, 100e6),
                    static_cast<unsigned long long>(p.bytes), p.accuracy);
      out << line;
    }
  }
  if (!out.flush()) throw error(error_kind::config, "bench_slow_link: cannot write " + file.string());
}

// Why the namespaced slow link cannot run here; empty when it can.
std::string slow_link_unavailable() {
#if !defined(PARTRAIN_WITH_GLOO)
  return "this build has no Gloo (install libgloo-dev): the two namespaced ranks talk through it";
#else
  if (::geteuid() != 0) return "not root (network namespaces and tc need CAP_NET_ADMIN)";
  if (std::system("command -v ip >/dev/null 2>&1 && command -v tc >/dev/null 2>&1") != 0) {
    return "`ip` or `tc` not found (install iproute2)";
  }
  if (std::system("ip netns list >/dev/null 2>&1") != 0) return "`ip netns list` failed (no network namespace support)";
  return {};
#endif
}

#if defined(PARTRAIN_WITH_GLOO)
// Two network namespaces joined by a veth pair whose ends are both shaped by tbf at `rate`;
// removed again (with the veth pair) when this goes out of scope.
class shaped_link {
 public:
  explicit shaped_link(const std::string& rate, std::uint64_t burst_bytes) {
    const std::string tag = "ptsl" + std::to_string(::getpid());
    ns_[0] = tag + "a";
    ns_[1] = tag + "b";
    run("ip netns add " + ns_[0]);
    made_[0] = true;
    run("ip netns add " + ns_[1]);
    made_[1] = true;
    run("ip link add " + ns_[0] + " netns " + ns_[0] + " type veth peer name " + ns_[1] + " netns " + ns_[1]);
    for (int r = 0; r < 2; ++r) {
      const std::string n = ns_[r];
      run("ip -n " + n + " addr add " + address(r) + "/24 dev " + n);
      run("ip -n " + n + " link set " + n + " up");
      run("ip -n " + n + " link set lo up");
      run("tc -n " + n + " qdisc add dev " + n + " root tbf rate " + rate + " burst " + std::to_string(burst_bytes) +
          " latency 100ms");
    }
  }
  shaped_link(const shaped_link&) = delete;
  shaped_link& operator=(const shaped_link&) = delete;
  ~shaped_link() {
    for (int r = 0; r < 2; ++r) {
      if (made_[r]) (void)std::system(("ip netns del " + ns_[r] + " >/dev/null 2>&1").c_str());
    }
  }
  [[nodiscard]] const std::string& ns(int r) const { return ns_[r]; }
  [[nodiscard]] static std::string address(int r) { return r == 0 ? "10.218.0.1" : "10.218.0.2"; }

 private:
  static void run(const std::string& cmd) {
    if (std::system((cmd + " >/dev/null 2>&1").c_str()) != 0) {
      throw error(error_kind::config, "bench_slow_link: `" + cmd + "` failed");
    }
  }
  std::string ns_[2];
  bool made_[2] = {false, false};
};

// A mode on the shaped link: two forked ranks, each in its namespace, over Gloo (rendezvous through
// a file, so only the training traffic crosses the link).
measured run_shaped_mode(mode md, const shaped_link& link, const data& d, std::size_t steps, eval_plan plan) {
  const auto base = std::filesystem::temp_directory_path() / ("bench_slow_link_" + std::to_string(::getpid()));
  const auto store = base.string() + "_store";
  const auto result = base.string() + "_result";
  std::filesystem::remove(store);
  spawn(world, [&](int rank) {
    // Before any thread exists: a thread keeps the namespace it was created in.
    const int fd = ::open(("/var/run/netns/" + link.ns(rank)).c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0 || ::setns(fd, CLONE_NEWNET) != 0) {
      throw error(error_kind::config, "cannot enter network namespace " + link.ns(rank));
    }
    ::close(fd);
    ::setenv("PARTRAIN_GLOO_HOST", shaped_link::address(rank).c_str(), 1);
    auto pg = init_process_group("file://" + store, {.backend = "gloo", .rank = rank, .world_size = world});
    const auto r = train(md, *pg, d, steps, plan);
    if (rank == 0) {
      std::ofstream out(result);
      out.precision(17);
      out << r.bytes << ' ' << r.accuracy << ' ' << r.seconds << ' ' << r.curve.size() << '\n';
      for (const auto& p : r.curve) out << p.step << ' ' << p.seconds << ' ' << p.bytes << ' ' << p.accuracy << '\n';
    }
  }, {.timeout = std::chrono::minutes(15), .echo_output = false});
  measured r;
  std::ifstream in(result);
  std::size_t points = 0;
  in >> r.bytes >> r.accuracy >> r.seconds >> points;
  for (std::size_t k = 0; in && k < points; ++k) {
    point p;
    in >> p.step >> p.seconds >> p.bytes >> p.accuracy;
    r.curve.push_back(p);
  }
  r.ran = true;
  if (!in) throw error(error_kind::internal, "bench_slow_link: rank 0 left no readable result in " + result);
  std::filesystem::remove(result);
  std::filesystem::remove(store);
  return r;
}
#endif

bool selected(mode md) {
  return cfg.only.empty() || std::find(cfg.only.begin(), cfg.only.end(), key(md)) != cfg.only.end();
}

std::vector<std::string> split_commas(std::string_view s) {
  std::vector<std::string> out;
  while (!s.empty()) {
    const auto k = s.find(',');
    out.emplace_back(s.substr(0, k));
    s = k == std::string_view::npos ? std::string_view{} : s.substr(k + 1);
  }
  return out;
}

// "100mbit" -> bits per second (the tc units the bench accepts: kbit, mbit, gbit).
std::optional<double> rate_bits(const std::string& r) {
  char* end = nullptr;
  const double v = std::strtod(r.c_str(), &end);
  const std::string_view unit(end);
  if (!(v > 0)) return std::nullopt;
  if (unit == "kbit") return v * 1e3;
  if (unit == "mbit") return v * 1e6;
  if (unit == "gbit") return v * 1e9;
  return std::nullopt;
}

}  // namespace

int main(int argc, char** argv) {
  std::size_t samples = 10 * 60000;  // ten epochs over both ranks
  std::size_t slow_samples = 12800;
  std::size_t eval_every = 100;
  double target = 0.88;
  std::filesystem::path csv = "bench_slow_link.csv";
  std::vector<std::string> rates;
  std::string to_target_rate;
  for (int i = 1; i < argc; ++i) {
    const std::string_view a = argv[i];
    auto count = [&](std::size_t& v) {
      const long n = i + 1 < argc ? std::atol(argv[++i]) : 0;
      if (n <= 0) {
        std::fprintf(stderr, "bench_slow_link: %s needs a positive integer\n", a.data());
        std::exit(2);
      }
      v = static_cast<std::size_t>(n);
    };
    if (a == "--quick") {
      samples = 12800;
      slow_samples = 6400;
      eval_every = 25;
    } else if (a == "--samples") {
      count(samples);
    } else if (a == "--eval-every") {
      count(eval_every);
    } else if (a == "--target" && i + 1 < argc) {
      target = std::strtod(argv[++i], nullptr);
      if (!(target > 0 && target <= 1)) {
        std::fprintf(stderr, "bench_slow_link: --target needs an accuracy in (0, 1], got '%s'\n", argv[i]);
        return 2;
      }
    } else if (a == "--to-target" && i + 1 < argc) {
      to_target_rate = argv[++i];
      if (!rate_bits(to_target_rate)) {
        std::fprintf(stderr, "bench_slow_link: --to-target rate '%s' is not <number>kbit|mbit|gbit\n", argv[i]);
        return 2;
      }
    } else if (a == "--constant-lr") {
      cfg.cosine = false;
    } else if (a == "--diloco-h") {
      std::size_t h = 0;
      count(h);
      cfg.diloco_h = static_cast<std::int64_t>(h);
    } else if ((a == "--outer-lr" || a == "--outer-momentum") && i + 1 < argc) {
      char* end = nullptr;
      const double v = std::strtod(argv[++i], &end);
      const bool lr = a == "--outer-lr";
      if (*end != '\0' || !(v >= 0) || (!lr && !(v < 1))) {
        std::fprintf(stderr, "bench_slow_link: %s needs a number %s, got '%s'\n", a.data(), lr ? ">= 0" : "in [0, 1)",
                     argv[i]);
        return 2;
      }
      (lr ? cfg.outer_lr : cfg.outer_momentum) = v;
    } else if (a == "--modes" && i + 1 < argc) {
      cfg.only = split_commas(argv[++i]);
      for (const auto& k : cfg.only) {
        if (std::none_of(std::begin(all_modes), std::end(all_modes), [&](mode m) { return k == key(m); })) {
          std::fprintf(stderr,
                       "bench_slow_link: --modes: unknown mode '%s' (expected ddp, local_sgd, diloco, diloco_int8, "
                       "streaming_diloco, powersgd_r1, powersgd_r2, powersgd_r4)\n",
                       k.c_str());
          return 2;
        }
      }
    } else if (a == "--csv" && i + 1 < argc) {
      csv = argv[++i];
    } else if (a == "--slow-link-samples") {
      count(slow_samples);
    } else if (a == "--slow-link" && i + 1 < argc) {
      rates = split_commas(argv[++i]);
      for (const auto& r : rates) {
        if (!rate_bits(r)) {
          std::fprintf(stderr, "bench_slow_link: --slow-link rate '%s' is not <number>kbit|mbit|gbit\n", r.c_str());
          return 2;
        }
      }
    } else {
      std::fprintf(stderr,
                   "bench_slow_link: unknown option '%s' (expected --quick, --samples N, --eval-every N, --target ACC, "
                   "--csv FILE, --slow-link RATE[,RATE...], --slow-link-samples N, --constant-lr, --diloco-h N, --outer-lr X, "
                   "--outer-momentum X, --modes LIST, --to-target RATE)\n",
                   argv[i]);
      return 2;
    }
  }
  const std::size_t steps = std::max<std::size_t>(1, samples / (batch_size * world));
  const std::size_t slow_steps = std::max<std::size_t>(1, slow_samples / (batch_size * world));
  try {
    data d;
    const auto train_set = bench::load_fashion_train();
    d.train = bench::dataset_batches(train_set, batch_size, std::max(steps, slow_steps) * world);
    d.test = load_fashion_mnist(fashion_mnist_split::test, fashion_mnist_normalization());
    std::printf("bench_slow_link: MLP 784-256-128-10, %d ranks, batch %zu per rank, SGD lr %.2f (%s) momentum %.1f; "
                "DiLoCo H %lld, outer lr %.2f momentum %.2f\n",
                world, batch_size, inner.lr, cfg.cosine ? "cosine to 0" : "constant", inner.momentum,
                static_cast<long long>(cfg.diloco_h), cfg.outer_lr, cfg.outer_momentum);
    std::printf("local backend (threads), %zu steps (%zu samples):\n", steps, steps * batch_size * world);
    char target_label[64];
    std::snprintf(target_label, sizeof target_label, "to %.2f s/100M", target);
    std::vector<measured> rows;
    for (mode md : all_modes) rows.push_back(selected(md) ? run_local_mode(md, d, steps, {.every = eval_every}) : measured{});
    print_header("at 100Mbit/s (model)", target_label);
    const double ddp_bytes = static_cast<double>(rows[0].bytes);
    // Time to the target: measured here (a fast link), and modelled at 100 Mbit/s.
    std::vector<std::optional<point>> hit;
    for (std::size_t k = 0; k < rows.size(); ++k) {
      hit.push_back(reached(rows[k], target));
      std::optional<double> t100;
      if (hit.back()) t100 = at_rate(hit.back()->seconds, hit.back()->bytes, 100e6);
      print_row(all_modes[k], rows[k], ddp_bytes, at_rate(rows[k].seconds, rows[k].bytes, 100e6), t100);
    }
    std::printf("time to test accuracy %.2f (evaluated every %zu steps, at the first step after that where the ranks "
                "agree):\n", target, eval_every);
    for (std::size_t k = 0; k < rows.size(); ++k) {
      if (hit[k]) {
        std::printf("  %-24s step %5zu  %7.2f s here  %8.2f s at 100Mbit/s (model)  %12llu bytes\n", name(all_modes[k]).c_str(),
                    hit[k]->step, hit[k]->seconds, at_rate(hit[k]->seconds, hit[k]->bytes, 100e6),
                    static_cast<unsigned long long>(hit[k]->bytes));
      } else if (rows[k].ran) {
        std::printf("  %-24s not reached in %zu steps (best %.4f)\n", name(all_modes[k]).c_str(), steps, best(rows[k]));
      }
    }
    write_curves(csv, rows);
    std::printf("accuracy over time: %s (plot: tools/plot_metrics.py --table %s --x seconds_100mbit --y test_accuracy "
                "--logx -o curve.png)\n", csv.c_str(), csv.c_str());
    std::fflush(stdout);

    std::string time_ratio_100;        // the same steps' wall time on the 100 Mbit/s link, DDP / DiLoCo
    std::string time_ratio_to_target;  // the measured time to the target on --to-target's link, DDP / DiLoCo
    if (rates.empty() && to_target_rate.empty()) {
      std::printf("slow link: not run (pass --slow-link 100mbit,10mbit to measure on two shaped network namespaces)\n");
    } else if (const auto why = slow_link_unavailable(); !why.empty()) {
      std::printf("slow link: skipped: %s\n", why.c_str());
    } else {
#if defined(PARTRAIN_WITH_GLOO)
      for (const auto& rate : rates) {
        const double bits = *rate_bits(rate);
        // tbf's bucket: 10 ms of the rate, at least 16 KiB (one jumbo frame plus headroom).
        const auto burst = std::max<std::uint64_t>(16384, static_cast<std::uint64_t>(bits / 8 / 100));
        shaped_link link(rate, burst);
        std::printf("slow link %s (veth between two network namespaces, tc tbf both ends, Gloo), %zu steps (%zu "
                    "samples):\n",
                    rate.c_str(), slow_steps, slow_steps * batch_size * world);
        char est_label[64];
        std::snprintf(est_label, sizeof est_label, "to %.2f s (est)", target);
        print_header("samples/s", est_label);
        std::vector<measured> shaped;
        for (mode md : all_modes) {
          shaped.push_back(selected(md) ? run_shaped_mode(md, link, d, slow_steps, {.schedule_steps = steps}) : measured{});
          const auto& r = shaped.back();
          // The local run's compute time to the target, plus its bytes at this link's measured cost
          // per byte (these steps' time less their compute time, per byte sent): warm-ups and
          // compression change the bytes per step, so bytes, not steps, carry the link's cost.
          std::optional<double> est;
          if (const auto& h = hit[row_of(md)]) {
            const auto& local = rows[row_of(md)];
            const double compute = local.seconds * static_cast<double>(slow_steps) / static_cast<double>(steps);
            const double per_byte = r.bytes ? std::max(0.0, r.seconds - compute) / static_cast<double>(r.bytes) : 0.0;
            est = h->seconds + static_cast<double>(h->bytes) * per_byte;
          }
          print_row(md, r, static_cast<double>(shaped[0].bytes),
                    static_cast<double>(slow_steps * batch_size * world) / r.seconds, est);
          std::fflush(stdout);
        }
        if (rate == "100mbit" && shaped[row_of(mode::ddp)].ran && shaped[row_of(mode::diloco)].ran) {
          char buf[64];
          std::snprintf(buf, sizeof buf, " diloco_step_time_ratio_100mbit=%.1f",
                        shaped[row_of(mode::ddp)].seconds / shaped[row_of(mode::diloco)].seconds);
          time_ratio_100 = buf;
        }
      }
      if (!to_target_rate.empty()) {
        // Time to the target on the link itself: DDP and DiLoCo train the local run's schedule until
        // their model reaches it (evaluations not counted), or to the end.
        const double bits = *rate_bits(to_target_rate);
        shaped_link link(to_target_rate, std::max<std::uint64_t>(16384, static_cast<std::uint64_t>(bits / 8 / 100)));
        std::printf("time to test accuracy %.2f on the slow link %s, measured (evaluated every %zu steps):\n", target,
                    to_target_rate.c_str(), eval_every);
        std::optional<double> secs[2];
        const mode pair[] = {mode::ddp, mode::diloco};
        for (int k = 0; k < 2; ++k) {
          const auto r = run_shaped_mode(pair[k], link, d, steps, {.every = eval_every, .stop_at = target});
          if (const auto h = reached(r, target)) {
            secs[k] = h->seconds;
            std::printf("  %-24s step %5zu  %8.2f s  %12llu bytes  accuracy %.4f\n", name(pair[k]).c_str(), h->step,
                        h->seconds, static_cast<unsigned long long>(h->bytes), h->accuracy);
          } else {
            std::printf("  %-24s not reached in %zu steps (%.2f s, best %.4f)\n", name(pair[k]).c_str(), steps, r.seconds,
                        best(r));
          }
          std::fflush(stdout);
        }
        char buf[96];
        std::snprintf(buf, sizeof buf, " diloco_time_ratio_%s=%s", to_target_rate.c_str(),
                      secs[0] && secs[1] ? seconds_or_dash(*secs[0] / *secs[1]).c_str() : "none");
        time_ratio_to_target = buf;
      }
#endif
    }
    const auto& dd = rows[row_of(mode::ddp)];
    const auto& dl = rows[row_of(mode::diloco)];
    const auto& ps2 = rows[row_of(mode::powersgd_2)];
    auto to_target = [&](mode md) {
      const auto& h = hit[row_of(md)];
      return h ? seconds_or_dash(at_rate(h->seconds, h->bytes, 100e6)) : std::string("none");
    };
    auto figure = [](bool known, double v, const char* format) {
      if (!known) return std::string("none");
      char buf[32];
      std::snprintf(buf, sizeof buf, format, v);
      return std::string(buf);
    };
    // Bytes to the same accuracy: the target, or the best both reached if one fell short of it.
    std::string bytes_ratio = "none";
    if (dd.ran && dl.ran) {
      const double same = std::min({target, best(dd), best(dl)});
      const auto a = reached(dd, same);
      const auto b = reached(dl, same);
      bytes_ratio = figure(a && b && b->bytes > 0, a && b ? static_cast<double>(a->bytes) / static_cast<double>(b->bytes) : 0,
                           "%.1f");
      std::printf("bytes to test accuracy %.4f: ddp %llu, diloco %llu; after the same %zu samples: ddp/diloco %.1fx\n",
                  same, a ? static_cast<unsigned long long>(a->bytes) : 0ULL,
                  b ? static_cast<unsigned long long>(b->bytes) : 0ULL, steps * batch_size * world,
                  dl.bytes ? static_cast<double>(dd.bytes) / static_cast<double>(dl.bytes) : 0.0);
    }
    char target_key[16];
    std::snprintf(target_key, sizeof target_key, "%.2f", target);
    std::printf("summary: diloco_bytes_ratio=%s diloco_acc_gap=%s powersgd_bytes_ratio=%s%s ddp_s_to_%s_100mbit=%s "
                "diloco_s_to_%s_100mbit=%s\n",
                bytes_ratio.c_str(), figure(dd.ran && dl.ran, dd.accuracy - dl.accuracy, "%.4f").c_str(),
                figure(dd.ran && ps2.ran && ps2.bytes > 0, ps2.bytes ? static_cast<double>(dd.bytes) / static_cast<double>(ps2.bytes) : 0, "%.1f").c_str(),
                (time_ratio_100 + time_ratio_to_target).c_str(), target_key, to_target(mode::ddp).c_str(), target_key,
                to_target(mode::diloco).c_str());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_slow_link: %s\n", e.what());
    return 1;
  }
  return 0;
}
