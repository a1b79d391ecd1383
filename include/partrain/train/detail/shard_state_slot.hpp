// partrain/train/detail/shard_state_slot.hpp: a sharded mode's state in the places of an ordinary
// checkpoint or of a rank checkpoint's section. shard_state_slot: a sharded optimizer's state
// (shard_optimizer_state: its kind, step count and arrays) in the optimizer's place; deterministic
// ZeRO saves the whole state there (every slice gathered), ZeRO and FSDP over a tensor-parallel
// mesh each rank's own slice. shard_values_model: an FSDP rank's parameter shard in the model's
// place, as one parameter.
#pragma once

#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include <partrain/core/error.hpp>
#include <partrain/core/tensor_view.hpp>
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

// A fully sharded model holds no whole parameter between steps: a rank's section holds its
// shard's values (over its flat segments, end to end) as one parameter named "fsdp shard", whose
// shape is the shard's length (a mesh of another layout fails the shape check by name).
struct shard_values_model {
  struct param {
    std::vector<float>* v;
    [[nodiscard]] std::string name() const { return "fsdp shard"; }
    [[nodiscard]] tensor_view<float> value() const { return tensor_view<float>(v->data(), shape{v->size()}); }
    [[nodiscard]] tensor_view<float> grad() const { return {}; }
  };
  std::vector<param> params;
  [[nodiscard]] std::vector<param>& parameters() noexcept { return params; }
};

}  // namespace partrain::inline v0::detail::ckpt
