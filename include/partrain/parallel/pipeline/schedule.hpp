// partrain/parallel/pipeline/schedule.hpp: a pipeline schedule as data. For each rank, the
// ordered list of forward (F) and backward (B) actions on (micro-batch, local chunk). The
// generators (GPipe, 1F1B, interleaved 1F1B) and a user's own orders all go through the same
// validation: every action exactly once per stage, and a dependency replay that refuses an
// order which would deadlock (with the ranks and actions that would wait forever) instead of
// hanging at run time. simulate() replays an order with given costs: makespan, bubble and
// peak in-flight activations, the figures the benchmark compares with theory.
#pragma once

#include <algorithm>
#include <cctype>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <ostream>
#include <span>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include <partrain/core/error.hpp>

namespace partrain::inline v0 {

enum class pipeline_op : std::uint8_t { forward, backward };

// One unit of work on a rank: F or B of a micro-batch on one of the rank's chunks. With v
// virtual stages per rank, chunk c of rank r is global stage c * p + r (Megatron's "loop").
struct pipeline_action {
  pipeline_op op = pipeline_op::forward;
  int micro_batch = 0;
  int chunk = 0;
  friend bool operator==(const pipeline_action&, const pipeline_action&) = default;
};

[[nodiscard]] inline pipeline_action fwd(int mb, int chunk = 0) noexcept { return {pipeline_op::forward, mb, chunk}; }
[[nodiscard]] inline pipeline_action bwd(int mb, int chunk = 0) noexcept { return {pipeline_op::backward, mb, chunk}; }

// What a replay of a schedule measured (costs in the caller's unit).
struct schedule_stats {
  double makespan = 0;
  double ideal = 0;            // one stage's work for the whole batch: m * (t_f + t_b)
  double bubble_fraction = 0;  // (makespan - ideal) / makespan, the GPipe convention
  // Per rank, the most (micro-batch, chunk) activations alive at once (F done, B not yet).
  std::vector<int> peak_in_flight;
};

class pipeline_schedule {
 public:
  // Validates: sizes, ranges, every F and B exactly once per chunk, and a deadlock-free order.
  pipeline_schedule(std::string name, int stages, int micro_batches, int virtual_stages,
                    std::vector<std::vector<pipeline_action>> orders)
      : name_(std::move(name)), p_(stages), m_(micro_batches), v_(virtual_stages), orders_(std::move(orders)) {
    validate();
  }

  [[nodiscard]] const std::string& name() const noexcept { return name_; }
  [[nodiscard]] int stages() const noexcept { return p_; }
  [[nodiscard]] int micro_batches() const noexcept { return m_; }
  [[nodiscard]] int virtual_stages() const noexcept { return v_; }
  [[nodiscard]] int global_stages() const noexcept { return p_ * v_; }
  [[nodiscard]] int global_stage(int rank, int chunk) const noexcept { return chunk * p_ + rank; }
  [[nodiscard]] std::span<const pipeline_action> order(int rank) const {
    return orders_.at(static_cast<std::size_t>(rank));
  }

  // "F3" or, with virtual stages, "F3.s4" (global stage 4).
  [[nodiscard]] std::string to_string(int rank, const pipeline_action& a) const {
    std::string s = (a.op == pipeline_op::forward ? "F" : "B") + std::to_string(a.micro_batch);
    if (v_ > 1) s += ".s" + std::to_string(global_stage(rank, a.chunk));
    return s;
  }
  [[nodiscard]] std::string to_string(int rank) const {
    std::string s;
    for (const auto& a : order(rank)) s += (s.empty() ? "" : " ") + to_string(rank, a);
    return s;
  }
  // The whole table, one line per rank: "stage 0: F0 F1 B0 B1".
  [[nodiscard]] std::string to_string() const {
    std::string s = name_ + " (stages " + std::to_string(p_) + ", micro-batches " + std::to_string(m_) +
                    (v_ > 1 ? ", virtual stages " + std::to_string(v_) : "") + ")\n";
    for (int r = 0; r < p_; ++r) s += "stage " + std::to_string(r) + ": " + to_string(r) + "\n";
    return s;
  }
  friend std::ostream& operator<<(std::ostream& os, const pipeline_schedule& s) { return os << s.to_string(); }

  // Replays the order with every global stage taking t_forward / v and t_backward / v per
  // micro-batch (a chunk is 1/v of a rank's layers) and free communication.
  [[nodiscard]] schedule_stats simulate(double t_forward = 1.0, double t_backward = 2.0) const {
    return replay(t_forward / v_, t_backward / v_);
  }

 private:
  [[noreturn]] void fail(const std::string& what) const {
    throw invalid_argument_error("pipeline schedule '" + name_ + "': " + what);
  }

  void validate() const {
    if (p_ < 1) fail("stages must be at least 1, got " + std::to_string(p_));
    if (m_ < 1) fail("micro-batches must be at least 1, got " + std::to_string(m_));
    if (v_ < 1) fail("virtual stages must be at least 1, got " + std::to_string(v_));
    if (orders_.size() != static_cast<std::size_t>(p_)) {
      fail("has orders for " + std::to_string(orders_.size()) + " stages, expected " + std::to_string(p_));
    }
    for (int r = 0; r < p_; ++r) {
      // seen[op][chunk][mb]
      std::vector<int> seen(static_cast<std::size_t>(2 * v_ * m_), 0);
      for (const auto& a : order(r)) {
        if (a.micro_batch < 0 || a.micro_batch >= m_) {
          fail("stage " + std::to_string(r) + " has an action on micro-batch " + std::to_string(a.micro_batch) +
               " (expected 0 <= micro-batch < " + std::to_string(m_) + ")");
        }
        if (a.chunk < 0 || a.chunk >= v_) {
          fail("stage " + std::to_string(r) + " has an action on chunk " + std::to_string(a.chunk) +
               " (expected 0 <= chunk < " + std::to_string(v_) + ")");
        }
        auto& n = seen[index(a)];
        if (++n == 2) fail("stage " + std::to_string(r) + " runs " + to_string(r, a) + " twice (expected exactly once)");
        if (a.op == pipeline_op::backward && seen[index(fwd(a.micro_batch, a.chunk))] == 0) {
          fail("stage " + std::to_string(r) + " runs " + to_string(r, a) + " before its forward " +
               to_string(r, fwd(a.micro_batch, a.chunk)));
        }
      }
      for (int c = 0; c < v_; ++c) {
        for (int i = 0; i < m_; ++i) {
          for (auto a : {fwd(i, c), bwd(i, c)}) {
            if (seen[index(a)] == 0) fail("stage " + std::to_string(r) + " never runs " + to_string(r, a));
          }
        }
      }
    }
    (void)replay(1.0, 1.0);  // throws on an order that deadlocks
  }

  [[nodiscard]] std::size_t index(const pipeline_action& a) const noexcept {
    return (static_cast<std::size_t>(a.op == pipeline_op::backward) * static_cast<std::size_t>(v_) +
            static_cast<std::size_t>(a.chunk)) * static_cast<std::size_t>(m_) +
           static_cast<std::size_t>(a.micro_batch);
  }

  // Every rank runs its order; an action starts when the rank is free and its input exists:
  // F on global stage g needs F(g-1) of the same micro-batch, B on g needs B(g+1) (the last
  // stage's B needs only its own F, which the order check above already placed earlier).
  [[nodiscard]] schedule_stats replay(double tf, double tb) const {
    const int G = global_stages();
    constexpr double never = -1;
    auto at = [&](int g, int mb) { return static_cast<std::size_t>(g) * static_cast<std::size_t>(m_) + static_cast<std::size_t>(mb); };
    std::vector<double> f_done(static_cast<std::size_t>(G * m_), never), b_done(f_done.size(), never);
    std::vector<std::size_t> next(static_cast<std::size_t>(p_), 0);
    std::vector<double> free_at(static_cast<std::size_t>(p_), 0.0);
    std::vector<int> live(static_cast<std::size_t>(p_), 0);
    schedule_stats st;
    st.peak_in_flight.assign(static_cast<std::size_t>(p_), 0);
    std::size_t remaining = 0;
    for (const auto& o : orders_) remaining += o.size();
    while (remaining > 0) {
      bool progress = false;
      for (int r = 0; r < p_; ++r) {
        const auto ru = static_cast<std::size_t>(r);
        while (next[ru] < orders_[ru].size()) {
          const auto& a = orders_[ru][next[ru]];
          const int g = global_stage(r, a.chunk);
          double ready = 0;
          if (a.op == pipeline_op::forward) {
            if (g > 0 && (ready = f_done[at(g - 1, a.micro_batch)]) == never) break;
          } else if (g < G - 1) {
            if ((ready = b_done[at(g + 1, a.micro_batch)]) == never) break;
          }
          const double start = std::max(ready, free_at[ru]);
          free_at[ru] = start + (a.op == pipeline_op::forward ? tf : tb);
          if (a.op == pipeline_op::forward) {
            f_done[at(g, a.micro_batch)] = free_at[ru];
            st.peak_in_flight[ru] = std::max(st.peak_in_flight[ru], ++live[ru]);
          } else {
            b_done[at(g, a.micro_batch)] = free_at[ru];
            --live[ru];
          }
          ++next[ru];
          --remaining;
          progress = true;
        }
      }
      if (!progress) {
        std::string stuck;
        for (int r = 0; r < p_; ++r) {
          const auto ru = static_cast<std::size_t>(r);
          if (next[ru] == orders_[ru].size()) continue;
          const auto& a = orders_[ru][next[ru]];
          const int g = global_stage(r, a.chunk);
          const bool f = a.op == pipeline_op::forward;
          const int dep_g = f ? g - 1 : g + 1;
          stuck += "\n  stage " + std::to_string(r) + " waits at " + to_string(r, a) + " for " + (f ? "F" : "B") +
                   std::to_string(a.micro_batch) + " of global stage " + std::to_string(dep_g) + " (stage " +
                   std::to_string(dep_g % p_) + ")";
        }
        fail("the order deadlocks: no stage can make progress" + stuck);
      }
    }
    for (double t : free_at) st.makespan = std::max(st.makespan, t);
    st.ideal = static_cast<double>(m_) * static_cast<double>(v_) * (tf + tb);
    st.bubble_fraction = st.makespan > 0 ? (st.makespan - st.ideal) / st.makespan : 0.0;
    return st;
  }

  std::string name_;
  int p_, m_, v_;
  std::vector<std::vector<pipeline_action>> orders_;
};

namespace detail::pipeline {
inline void check_schedule_args(const char* who, int p, int m, int v = 1) {
  if (p < 1) throw invalid_argument_error(std::string(who) + ": stages must be at least 1, got " + std::to_string(p));
  if (m < 1) throw invalid_argument_error(std::string(who) + ": micro-batches must be at least 1, got " + std::to_string(m));
  if (v < 1) throw invalid_argument_error(std::string(who) + ": virtual stages must be at least 1, got " + std::to_string(v));
}
}  // namespace detail::pipeline

// GPipe (fill-drain): every stage runs F0..F(m-1), then B0..B(m-1). Holds all m micro-batches.
[[nodiscard]] inline pipeline_schedule make_gpipe_schedule(int p, int m) {
  detail::pipeline::check_schedule_args("make_gpipe_schedule", p, m);
  std::vector<std::vector<pipeline_action>> o(static_cast<std::size_t>(p));
  for (auto& s : o) {
    for (int i = 0; i < m; ++i) s.push_back(fwd(i));
    for (int i = 0; i < m; ++i) s.push_back(bwd(i));
  }
  return {"gpipe", p, m, 1, std::move(o)};
}

// 1F1B / PipeDream-Flush (Megatron's rule): stage s warms up with w = min(p-s-1, m) forwards,
// then alternates F(w+k), B(k), then drains the last w backwards. Holds min(p-s, m).
[[nodiscard]] inline pipeline_schedule make_1f1b_schedule(int p, int m) {
  detail::pipeline::check_schedule_args("make_1f1b_schedule", p, m);
  std::vector<std::vector<pipeline_action>> o(static_cast<std::size_t>(p));
  for (int s = 0; s < p; ++s) {
    auto& ord = o[static_cast<std::size_t>(s)];
    const int w = std::min(p - s - 1, m);
    for (int i = 0; i < w; ++i) ord.push_back(fwd(i));
    for (int k = 0; k < m - w; ++k) {
      ord.push_back(fwd(w + k));
      ord.push_back(bwd(k));
    }
    for (int k = m - w; k < m; ++k) ord.push_back(bwd(k));
  }
  return {"1f1b", p, m, 1, std::move(o)};
}

// Interleaved 1F1B with v chunks per rank (Megatron's ordering). Micro-batches go in groups of
// p: group on chunk 0, the same group on chunk 1, ...; forward k uses table[k], backward k the
// same micro-batch on chunk v-1-table[k].chunk. Rank r warms up with 2(p-r-1) + (v-1)p forwards.
// The bubble shrinks by v at the price of v times the point-to-point messages.
[[nodiscard]] inline pipeline_schedule make_interleaved_1f1b_schedule(int p, int m, int v) {
  detail::pipeline::check_schedule_args("make_interleaved_1f1b_schedule", p, m, v);
  if (v == 1) {
    auto s = make_1f1b_schedule(p, m);
    return {"interleaved-1f1b", p, m, 1, [&] {
              std::vector<std::vector<pipeline_action>> o;
              for (int r = 0; r < p; ++r) o.emplace_back(s.order(r).begin(), s.order(r).end());
              return o;
            }()};
  }
  if (m % p != 0) {
    throw invalid_argument_error("make_interleaved_1f1b_schedule: micro-batches (" + std::to_string(m) +
                                 ") must be a multiple of the stages (" + std::to_string(p) +
                                 ") for the interleaved schedule (Megatron's grouping of p micro-batches)");
  }
  std::vector<pipeline_action> table;  // (micro-batch, chunk) of forward k
  for (int first = 0; first < m; first += p) {
    for (int c = 0; c < v; ++c) {
      for (int i = first; i < std::min(first + p, m); ++i) table.push_back(fwd(i, c));
    }
  }
  const int total = m * v;
  std::vector<std::vector<pipeline_action>> o(static_cast<std::size_t>(p));
  for (int r = 0; r < p; ++r) {
    auto& ord = o[static_cast<std::size_t>(r)];
    auto backward_k = [&](int k) {
      const auto& t = table[static_cast<std::size_t>(k)];
      return bwd(t.micro_batch, v - 1 - t.chunk);
    };
    const int w = std::min(2 * (p - r - 1) + (v - 1) * p, total);
    for (int k = 0; k < w; ++k) ord.push_back(table[static_cast<std::size_t>(k)]);
    for (int k = 0; k < total - w; ++k) {
      ord.push_back(table[static_cast<std::size_t>(w + k)]);
      ord.push_back(backward_k(k));
    }
    for (int k = total - w; k < total; ++k) ord.push_back(backward_k(k));
  }
  return {"interleaved-1f1b", p, m, v, std::move(o)};
}

// A user's own order, one line per stage of space-separated actions: "F0 F1 B0 B1", with
// ".sG" naming the global stage when v > 1 ("F0.s4"). Validated like the generated ones.
[[nodiscard]] inline pipeline_schedule parse_schedule(std::string name, int p, int m, int v, std::string_view text) {
  detail::pipeline::check_schedule_args("parse_schedule", p, m, v);
  std::vector<std::vector<pipeline_action>> o;
  std::istringstream lines{std::string(text)};
  std::string line;
  while (std::getline(lines, line)) {
    if (auto colon = line.find(':'); colon != std::string::npos) line = line.substr(colon + 1);
    std::istringstream words(line);
    std::vector<pipeline_action> ord;
    std::string w;
    const int r = static_cast<int>(o.size());
    while (words >> w) {
      auto bad = [&] {
        return invalid_argument_error("parse_schedule '" + name + "': stage " + std::to_string(r) + ": cannot read '" +
                                      w + "' (expected F<micro-batch> or B<micro-batch>, with .s<global stage> when "
                                      "virtual stages > 1)");
      };
      if (w.size() < 2 || (w[0] != 'F' && w[0] != 'B')) throw bad();
      std::size_t used = 0;
      int mb = 0, chunk = 0;
      try {
        mb = std::stoi(w.substr(1), &used);
        if (1 + used != w.size()) {
          if (w.compare(1 + used, 2, ".s") != 0) throw bad();
          std::size_t used2 = 0;
          const int g = std::stoi(w.substr(3 + used), &used2);
          if (3 + used + used2 != w.size() || g % p != r) throw bad();
          chunk = g / p;
        }
      } catch (const std::logic_error&) {
        throw bad();
      }
      ord.push_back({w[0] == 'F' ? pipeline_op::forward : pipeline_op::backward, mb, chunk});
    }
    if (!ord.empty() || line.find_first_not_of(" \t\r") != std::string::npos) o.push_back(std::move(ord));
  }
  return {std::move(name), p, m, v, std::move(o)};
}

}  // namespace partrain::inline v0
