// What replicas and the lighthouse say to each other through the job's store: the key names and
// each replica's heartbeat record. One home, so the two sides cannot drift apart.
#pragma once

#include <charconv>
#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include <partrain/comm/store.hpp>
#include <partrain/core/error.hpp>

namespace partrain::inline v0::detail::ft {

// Where a replica is. The lighthouse reads it with the heartbeat that carries it.
enum class replica_phase : int {
  joining = 0,  // waiting for a quorum that gives it a slot (a spare, a newcomer, a replacement);
                // `quorum` is the newest it had seen when it started waiting
  forming = 1,  // building quorum `quorum`'s group, healing
  member = 2,   // training in quorum `quorum`
  failed = 3,   // quorum `quorum`'s group failed under it; ready for the next quorum
  done = 4,     // finished the job
  dead = 5,     // gave up (an error it could not absorb); never counted again
};

// A heartbeat: a counter that moves every beat, the phase, the quorum it refers to, the step.
struct beat {
  std::int64_t counter = 0;
  replica_phase phase = replica_phase::joining;
  std::int64_t quorum = -1;
  std::int64_t step = 0;

  [[nodiscard]] std::string encode() const {
    return std::to_string(counter) + " " + std::to_string(static_cast<int>(phase)) + " " + std::to_string(quorum) +
           " " + std::to_string(step);
  }
  [[nodiscard]] static std::optional<beat> decode(std::string_view s) {
    beat b;
    int phase = 0;
    auto field = [&](auto& out) {
      while (!s.empty() && s.front() == ' ') s.remove_prefix(1);
      const auto r = std::from_chars(s.data(), s.data() + s.size(), out);
      if (r.ec != std::errc{}) return false;
      s.remove_prefix(static_cast<std::size_t>(r.ptr - s.data()));
      return true;
    };
    if (!field(b.counter) || !field(phase) || !field(b.quorum) || !field(b.step) || !s.empty()) return std::nullopt;
    if (phase < 0 || phase > 5) return std::nullopt;
    b.phase = static_cast<replica_phase>(phase);
    return b;
  }
};

[[nodiscard]] inline std::string beat_key(int replica) { return "ft/beat/" + std::to_string(replica); }
[[nodiscard]] inline std::string quorum_key(std::int64_t id) { return "ft/quorum/" + std::to_string(id); }
inline constexpr std::string_view latest_key = "ft/latest";      // the newest quorum's id, as text
inline constexpr std::string_view finished_key = "ft/finished";  // set once every member is done
inline constexpr std::string_view abandoned_key = "ft/abandoned";  // why no quorum can be formed any more
inline constexpr std::string_view lighthouse_key = "ft/lighthouse";  // a counter the lighthouse moves each tick

// A key's value as text when it exists, nullopt when not; never blocks on a missing key.
[[nodiscard]] inline std::optional<std::string> peek(store& s, const std::string& key) {
  if (!s.check({key})) return std::nullopt;
  return s.get_string(key, std::chrono::milliseconds(1000));
}

[[nodiscard]] inline std::int64_t latest_quorum(store& s) {
  const auto v = peek(s, std::string(latest_key));
  if (!v) return -1;
  std::int64_t id = -1;
  const auto r = std::from_chars(v->data(), v->data() + v->size(), id);
  if (r.ec != std::errc{} || r.ptr != v->data() + v->size()) {
    throw data_error("store key '" + std::string(latest_key) + "' holds '" + *v + "', expected a quorum number");
  }
  return id;
}

}  // namespace partrain::inline v0::detail::ft
