// examples/fault_tolerant: data-parallel training that survives a lost rank without a restart.
// Three ranks fit a linear model with SGD and momentum; a spare waits. When a rank is lost, the
// others drop the step in flight, the spare takes the lost rank's slot after receiving the weights
// and the momentum from a live rank, and training goes on. The slots keep their data, so the
// result is bit-identical to a run where nothing failed. partrun starts the processes, runs the
// lighthouse that decides who trains, and starts no one else's process again:
//   build/tools/partrun/partrun --standalone --nproc-per-node 3 --spares 1 build/examples/fault_tolerant/fault_tolerant
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <partrain/comm/gloo.hpp>
#include <partrain/parallel/replica_group.hpp>
#include <partrain/train/metrics.hpp>
#include <partrain/train/replica_events.hpp>
#include <partrain/train/replica_launch.hpp>

namespace {

using namespace partrain;
using namespace std::chrono_literals;

constexpr std::size_t features = 8, rows = 16;

// y = w.x, mean squared error, SGD with momentum. state = {w, velocity}: what a joining rank receives.
struct linear_model {
  std::vector<float> state = std::vector<float>(2 * features, 0.0f), grad = std::vector<float>(features);
  double loss = 0;

  // Slot `slot`'s rows of step `step`: the same numbers whichever process computes them.
  void compute(process_group& g, int slot, std::int64_t step) {
    std::fill(grad.begin(), grad.end(), 0.0f);
    loss = 0;
    for (std::size_t i = 0; i < rows; ++i) {
      float x[features], e = 0;
      for (std::size_t j = 0; j < features; ++j) {
        const auto seed = static_cast<std::uint32_t>(((step * 1000 + slot * 100) + static_cast<std::int64_t>(i)) * 16) + j;
        x[j] = static_cast<float>((seed * 2654435761u) % 2000) / 1000.0f - 1.0f;
        e += (state[j] - 0.25f * static_cast<float>(j + 1)) * x[j];  // the true weights are 0.25 (j+1)
      }
      loss += e * e / rows;
      for (std::size_t j = 0; j < features; ++j) grad[j] += 2 * e * x[j] / rows;
    }
    g.all_reduce(tensor_view<float>(grad), reduce_op::avg).wait();
  }
  void apply() {
    for (std::size_t j = 0; j < features; ++j) {
      state[features + j] = 0.9f * state[features + j] + grad[j];
      state[j] -= 0.05f * state[features + j];
    }
  }
  replica_state_io io() {
    return {.save = [this] { return std::vector<std::byte>(std::as_bytes(std::span(state)).begin(), std::as_bytes(std::span(state)).end()); },
            .load = [this](std::span<const std::byte> b) { std::memcpy(state.data(), b.data(), b.size()); }};
  }
};

struct options {
  std::int64_t steps = 60, at_step = 20;
  int lose_rank = 1;  // -1: nobody is lost
  int step_ms = 0;    // a model's compute time, slept in every step
  std::string metrics;  // a JSON-lines file every replica appends its events to
};

// One replica's run; lose() ends its process. Prints its end if in a slot; returns the weights
// as text (empty for a spare the job did not need).
std::string train(replica_group& rg, linear_model& m, const options& o, int replica, const std::function<void()>& lose) {
  while (rg.current_step() < o.steps) {
    const bool more = rg.step(
        [&](process_group& g, int slot, std::int64_t step) {
          // Only the rank's first process: a replacement (the same rank) heals in and stays.
          if (replica == o.lose_rank && step == o.at_step && rg.heals() == 0) lose();
          std::this_thread::sleep_for(std::chrono::milliseconds(o.step_ms));
          m.compute(g, slot, step);
        },
        [&] { m.apply(); });
    if (!more) break;
  }
  rg.finish();
  if (rg.slot() < 0) return {};
  std::string bits;
  char text[32];  // 9 significant digits tell every float apart: equal text, equal bits
  for (std::size_t j = 0; j < features; ++j) {
    bits.append(text, static_cast<std::size_t>(std::snprintf(text, sizeof text, "%.9g ", static_cast<double>(m.state[j]))));
  }
  std::printf("replica %d in slot %d: final loss %.6f, weights %s%s\n", replica, rg.slot(), m.loss, bits.c_str(),
              rg.heals() ? "(healed into the job from a live rank)" : "");
  return bits;
}

}  // namespace

int main(int argc, char** argv) {
  options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--help" || a == "-h" || i + 1 == argc ||
        (a != "--steps" && a != "--lose-rank" && a != "--at-step" && a != "--step-ms" && a != "--metrics")) {
      const bool help = a == "--help" || a == "-h";
      if (!help) std::fprintf(stderr, "fault_tolerant: unknown argument '%s'\n", a.c_str());
      std::fprintf(help ? stdout : stderr,
                   "usage: fault_tolerant [--steps 60] [--lose-rank 1|none] [--at-step 20] [--step-ms 0] [--metrics FILE]\n"
                   "  under partrun --spares N or --min-replicas M; --lose-rank R SIGKILLs rank R at --at-step;\n"
                   "  --metrics: every replica appends its events (joined, healed, failed, ...) as JSON lines\n");
      return help ? 0 : 2;
    }
    const std::string v = argv[++i];
    if (a == "--metrics") {
      if (v.empty()) {
        std::fprintf(stderr, "fault_tolerant: --metrics '': expected a file name\n");
        return 2;
      }
      o.metrics = v;
      continue;
    }
    const long long lo = a == "--steps" ? 1 : 0;  // a step count; a rank, a step or milliseconds
    long long n = -1;
    std::size_t used = 0;
    try {
      if (!(a == "--lose-rank" && v == "none")) n = std::stoll(v, &used);
    } catch (const std::logic_error&) {
      used = 0;
    }
    if (!(a == "--lose-rank" && v == "none") && (used == 0 || used != v.size() || n < lo || n > 1'000'000'000)) {
      std::fprintf(stderr, "fault_tolerant: %s '%s': expected an integer from %lld%s\n", a.c_str(), v.c_str(), lo,
                   a == "--lose-rank" ? ", or none" : "");
      return 2;
    }
    if (a == "--steps") o.steps = n;
    if (a == "--lose-rank") o.lose_rank = static_cast<int>(n);
    if (a == "--at-step") o.at_step = n;
    if (a == "--step-ms") o.step_ms = static_cast<int>(n);
  }
  try {
    const auto launch = replica_launch_from_env();
    if (!launch) {
      std::fprintf(stderr, "fault_tolerant: start it with partrun --spares N (or --min-replicas M), e.g.\n"
                           "  build/tools/partrun/partrun --standalone --nproc-per-node 3 --spares 1 %s\n", argv[0]);
      return 2;
    }
    // Each quorum's group over Gloo, under a store prefix of its own; heartbeats on their own connection.
    std::optional<metrics_writer> metrics;
    if (!o.metrics.empty()) metrics.emplace(o.metrics);
    linear_model m;
    replica_group rg(launch->connect(), gloo_groups_by_id(launch->connect(), {.timeout = 10s}), m.io(),
                     {.replica = launch->replica,
                      .on_event = replica_event_sink(launch->replica, metrics ? &*metrics : nullptr, nullptr)});
    if (train(rg, m, o, launch->replica, [] { std::raise(SIGKILL); }).empty()) {
      std::printf("replica %d: the job finished without needing it\n", launch->replica);
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fault_tolerant: %s\n", e.what());
    return 1;
  }
}
