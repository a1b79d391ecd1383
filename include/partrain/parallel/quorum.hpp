// partrain/parallel/quorum.hpp: who trains in the next step when replicas can die and join: the
// quorum rule of fault-tolerant data parallelism (torchft's lighthouse rule, with its two world
// size modes), as a pure function the lighthouse (lighthouse.hpp) applies and the tests check.
#pragma once

#include <algorithm>
#include <charconv>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <partrain/core/error.hpp>

namespace partrain::inline v0 {

enum class world_size_mode {
  // The job's logical ranks ("slots") keep their data shards; a spare takes a lost member's slot,
  // so every step sums the same gradients in the same order as a run without failures.
  fixed_with_spares,
  // Every healthy replica trains; the gradient averages over the members present.
  dynamic,
};

struct quorum_policy {
  world_size_mode mode = world_size_mode::fixed_with_spares;
  int slots = 1;         // fixed_with_spares: the logical ranks every quorum fills
  int min_replicas = 1;  // dynamic: the fewest members a quorum may have
};

// One membership. members[k] is the replica in slot (group rank) k; spares wait outside.
struct quorum {
  std::int64_t id = -1;  // -1: none yet
  std::vector<int> members{};
  std::vector<int> spares{};

  [[nodiscard]] int slot_of(int replica) const noexcept {
    const auto it = std::ranges::find(members, replica);
    return it == members.end() ? -1 : static_cast<int>(it - members.begin());
  }
  [[nodiscard]] bool operator==(const quorum&) const = default;

  // "id;m0,m1,...;s0,s1,..." (the store holds quorums as this text).
  [[nodiscard]] std::string encode() const {
    auto list = [](const std::vector<int>& v) {
      std::string s;
      for (std::size_t i = 0; i < v.size(); ++i) {
        if (i) s += ',';
        s += std::to_string(v[i]);
      }
      return s;
    };
    return std::to_string(id) + ";" + list(members) + ";" + list(spares);
  }
  [[nodiscard]] static quorum decode(std::string_view text) {
    auto bad = [&] { return data_error("quorum '" + std::string(text) + "': expected 'id;members;spares'"); };
    auto number = [&](std::string_view s, auto& out) {
      const auto r = std::from_chars(s.data(), s.data() + s.size(), out);
      if (r.ec != std::errc{} || r.ptr != s.data() + s.size()) throw bad();
    };
    auto list = [&](std::string_view s) {
      std::vector<int> v;
      while (!s.empty()) {
        const auto comma = s.find(',');
        int x = 0;
        number(s.substr(0, comma), x);
        v.push_back(x);
        s = comma == std::string_view::npos ? std::string_view{} : s.substr(comma + 1);
      }
      return v;
    };
    const auto a = text.find(';');
    const auto b = a == std::string_view::npos ? a : text.find(';', a + 1);
    if (b == std::string_view::npos) throw bad();
    quorum q;
    number(text.substr(0, a), q.id);
    q.members = list(text.substr(a + 1, b - a - 1));
    q.spares = list(text.substr(b + 1));
    return q;
  }
};

// The next quorum after `previous`, from the replicas that are alive and ready to take part
// (`ready`, any order) out of `heartbeating` live replicas; nullopt while the policy cannot be met.
//   fixed_with_spares: every member of `previous` still ready keeps its slot; an empty slot takes
//     the lowest-numbered ready replica outside it (so replica r has slot r when all start);
//     the other ready replicas are spares. Every slot must be filled.
//   dynamic: the members still ready keep their order, joiners follow by number; at least
//     min_replicas.
// Both: the quorum (spares included) must hold more than half of the heartbeating replicas, so
// two halves of a partitioned job can never both train.
[[nodiscard]] inline std::optional<quorum> compute_quorum(const quorum& previous, std::span<const int> ready,
                                                          int heartbeating, const quorum_policy& policy) {
  std::vector<int> pool(ready.begin(), ready.end());
  std::ranges::sort(pool);
  pool.erase(std::ranges::unique(pool).begin(), pool.end());
  auto is_ready = [&](int r) { return std::ranges::binary_search(pool, r); };
  quorum next;
  next.id = previous.id + 1;
  std::vector<int> joiners;
  for (int r : pool)
    if (previous.slot_of(r) < 0) joiners.push_back(r);
  if (policy.mode == world_size_mode::fixed_with_spares) {
    if (policy.slots < 1) throw invalid_argument_error("quorum_policy: slots is " + std::to_string(policy.slots) + ", expected >= 1");
    next.members.assign(static_cast<std::size_t>(policy.slots), -1);
    for (std::size_t k = 0; k < previous.members.size() && k < next.members.size(); ++k)
      if (is_ready(previous.members[k])) next.members[k] = previous.members[k];
    auto j = joiners.begin();
    for (int& m : next.members) {
      if (m >= 0) continue;
      if (j == joiners.end()) return std::nullopt;
      m = *j++;
    }
    next.spares.assign(j, joiners.end());
  } else {
    for (int m : previous.members)
      if (is_ready(m)) next.members.push_back(m);
    next.members.insert(next.members.end(), joiners.begin(), joiners.end());
    if (static_cast<int>(next.members.size()) < std::max(1, policy.min_replicas)) return std::nullopt;
  }
  const auto size = next.members.size() + next.spares.size();
  if (2 * size <= static_cast<std::size_t>(heartbeating)) return std::nullopt;
  return next;
}

}  // namespace partrain::inline v0
