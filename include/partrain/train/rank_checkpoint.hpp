// partrain/train/rank_checkpoint.hpp: checkpoints of modes whose ranks hold different state:
// post-local SGD and DiLoCo between syncs (each rank its own parameters and optimizer state),
// PowerSGD (each rank its own error feedback). One file, written atomically by rank 0, holds one
// section per rank; a section is an ordinary checkpoint (train/checkpoint.hpp: that rank's
// parameters with names and shapes, then in the optimizer's place the mode's whole state, then
// the extra fields), so every check of a plain checkpoint applies to it. Every rank reads the
// file and restores its own section; the world size must be the one it was saved with.
//
// Layout: the frame of detail/framed_file.hpp (magic "PTRNRCKP", version, CRC-32, size) around
// u32 world size, then per rank its section's bytes (u64 length first).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <filesystem>
#include <span>
#include <string>
#include <vector>

#include <partrain/comm/process_group.hpp>
#include <partrain/core/error.hpp>
#include <partrain/core/memory_space.hpp>
#include <partrain/core/tensor_view.hpp>
#include <partrain/model/concepts.hpp>
#include <partrain/optim/state_io.hpp>
#include <partrain/train/checkpoint.hpp>
#include <partrain/train/detail/atomic_file.hpp>
#include <partrain/train/detail/framed_file.hpp>

namespace partrain::inline v0 {

inline constexpr std::array<char, 8> rank_checkpoint_magic{'P', 'T', 'R', 'N', 'R', 'C', 'K', 'P'};
inline constexpr std::uint32_t rank_checkpoint_version = 1;

// What a rank saves beside its parameters: anything with save_state and load_state (post_local_sgd,
// diloco, streaming_diloco, powersgd_state, an optimizer).
template <class S>
concept rank_state = requires(const S& cs, S& s, state_writer& w, state_reader& r) {
  cs.save_state(w);
  s.load_state(r);
};

namespace detail::rank_ckpt {

// checkpoint_bytes stores an optimizer's state; the mode's state (its inner optimizer included)
// takes that place. Loading checks that the state read all of its bytes.
template <class S>
struct state_slot {
  S* s;
  void step() noexcept {}
  void zero_grad() noexcept {}
  void save_state(state_writer& w) const { s->save_state(w); }
  void load_state(state_reader& r) {
    s->load_state(r);
    if (r.remaining() != 0) {
      throw checkpoint_error("the saved state has " + std::to_string(r.remaining()) +
                             " bytes more than this run's state reads (saved by another mode or model?)");
    }
  }
};

inline constexpr int gather_tag = 0x52434b;  // "RCK": the sections' sends to rank 0

// Every rank learns whether some rank failed (the highest failing rank, or -1), so all fail
// together instead of the healthy ones waiting for the failed one in a later collective.
[[nodiscard]] inline int failed_rank(process_group& g, bool failed) {
  std::array<std::int64_t, 1> f{failed ? g.rank() : -1};
  g.all_reduce(tensor_view<std::int64_t>(f), reduce_op::max).wait();
  return static_cast<int>(f[0]);
}

}  // namespace detail::rank_ckpt

// Collective: every rank's section goes to rank 0, which writes the file atomically (temporary
// file, fsync, rename); then every rank learns whether it worked.
template <model M, rank_state S>
void save_rank_checkpoint(process_group& g, const std::filesystem::path& path, M& m, const S& state,
                          const checkpoint_extra& extra = {}) {
  static_assert(detail::ckpt::check_checkpointable<M>());
  std::exception_ptr err;
  std::vector<std::byte> mine;
  try {
    mine = checkpoint_bytes(m, detail::rank_ckpt::state_slot<const S>{&state}, extra);
  } catch (...) {
    err = std::current_exception();
  }
  if (const int bad = detail::rank_ckpt::failed_rank(g, err != nullptr); bad >= 0) {
    if (err) std::rethrow_exception(err);
    throw checkpoint_error("rank checkpoint '" + path.string() + "': rank " + std::to_string(bad) +
                           " could not serialize its state (its own error says why)");
  }
  // The sections' sizes first, so rank 0 can post its receives.
  const auto world = static_cast<std::size_t>(g.size());
  std::vector<std::int64_t> sizes(world);
  std::array<std::int64_t, 1> my_size{static_cast<std::int64_t>(mine.size())};
  g.all_gather(tensor_view<const std::int64_t>(my_size.data(), 1), tensor_view<std::int64_t>(sizes)).wait();
  const auto as_u8 = [](std::vector<std::byte>& b) {
    return tensor_view<std::uint8_t>(reinterpret_cast<std::uint8_t*>(b.data()), b.size());
  };
  if (g.rank() != 0) {
    g.send(tensor_view<const std::uint8_t>(as_u8(mine)), 0, detail::rank_ckpt::gather_tag).wait();
  } else {
    try {
      state_writer w;
      w.put(static_cast<std::uint32_t>(world));
      w.put_bytes(mine);
      std::vector<std::byte> other;
      for (std::size_t r = 1; r < world; ++r) {
        other.resize(static_cast<std::size_t>(sizes[r]));
        g.recv(as_u8(other), static_cast<int>(r), detail::rank_ckpt::gather_tag).wait();
        w.put_bytes(other);
      }
      if (path.has_parent_path()) std::filesystem::create_directories(path.parent_path());
      detail::ckpt::write_file_atomically(path, detail::ckpt::frame(rank_checkpoint_magic, rank_checkpoint_version, w.bytes()));
    } catch (const communication_error&) {
      throw;  // the group is broken: the peers see it in their own operations
    } catch (...) {
      err = std::current_exception();
    }
  }
  if (const int bad = detail::rank_ckpt::failed_rank(g, err != nullptr); bad >= 0) {
    if (err) std::rethrow_exception(err);
    throw checkpoint_error("rank checkpoint '" + path.string() + "': rank 0 could not write it (its own error says why)");
  }
}

// Collective: every rank reads `path` and restores its parameters and state from its section;
// returns the extra fields. The parameters change only once the whole section parsed; if any
// rank fails, every rank throws.
template <model M, rank_state S>
checkpoint_extra load_rank_checkpoint(process_group& g, const std::filesystem::path& path, M& m, S& state) {
  static_assert(detail::ckpt::check_checkpointable<M>());
  std::exception_ptr err;
  checkpoint_extra extra;
  try {
    const std::string what = "rank checkpoint '" + path.string() + "'";
    const auto file = detail::ckpt::read_framed_file(path, "rank checkpoint");
    state_reader r(detail::ckpt::unframe(file, rank_checkpoint_magic, rank_checkpoint_version, what));
    const auto world = r.get<std::uint32_t>("world size");
    if (world != static_cast<std::uint32_t>(g.size())) {
      throw checkpoint_error(what + " was saved by " + std::to_string(world) + " ranks, this job has " +
                             std::to_string(g.size()) + " (each rank resumes its own state: expected the same world size)");
    }
    std::span<const std::byte> section;
    for (int k = 0; k <= g.rank(); ++k) section = r.get_bytes("section of rank " + std::to_string(k));
    detail::rank_ckpt::state_slot<S> slot{&state};
    extra = load_checkpoint_bytes(section, m, slot, what + " (section of rank " + std::to_string(g.rank()) + ")");
  } catch (...) {
    err = std::current_exception();
  }
  if (const int bad = detail::rank_ckpt::failed_rank(g, err != nullptr); bad >= 0) {
    if (err) std::rethrow_exception(err);
    throw checkpoint_error("rank checkpoint '" + path.string() + "': rank " + std::to_string(bad) +
                           " could not load its section (its own error says why)");
  }
  return extra;
}

}  // namespace partrain::inline v0
