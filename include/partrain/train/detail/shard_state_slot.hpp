// partrain/train/detail/shard_state_slot.hpp: a sharded optimizer's state (shard_optimizer_state:
// its kind, step count and arrays) in the optimizer's place of an ordinary checkpoint or a rank
// checkpoint's section. Deterministic ZeRO saves the whole state there (every slice gathered);
// ZeRO over a tensor-parallel mesh saves each rank's own slice in its section.
#pragma once

#include <cstdint>
#include <cstring>
#include <span>
#include <string>

#include <partrain/core/error.hpp>
#include <partrain/optim/state_io.hpp>
#include <partrain/parallel/detail/zero_optimizer.hpp>

namespace partrain::inline v0::detail::ckpt {

struct shard_state_slot {
  shard_optimizer_state<float>* s;
  const char* mode;  // the mode whose state this is, for the error when another mode's state is read
  void step() noexcept {}
  void zero_grad() noexcept {}
  void save_state(state_writer& w) const {
    w.put_string(s->kind);
    w.put(s->steps);
    w.put(static_cast<std::uint64_t>(s->arrays.size()));
    for (const auto& a : s->arrays) w.put_array(std::span<const float>(a));
  }
  void load_state(state_reader& r) {
    // What another mode saved there (a replicated optimizer's per-parameter state) does not parse as this.
    const auto other = [this](const std::string& what) {
      return checkpoint_error(std::string("the checkpoint's optimizer state is not a ") + mode + " one (" + what +
                              "): was it saved by another mode? Resume it with the mode that saved it");
    };
    s->kind = r.get_string("optimizer kind");
    if (s->kind != "sgd" && s->kind != "adamw") throw other("kind '" + s->kind.substr(0, 16) + "'");
    s->steps = r.get<std::int64_t>("optimizer steps");
    const auto n = r.get<std::uint64_t>("optimizer state arrays");
    if (n > 2) throw other(std::to_string(n) + " arrays, expected at most 2");
    s->arrays.assign(static_cast<std::size_t>(n), {});
    for (auto& a : s->arrays) {
      const auto bytes = r.get_bytes("optimizer state array");
      if (bytes.size() % sizeof(float) != 0) throw checkpoint_error("an optimizer state array of " + std::to_string(bytes.size()) + " bytes");
      a.resize(bytes.size() / sizeof(float));
      std::memcpy(a.data(), bytes.data(), bytes.size());
    }
    if (r.remaining() != 0) throw other(std::to_string(r.remaining()) + " bytes more than it reads");
  }
};

}  // namespace partrain::inline v0::detail::ckpt
