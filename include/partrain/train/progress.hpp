// partrain/train/progress.hpp: the progress line of a training run, printed by rank 0:
// epoch, step, loss, samples/s of the whole job, ETA. On a terminal it is one live line redrawn
// in place ('\r', at most 10 times a second, one finished line kept per epoch); otherwise
// (a log file, a pipe, a batch job) it prints plain key=value lines now and then, so logs stay
// clean and grep-able:
//   progress rank=0 epoch=1/3 step=100/468 loss=0.61234 samples/s=10234.5 eta=0:01:23
// Other ranks print nothing unless all_ranks is set.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <iostream>
#include <ostream>
#include <string>

#include <unistd.h>

namespace partrain::inline v0 {

enum class progress_mode { automatic, terminal, plain };

struct progress_options {
  std::ostream* out = nullptr;  // std::cerr when null
  int terminal_fd = STDERR_FILENO;  // automatic mode: a terminal when isatty(terminal_fd)
  progress_mode mode = progress_mode::automatic;
  bool all_ranks = false;            // ranks other than 0 print too
  std::int64_t epochs = 0;           // 0: unknown (no ETA)
  std::int64_t steps_per_epoch = 0;  // 0: unknown (no ETA)
  // samples/s of the whole job = this rank's samples x world_size (ranks take equal batches,
  // which the distributed sampler guarantees), so no collective is needed per step.
  int world_size = 1;
  std::chrono::milliseconds plain_interval{10'000};     // plain: a line at most this often (0: off)
  std::int64_t plain_every_steps = 0;                    // plain: and every N steps (0: off)
  std::chrono::milliseconds terminal_interval{100};     // terminal: redraw at most this often
  std::chrono::steady_clock::time_point (*now)() = &std::chrono::steady_clock::now;  // tests inject a clock
};

class progress {
 public:
  progress(int rank, progress_options opts = {}) : rank_(rank), opts_(opts) {
    if (!opts_.out) opts_.out = &std::cerr;
    if (opts_.world_size < 1) opts_.world_size = 1;
    terminal_ = opts_.mode == progress_mode::terminal ||
                (opts_.mode == progress_mode::automatic && ::isatty(opts_.terminal_fd) == 1);
    active_ = rank_ == 0 || opts_.all_ranks;
  }
  progress(const progress&) = delete;
  progress& operator=(const progress&) = delete;
  ~progress() { finish(); }

  [[nodiscard]] bool terminal() const noexcept { return terminal_; }
  [[nodiscard]] bool active() const noexcept { return active_; }

  // After each step. epoch and step are 0-based (step within the epoch) and printed 1-based;
  // samples: what this rank processed in the step.
  void update(std::int64_t epoch, std::int64_t step, double loss, std::int64_t samples) {
    if (!active_) return;
    const auto t = opts_.now();
    last_ = t;
    if (updates_++ == 0) {
      first_ = t;  // the reference point: rates count what happened after it
    } else {
      samples_ += samples * opts_.world_size;
    }
    const bool epoch_end = opts_.steps_per_epoch > 0 && step + 1 == opts_.steps_per_epoch;
    if (terminal_) {
      if (!epoch_end && updates_ > 1 && t - last_print_ < opts_.terminal_interval) return;
      last_print_ = t;
      *opts_.out << '\r' << format(epoch, step, loss, t) << "\x1b[K";
      if (epoch_end) *opts_.out << '\n';
      open_line_ = !epoch_end;
      opts_.out->flush();
      return;
    }
    const bool every = opts_.plain_every_steps > 0 && (step + 1) % opts_.plain_every_steps == 0;
    const bool timed = opts_.plain_interval.count() > 0 && t - last_print_ >= opts_.plain_interval;
    if (updates_ == 1 || every || timed || epoch_end) {
      last_print_ = t;
      *opts_.out << format(epoch, step, loss, t) << '\n';
      opts_.out->flush();
    }
  }

  // Ends a live line (the destructor does it too).
  void finish() {
    if (open_line_) {
      *opts_.out << '\n';
      opts_.out->flush();
      open_line_ = false;
    }
  }

  // Whole-job samples per second since the first update (0 before the second one).
  [[nodiscard]] double samples_per_second() const {
    const double s = std::chrono::duration<double>(last_ - first_).count();
    return s > 0 ? static_cast<double>(samples_) / s : 0.0;
  }

 private:
  [[nodiscard]] std::string format(std::int64_t epoch, std::int64_t step, double loss,
                                   std::chrono::steady_clock::time_point t) const {
    auto of = [](std::int64_t i, std::int64_t n) {
      return std::to_string(i + 1) + (n > 0 ? "/" + std::to_string(n) : std::string());
    };
    std::string line = "progress rank=" + std::to_string(rank_) + " epoch=" + of(epoch, opts_.epochs) +
                       " step=" + of(step, opts_.steps_per_epoch);
    char buf[64];
    std::snprintf(buf, sizeof buf, " loss=%.5g", loss);
    line += buf;
    const double rate = samples_per_second();
    if (rate > 0) {
      std::snprintf(buf, sizeof buf, " samples/s=%.1f", rate);
      line += buf;
    } else {
      line += " samples/s=-";
    }
    line += " eta=" + eta(epoch, step, t);
    return line;
  }

  std::string eta(std::int64_t epoch, std::int64_t step, std::chrono::steady_clock::time_point t) const {
    if (opts_.epochs <= 0 || opts_.steps_per_epoch <= 0 || updates_ < 2) return "-";
    const std::int64_t total = opts_.epochs * opts_.steps_per_epoch;
    const std::int64_t done = epoch * opts_.steps_per_epoch + step + 1;
    const double per_step = std::chrono::duration<double>(t - first_).count() / static_cast<double>(updates_ - 1);
    const auto left = static_cast<std::int64_t>(per_step * static_cast<double>(total > done ? total - done : 0) + 0.5);
    char buf[32];
    std::snprintf(buf, sizeof buf, "%lld:%02lld:%02lld", static_cast<long long>(left / 3600),
                  static_cast<long long>(left / 60 % 60), static_cast<long long>(left % 60));
    return buf;
  }

  int rank_;
  progress_options opts_;
  bool terminal_ = false;
  bool active_ = false;
  bool open_line_ = false;
  std::int64_t updates_ = 0;
  std::int64_t samples_ = 0;
  std::chrono::steady_clock::time_point first_{}, last_{}, last_print_{};
};

}  // namespace partrain::inline v0
