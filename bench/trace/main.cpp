// bench_trace: what the timeline costs. A step loop of a small host model (a dense layer's
// forward and backward, then N bucket all_reduces and an SGD update) on 2 ranks of the local
// backend, run three ways, interleaved so that machine noise hits all of them alike:
//   none  no tracing code at all            off  recorder present, tracing off
//   on    every span recorded (data, step, forward_backward, optimizer, one per bucket)
// Also the cost of one span, measured alone. Last line:
//   summary: trace_overhead=<(on - off) / off, lower-decile step times> off_overhead=<(off - none) / none> ...
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include <unistd.h>

#include <partrain/comm/local.hpp>
#include <partrain/core/buffer.hpp>
#include <partrain/train/trace.hpp>

using namespace partrain;
using clk = std::chrono::steady_clock;

namespace {

struct config {
  int buckets = 8;
  std::size_t bucket_floats = 16 * 1024;
  std::size_t in = 256, out = 256, batch = 32;
  int steps = 40;
  int reps = 7;
};

enum class mode { none, off, on };
constexpr const char* mode_name[] = {"none", "off", "on"};

// One rank's model and buffers.
struct rank_state {
  explicit rank_state(const config& c)
      : w(c.in * c.out), x(c.batch * c.in), y(c.batch * c.out), gw(c.in * c.out) {
    for (std::size_t i = 0; i < w.size(); ++i) w[i] = 0.001f * static_cast<float>(i % 97);
    for (std::size_t i = 0; i < x.size(); ++i) x[i] = 0.01f * static_cast<float>(i % 31);
    for (int b = 0; b < c.buckets; ++b) grads.emplace_back(c.bucket_floats);
  }
  host_buffer<float> w, x, y, gw;
  std::vector<host_buffer<float>> grads;
};

// The traced calls sit behind the same branches a real loop uses; `none` compiles them away.
template <mode M>
void step(const config& c, process_group& pg, rank_state& s, trace_recorder& rec, int i) {
  auto span = [&](std::string_view name, int tid = trace_track::step, const char* an = nullptr, std::int64_t a = 0) {
    if constexpr (M == mode::none) return 0;
    else return rec.span(name, tid, an, a);
  };
  { [[maybe_unused]] auto d = span("data_wait", trace_track::data); }
  [[maybe_unused]] auto st = span("step", trace_track::step, "step", i);
  std::vector<work> works;
  works.reserve(static_cast<std::size_t>(c.buckets));
  {
    [[maybe_unused]] auto fb = span("forward_backward");
    // forward y = x W, backward gW = x^T y (stand-in for real gradients)
    for (std::size_t b = 0; b < c.batch; ++b)
      for (std::size_t o = 0; o < c.out; ++o) {
        float acc = 0;
        for (std::size_t k = 0; k < c.in; ++k) acc += s.x[b * c.in + k] * s.w[k * c.out + o];
        s.y[b * c.out + o] = acc;
      }
    for (std::size_t k = 0; k < c.in; ++k)
      for (std::size_t o = 0; o < c.out; ++o) {
        float acc = 0;
        for (std::size_t b = 0; b < c.batch; ++b) acc += s.x[b * c.in + k] * s.y[b * c.out + o];
        s.gw[k * c.out + o] = acc * 1e-6f;
      }
    for (int b = c.buckets - 1; b >= 0; --b) {
      auto& g = s.grads[static_cast<std::size_t>(b)];
      std::memcpy(g.data(), s.gw.data(), std::min(g.size(), s.gw.size()) * sizeof(float));
      works.push_back(pg.all_reduce(g.view()));
      if constexpr (M != mode::none) rec.trace_work(works.back(), "all_reduce", trace_track::bucket(static_cast<std::size_t>(b)), "bucket", b);
    }
  }
  wait_all(works);
  [[maybe_unused]] auto opt = span("optimizer");
  for (std::size_t k = 0; k < s.w.size(); ++k) s.w[k] -= 1e-3f * s.grads[0][k % c.bucket_floats];
}

// Best of several batches: the least disturbed by other work on the machine.
double span_cost_ns(trace_recorder& rec, int batches, int per_batch) {
  double best = 1e300;
  for (int b = 0; b < batches; ++b) {
    const auto t0 = clk::now();
    for (int i = 0; i < per_batch; ++i) [[maybe_unused]] auto s = rec.span("step", trace_track::step, "step", i);
    best = std::min(best, std::chrono::duration<double, std::nano>(clk::now() - t0).count() / per_batch);
  }
  return best;
}

// What one steady_clock read costs here (a span reads the clock twice; under some hypervisors or
// sandboxes the read is a system call rather than a vDSO rdtsc).
double clock_cost_ns(int batches, int per_batch) {
  double best = 1e300;
  std::int64_t sink = 0;
  for (int b = 0; b < batches; ++b) {
    const auto t0 = clk::now();
    for (int i = 0; i < per_batch; ++i) sink += detail::trace::steady_ns();
    best = std::min(best, std::chrono::duration<double, std::nano>(clk::now() - t0).count() / per_batch);
  }
  return sink == 42 ? best + 1 : best;  // keeps the loop
}

// q in [0, 1]: 0.5 the median, 0.1 the lower decile.
double quantile(std::vector<double> v, double q) {
  std::sort(v.begin(), v.end());
  return v[static_cast<std::size_t>(q * static_cast<double>(v.size() - 1))];
}

}  // namespace

int main(int argc, char** argv) {
  config c;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--quick") {
      c.steps = 10;
      c.reps = 3;
    } else {
      std::fprintf(stderr, "bench_trace: unknown option '%s' (expected --quick)\n", argv[i]);
      return 2;
    }
  }
  try {
    const auto trace_path = std::filesystem::temp_directory_path() / ("bench_trace_" + std::to_string(::getpid()) + ".json");
    std::vector<std::vector<double>> ms(3);  // per mode, rank 0's step times
    std::size_t events_per_rank = 0;
    std::uintmax_t trace_bytes = 0;
    run_local(2, [&](local_group& pg) {
      rank_state s(c);
      trace_recorder off;
      trace_recorder on(trace_path, 1 << 16);
      on.start(pg);
      // One step of the given mode, timed on this rank. Every step ends in all_reduces, so the
      // two ranks stay in lock step and rank 0's time is the job's step time.
      auto timed = [&]<mode M>(trace_recorder& rec, int i) {
        const auto t0 = clk::now();
        step<M>(c, pg, s, rec, i);
        return std::chrono::duration<double, std::milli>(clk::now() - t0).count();
      };
      for (int i = 0; i < 3; ++i) (void)timed.operator()<mode::none>(off, i);  // warm-up
      pg.barrier().wait();
      // Interleaved step by step (rotating which mode goes first), so load from elsewhere on the
      // machine hits the three modes alike; medians over many steps then compare them.
      for (int r = 0; r < c.reps; ++r) {
        for (int i = 0; i < c.steps; ++i) {
          for (int k = 0; k < 3; ++k) {
            const int m = (i + k) % 3;
            const double t = m == 0 ? timed.operator()<mode::none>(off, i)
                           : m == 1 ? timed.operator()<mode::off>(off, i)
                                    : timed.operator()<mode::on>(on, i);
            if (pg.rank() == 0) ms[static_cast<std::size_t>(m)].push_back(t);
          }
        }
      }
      if (on.finish(pg)) trace_bytes = std::filesystem::file_size(trace_path);
      if (pg.rank() == 0) events_per_rank = on.event_count();
    });
    std::filesystem::remove(trace_path);

    trace_recorder off_rec, on_rec(std::filesystem::temp_directory_path() / "unused.json", 1 << 20);
    const double off_ns = span_cost_ns(off_rec, 2 * c.reps, 50'000);
    const double on_ns = span_cost_ns(on_rec, 2 * c.reps, 50'000);

    std::printf("bench_trace: 2 ranks (local backend), dense %zux%zu batch %zu, %d buckets x %zu floats, %d steps x %d reps\n",
                c.in, c.out, c.batch, c.buckets, c.bucket_floats, c.steps, c.reps);
    // On a machine shared with other work, the lower decile of many interleaved steps is the
    // least disturbed estimate of a step's time; the median is shown beside it.
    std::printf("%-6s %9s %12s %11s %14s\n", "trace", "steps", "p10 ms/step", "vs none", "median ms/step");
    const double none = quantile(ms[0], 0.1);
    for (int m = 0; m < 3; ++m) {
      const auto& v = ms[static_cast<std::size_t>(m)];
      const double p10 = quantile(v, 0.1);
      std::printf("%-6s %9zu %12.4f %+10.2f%% %14.4f\n", mode_name[m], v.size(), p10, 100.0 * (p10 / none - 1.0),
                  quantile(v, 0.5));
    }
    const int spans_per_step = 4 + c.buckets;
    std::printf("one span: off %.2f ns, on %.1f ns (one clock read: %.1f ns); %d spans per step per rank; "
                "%zu events on rank 0, merged trace %ju bytes\n",
                off_ns, on_ns, clock_cost_ns(2 * c.reps, 20'000), spans_per_step, events_per_rank, trace_bytes);
    const double step_ms = quantile(ms[1], 0.1);
    std::printf("summary: trace_overhead=%.4f off_overhead=%.4f span_model_overhead=%.5f span_on_ns=%.1f span_off_ns=%.2f\n",
                quantile(ms[2], 0.1) / step_ms - 1.0, step_ms / none - 1.0, spans_per_step * on_ns * 1e-6 / step_ms, on_ns,
                off_ns);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_trace: %s\n", e.what());
    return 1;
  }
}
