// bench_pipeline: does the executor reach the schedule's theoretical bubble, and what
// activation memory does each schedule hold? Stages are host threads (local backend).
//
// Timed model: every global stage is one layer whose forward waits t_f and backward 2 t_f (a
// timed wait, not compute, so p = 4 stages measure the schedule rather than this machine's
// cores). Real model: an MLP of equal layers split in 2 balanced stages, real float compute.
//
// Bubble = (step - busy) / step, where busy is the measured forward+backward time of the
// busiest rank (so timer overshoot counts as work, not as bubble). Theory:
// (p-1)/(m+p-1) for GPipe and 1F1B, (p-1)/(v m+p-1) for interleaved with v chunks per rank.
//
// Usage: bench_pipeline [--t-forward-ms 5] [--reps 5] [--quick]
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <partrain/comm/local.hpp>
#include <partrain/parallel/pipeline/pipeline.hpp>

#include "pipeline_layers.hpp"

using namespace partrain;
using clk = std::chrono::steady_clock;

namespace {

// Busy time per rank, summed by the layers that run on it.
struct busy_clock {
  std::vector<std::atomic<long long>> ns;
  explicit busy_clock(int ranks) : ns(static_cast<std::size_t>(ranks)) {}
  void reset() {
    for (auto& n : ns) n = 0;
  }
  [[nodiscard]] double max_seconds() const {
    long long m = 0;
    for (auto& n : ns) m = std::max(m, n.load());
    return static_cast<double>(m) * 1e-9;
  }
};

// Identity layer whose forward and backward take a fixed wall time (sleep_until a deadline).
class timed_layer final : public test::host_layer {
 public:
  timed_layer(std::chrono::microseconds tf, std::chrono::microseconds tb, busy_clock& clock, int rank)
      : tf_(tf), tb_(tb), clock_(&clock), rank_(rank) {}
  [[nodiscard]] shape output_shape(const shape& s) const override { return s; }
  void forward(tensor_view<const float> in, tensor_view<float> out) override {
    const auto t0 = clk::now();
    std::copy(in.begin(), in.end(), out.begin());
    std::this_thread::sleep_until(t0 + tf_);
    account(t0);
  }
  void backward(tensor_view<const float>, tensor_view<const float>, tensor_view<const float> gy,
                tensor_view<float> gx) override {
    const auto t0 = clk::now();
    std::copy(gy.begin(), gy.end(), gx.begin());
    std::this_thread::sleep_until(t0 + tb_);
    account(t0);
  }
  [[nodiscard]] std::vector<test::host_param>& parameters() override { return none_; }
  [[nodiscard]] std::unique_ptr<test::host_layer> clone() const override { return std::make_unique<timed_layer>(*this); }

 private:
  void account(clk::time_point t0) {
    clock_->ns[static_cast<std::size_t>(rank_)] += std::chrono::duration_cast<std::chrono::nanoseconds>(clk::now() - t0).count();
  }
  std::chrono::microseconds tf_, tb_;
  busy_clock* clock_;
  int rank_;
  std::vector<test::host_param> none_;
};

// Wraps a real layer and adds its compute time to its rank's busy clock.
class measured_layer final : public test::host_layer {
 public:
  measured_layer(std::unique_ptr<test::host_layer> inner, busy_clock& clock, int rank)
      : inner_(std::move(inner)), clock_(&clock), rank_(rank) {}
  [[nodiscard]] shape output_shape(const shape& s) const override { return inner_->output_shape(s); }
  void forward(tensor_view<const float> in, tensor_view<float> out) override {
    const auto t0 = clk::now();
    inner_->forward(in, out);
    account(t0);
  }
  void backward(tensor_view<const float> in, tensor_view<const float> out, tensor_view<const float> gy,
                tensor_view<float> gx) override {
    const auto t0 = clk::now();
    inner_->backward(in, out, gy, gx);
    account(t0);
  }
  [[nodiscard]] std::vector<test::host_param>& parameters() override { return inner_->parameters(); }
  [[nodiscard]] std::unique_ptr<test::host_layer> clone() const override {
    return std::make_unique<measured_layer>(inner_->clone(), *clock_, rank_);
  }

 private:
  void account(clk::time_point t0) {
    clock_->ns[static_cast<std::size_t>(rank_)] += std::chrono::duration_cast<std::chrono::nanoseconds>(clk::now() - t0).count();
  }
  std::unique_ptr<test::host_layer> inner_;
  busy_clock* clock_;
  int rank_;
};

struct row {
  std::string model, schedule;
  int p, m, v;
  double step_ms, ideal_ms, busy_ms, bubble, theory;
  int peak_act0;  // stage 0's peak in-flight (micro-batch, chunk) activations
  double peak_act_mb0;  // the same in whole micro-batches (chunk = 1/v of a stage)
  std::size_t peak_bytes0;
  std::string peaks;  // every stage's peak, in micro-batches
};

struct measured {
  double step_s = 1e30, busy_s = 0;
  std::vector<pipeline_step_stats> stats;
};

// Runs `reps` steps after one warm-up; keeps the fastest step (least disturbed by the machine).
measured run(test::host_model& model, busy_clock& clock, int p, const pipeline_options& o, tensor_view<const float> x,
             tensor_view<const std::int32_t> y, int reps) {
  measured best;
  best.stats.resize(static_cast<std::size_t>(p));
  std::vector<double> step(static_cast<std::size_t>(p));
  std::vector<pipeline_step_stats> stats(static_cast<std::size_t>(p));
  for (int r = 0; r <= reps; ++r) {
    clock.reset();
    run_local(p, [&](local_group& g) {
      pipeline_stage stage(model, g, o);
      test::softmax_cross_entropy loss;
      (void)stage.train_step(loss, x, y);
      stats[static_cast<std::size_t>(g.rank())] = stage.last_stats();
      step[static_cast<std::size_t>(g.rank())] = stage.last_stats().seconds;
    });
    const double s = *std::max_element(step.begin(), step.end());
    if (r > 0 && s < best.step_s) {
      best.step_s = s;
      best.busy_s = clock.max_seconds();
      best.stats = stats;
    }
  }
  return best;
}

std::string peaks_of(const std::vector<pipeline_step_stats>& st, int v) {
  std::string s;
  for (const auto& x : st) {
    char b[32];
    std::snprintf(b, sizeof b, "%g", static_cast<double>(x.peak_in_flight) / v);
    s += (s.empty() ? "" : ",") + std::string(b);
  }
  return s;
}

const char* name_of(pipeline_schedule_kind k) {
  switch (k) {
    case pipeline_schedule_kind::gpipe: return "gpipe";
    case pipeline_schedule_kind::one_f_one_b: return "1f1b";
    case pipeline_schedule_kind::interleaved_1f1b: return "interleaved";
  }
  return "?";
}

}  // namespace

int main(int argc, char** argv) {
  double tf_ms = 5.0;
  int reps = 5;
  bool quick = false;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--t-forward-ms") && i + 1 < argc) {
      tf_ms = std::atof(argv[++i]);
    } else if (!std::strcmp(argv[i], "--reps") && i + 1 < argc) {
      reps = std::atoi(argv[++i]);
    } else if (!std::strcmp(argv[i], "--quick")) {
      quick = true;
    } else {
      std::fprintf(stderr, "usage: bench_pipeline [--t-forward-ms MS] [--reps N] [--quick]\n");
      return 2;
    }
  }
  if (tf_ms <= 0 || reps < 1) {
    std::fprintf(stderr, "bench_pipeline: --t-forward-ms must be > 0 and --reps >= 1\n");
    return 2;
  }
  std::vector<row> rows;
  const std::vector<int> ms = quick ? std::vector<int>{1, 4, 16} : std::vector<int>{1, 2, 4, 8, 16};

  // Timed model: p*v layers (one per global stage), each t_f/v forward and 2 t_f/v backward.
  for (int p : {2, 4}) {
    for (auto kind : {pipeline_schedule_kind::gpipe, pipeline_schedule_kind::one_f_one_b,
                      pipeline_schedule_kind::interleaved_1f1b}) {
      const int v = kind == pipeline_schedule_kind::interleaved_1f1b ? 2 : 1;
      busy_clock clock(p);
      test::host_model model;
      const auto tf = std::chrono::microseconds(static_cast<long long>(tf_ms * 1000.0 / v));
      for (int g = 0; g < p * v; ++g) model.push_back(std::make_unique<timed_layer>(tf, 2 * tf, clock, g % p));
      for (int m : ms) {
        if (v > 1 && m % p != 0) continue;
        test::synthetic_batch b(static_cast<std::size_t>(m), 8, 8, 1);
        pipeline_options o;
        o.kind = kind;
        o.micro_batches = m;
        o.virtual_stages = v;
        const auto r = run(model, clock, p, o, b.input(), b.labels(), reps);
        row w{"timed", name_of(kind), p, m, v, r.step_s * 1e3, m * 3 * tf_ms, r.busy_s * 1e3, 0, 0, 0, 0, 0, ""};
        w.bubble = (r.step_s - r.busy_s) / r.step_s;
        w.theory = static_cast<double>(p - 1) / (v * m + p - 1);
        w.peak_act0 = r.stats[0].peak_in_flight;
        w.peak_act_mb0 = static_cast<double>(w.peak_act0) / v;
        w.peak_bytes0 = r.stats[0].peak_activation_bytes;
        w.peaks = peaks_of(r.stats, v);
        rows.push_back(w);
      }
    }
  }

  // Real compute: an MLP of four equal 256x256 linear layers (+ relu) in 2 balanced stages,
  // batch 128. Theory assumes equal stages, so the model is built to have them.
  {
    const int p = 2;
    busy_clock clock(p);
    auto mlp = test::make_mlp({256, 256, 256, 256, 256}, 1);
    const auto layout = partition_balanced(parameter_costs(mlp), p);
    test::host_model model;
    for (std::size_t i = 0; i < mlp.size(); ++i) {
      const int rank = i < layout.last(0) ? 0 : 1;
      model.push_back(std::make_unique<measured_layer>(std::move(mlp[i]), clock, rank));
    }
    test::synthetic_batch b(128, 256, 256, 2);
    for (auto kind : {pipeline_schedule_kind::gpipe, pipeline_schedule_kind::one_f_one_b}) {
      for (int m : ms) {
        pipeline_options o;
        o.kind = kind;
        o.micro_batches = m;
        o.layout = layout;
        const auto r = run(model, clock, p, o, b.input(), b.labels(), reps);
        row w{"mlp", name_of(kind), p, m, 1, r.step_s * 1e3, 0, r.busy_s * 1e3, 0, 0, 0, 0, 0, ""};
        w.ideal_ms = w.busy_ms;
        w.bubble = (r.step_s - r.busy_s) / r.step_s;
        w.theory = static_cast<double>(p - 1) / (m + p - 1);
        w.peak_act0 = r.stats[0].peak_in_flight;
        w.peak_act_mb0 = w.peak_act0;
        w.peak_bytes0 = r.stats[0].peak_activation_bytes;
        w.peaks = peaks_of(r.stats, 1);
        rows.push_back(w);
      }
    }
  }

  std::printf("bench_pipeline: stages as host threads (local backend); timed stages t_f = %.2f ms, t_b = %.2f ms per "
              "rank and micro-batch; best of %d steps\n",
              tf_ms, 2 * tf_ms, reps);
  std::printf("%-6s %-12s %2s %3s %2s %9s %9s %9s %7s %7s %7s %-16s %10s\n", "model", "schedule", "p", "m", "v",
              "step_ms", "ideal_ms", "busy_ms", "bubble", "theory", "|error|", "peak_act/stage", "bytes_s0");
  double max_err = 0, max_err_mlp = 0;
  double gpipe_peak = 0, onef1b_peak = 0;
  bool onef1b_below = true;
  for (const auto& w : rows) {
    const double err = std::abs(w.bubble - w.theory);
    if (w.model == "timed") max_err = std::max(max_err, err);
    else max_err_mlp = std::max(max_err_mlp, err);
    std::printf("%-6s %-12s %2d %3d %2d %9.2f %9.2f %9.2f %7.4f %7.4f %7.4f %-16s %10zu\n", w.model.c_str(),
                w.schedule.c_str(), w.p, w.m, w.v, w.step_ms, w.ideal_ms, w.busy_ms, w.bubble, w.theory, err,
                w.peaks.c_str(), w.peak_bytes0);
    if (w.model == "timed" && w.p == 4 && w.m == ms.back()) {
      if (w.schedule == "gpipe") gpipe_peak = w.peak_act_mb0;
      if (w.schedule == "1f1b") onef1b_peak = w.peak_act_mb0;
    }
  }
  for (const auto& g : rows) {
    for (const auto& f : rows) {
      if (g.model == f.model && g.p == f.p && g.m == f.m && g.m > g.p && g.schedule == "gpipe" && f.schedule == "1f1b" &&
          !(f.peak_act_mb0 < g.peak_act_mb0)) {
        onef1b_below = false;
      }
    }
  }
  std::printf("peak_act/stage: each stage's peak in-flight activations in micro-batches (a chunk counts 1/v); "
              "bytes_s0: bytes the executor held for backward on stage 0; ideal = m x (t_f + t_b) (timed), busy = "
              "busiest rank's measured F+B time; bubble = (step - busy) / step\n");
  std::printf("max |bubble - theory|: timed %.4f (target 0.05), real MLP %.4f; 1F1B below GPipe for m > p: %s\n",
              max_err, max_err_mlp, onef1b_below ? "yes" : "no");
  std::printf("summary: max_bubble_error=%.4f gpipe_peak_act=%g onef1b_peak_act=%g\n", max_err, gpipe_peak, onef1b_peak);
  return 0;
}
