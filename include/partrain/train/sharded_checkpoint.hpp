// partrain/train/sharded_checkpoint.hpp: checkpoints of a sharded_data_parallel (ZeRO-1/2) or a
// fully_sharded_data_parallel (ZeRO-3) without a trip through rank 0. Every rank writes its own
// shard file (its slices of the flat parameter space: its values and optimizer state, atomically,
// CRC'd); then rank 0 writes a small index at the checkpoint's path naming the shards, their
// slices and CRCs, the model's names and shapes and where training stood. Loading reads the index
// and the shards and works at any world size and across the two kinds: each rank takes the parts
// of every shard that overlap what it now holds (resharding). A replicated model and optimizer
// (plain DDP, or one process) load it too: the state of the whole flat space, cut per parameter;
// consolidate_sharded_checkpoint (and the partrain_consolidate tool) writes one ordinary
// checkpoint file from it (names and shapes are in the index, no model type needed).
//
// Files: <path> (index) and <path>.step-<S>.shard-<r>-of-<n>. Shards are named by step, so a
// crash while saving leaves the previous index and its shards intact; the shards of older saves
// are removed once the new index is in place.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <filesystem>
#include <optional>
#include <span>
#include <string>
#include <system_error>
#include <type_traits>
#include <utility>
#include <vector>

#include <partrain/comm/process_group.hpp>
#include <partrain/core/dtype.hpp>
#include <partrain/core/error.hpp>
#include <partrain/model/layer.hpp>
#include <partrain/model/traits.hpp>
#include <partrain/optim/adamw.hpp>
#include <partrain/optim/optimizer.hpp>
#include <partrain/optim/sgd.hpp>
#include <partrain/optim/state_io.hpp>
#include <partrain/parallel/detail/zero_layout.hpp>
#include <partrain/parallel/detail/zero_optimizer.hpp>
#include <partrain/train/checkpoint.hpp>
#include <partrain/train/detail/atomic_file.hpp>
#include <partrain/train/detail/framed_file.hpp>

namespace partrain::inline v0 {

inline constexpr const std::array<char, 8>& sharded_index_magic = sharded_checkpoint_magic;  // train/checkpoint.hpp
inline constexpr std::array<char, 8> shard_file_magic{'P', 'T', 'R', 'N', 'Z', 'S', 'H', 'D'};
// Version 2: a shard holds a list of slices (segments) of the flat space, not one (FSDP's rank
// owns a chunk of every layer). Version 3: the index ends with the model's buffers (rank 0's;
// they are replicated). Versions 1 and 2 are still read.
inline constexpr std::uint32_t sharded_checkpoint_version = 3;

namespace detail::zero_ckpt {

inline constexpr ckpt::frame_versions readable{1, sharded_checkpoint_version};
using zero::flat_range;

struct param_entry {
  std::string name;
  shape dims;
};

template <class M>
[[nodiscard]] std::vector<param_entry> param_entries(M& m) {
  std::vector<param_entry> out;
  std::size_t i = 0;
  for (auto&& p : m.parameters()) out.push_back({param_name(p, i++), p.value().shape()});
  return out;
}

// FNV-1a over every parameter's name and shape: "the same model" for a checkpoint.
[[nodiscard]] inline std::uint64_t fingerprint_of(const std::vector<param_entry>& entries) {
  std::uint64_t h = 0xcbf29ce484222325ull;
  const auto mix = [&h](std::uint64_t x) {
    for (int b = 0; b < 8; ++b) h = (h ^ ((x >> (8 * b)) & 0xffu)) * 0x100000001b3ull;
  };
  for (const auto& e : entries) {
    for (const char c : e.name) mix(static_cast<unsigned char>(c));
    mix(e.dims.rank());
    for (std::size_t d = 0; d < e.dims.rank(); ++d) mix(e.dims[d]);
  }
  return h;
}

[[nodiscard]] inline std::uint64_t total_of(const std::vector<param_entry>& entries) {
  std::uint64_t n = 0;
  for (const auto& e : entries) n += e.dims.numel();
  return n;
}

template <class M>
[[nodiscard]] zero::flat_views<model_element_t<M>> value_views(M& m) {
  std::vector<tensor_view<model_element_t<M>>> v;
  for (auto&& p : m.parameters()) v.push_back(p.value());
  return zero::flat_views<model_element_t<M>>(std::move(v));
}

[[nodiscard]] inline std::filesystem::path shard_path(const std::filesystem::path& index, std::uint64_t step, int rank,
                                                      int world) {
  return index.parent_path() / (index.filename().string() + ".step-" + std::to_string(step) + ".shard-" +
                                std::to_string(rank) + "-of-" + std::to_string(world));
}

[[nodiscard]] inline std::uint64_t elements_of(const std::vector<flat_range>& segments) {
  std::uint64_t n = 0;
  for (const auto& s : segments) n += s.size();
  return n;
}

struct shard_entry {
  std::string file;  // relative to the index's folder
  std::vector<flat_range> segments;
  std::uint32_t crc = 0;
};

struct index_record {
  std::uint8_t type = 0;
  std::uint64_t total = 0, params = 0, fingerprint = 0, world = 0, step = 0;
  std::string optimizer;
  std::vector<shard_entry> shards;
  checkpoint_extra extra;
  std::vector<param_entry> names;  // every parameter's name and shape (what consolidation writes)
  std::vector<std::byte> buffers;  // the model's buffers (train/checkpoint.hpp's buffer_bytes)
};

inline void put_segments(state_writer& w, const std::vector<flat_range>& segments) {
  w.put(static_cast<std::uint64_t>(segments.size()));
  for (const auto& s : segments) {
    w.put(static_cast<std::uint64_t>(s.begin));
    w.put(static_cast<std::uint64_t>(s.end));
  }
}
// Version 1 wrote one slice (begin, end); version 2 a count and that many.
[[nodiscard]] inline std::vector<flat_range> get_segments(state_reader& r, std::uint32_t version, std::uint64_t total,
                                                          const std::string& where) {
  const std::uint64_t n = version == 1 ? 1 : r.get<std::uint64_t>("segment count");
  if (n > total + 1) throw checkpoint_error(where + " is malformed: " + std::to_string(n) + " segments");
  std::vector<flat_range> out;
  for (std::uint64_t i = 0; i < n; ++i) {
    const auto b = r.get<std::uint64_t>("segment begin");
    const auto e = r.get<std::uint64_t>("segment end");
    if (b > e || e > total) {
      throw checkpoint_error(where + " is malformed: a segment covers [" + std::to_string(b) + ", " + std::to_string(e) +
                             ") of " + std::to_string(total) + " elements");
    }
    out.push_back({static_cast<std::size_t>(b), static_cast<std::size_t>(e)});
  }
  return out;
}

[[nodiscard]] inline std::vector<std::byte> encode(const index_record& x) {
  state_writer w;
  w.put(x.type);
  w.put(x.total);
  w.put(x.params);
  w.put(x.fingerprint);
  w.put(x.world);
  w.put(x.step);
  w.put_string(x.optimizer);
  for (const auto& s : x.shards) {
    w.put_string(s.file);
    put_segments(w, s.segments);
    w.put(s.crc);
  }
  ckpt::put_extra(w, x.extra);
  for (const auto& e : x.names) {
    w.put_string(e.name);
    w.put(static_cast<std::uint8_t>(e.dims.rank()));
    for (std::size_t d = 0; d < e.dims.rank(); ++d) w.put(static_cast<std::uint64_t>(e.dims[d]));
  }
  w.put_bytes(x.buffers);
  return w.release();
}
[[nodiscard]] inline index_record decode_index(std::span<const std::byte> payload, std::uint32_t version,
                                               const std::string& where) {
  state_reader r(payload, where);
  index_record x;
  x.type = r.get<std::uint8_t>("dtype");
  x.total = r.get<std::uint64_t>("element count");
  x.params = r.get<std::uint64_t>("parameter count");
  x.fingerprint = r.get<std::uint64_t>("model fingerprint");
  x.world = r.get<std::uint64_t>("world size");
  x.step = r.get<std::uint64_t>("save step");
  x.optimizer = r.get_string("optimizer kind");
  if (x.world == 0 || x.world > (1u << 20)) throw checkpoint_error(where + " is malformed: world size " + std::to_string(x.world));
  for (std::uint64_t q = 0; q < x.world; ++q) {
    shard_entry s;
    s.file = r.get_string("shard file");
    s.segments = get_segments(r, version, x.total, where);
    s.crc = r.get<std::uint32_t>("shard crc");
    x.shards.push_back(std::move(s));
  }
  x.extra = ckpt::get_extra(r);
  if (x.params > (1u << 24)) throw checkpoint_error(where + " is malformed: " + std::to_string(x.params) + " parameters");
  for (std::uint64_t i = 0; i < x.params; ++i) {
    param_entry e;
    e.name = r.get_string("parameter name");
    const auto rank = r.get<std::uint8_t>("parameter rank");
    if (rank > max_rank) throw checkpoint_error(where + " is malformed: parameter " + e.name + " has rank " + std::to_string(rank));
    std::array<std::size_t, max_rank> dims{};
    for (std::size_t d = 0; d < rank; ++d) dims[d] = static_cast<std::size_t>(r.get<std::uint64_t>("parameter extent"));
    e.dims = shape(std::span<const std::size_t>(dims.data(), rank));
    x.names.push_back(std::move(e));
  }
  if (version >= 3) {
    const auto b = r.get_bytes("buffers");
    x.buffers.assign(b.begin(), b.end());
  }
  if (r.remaining() != 0) throw checkpoint_error(where + " is malformed: " + std::to_string(r.remaining()) + " unread bytes");
  return x;
}

[[nodiscard]] inline index_record read_index(const std::filesystem::path& index, const std::string& where) {
  const auto file = detail::ckpt::read_framed_file(index, "sharded checkpoint index");
  std::uint32_t version = 0;
  const auto payload = ckpt::unframe(file, sharded_index_magic, readable, where, nullptr, &version);
  return decode_index(payload, version, where);
}

// Copies the part of `src` (the elements of flat [seg.begin, seg.end)) that lies in each of the
// ranges `want` into `dst`, where the wanted ranges are laid end to end.
template <class T>
void copy_overlap(flat_range seg, const T* src, const std::vector<flat_range>& want, T* dst) {
  std::size_t at = 0;
  for (const auto& w : want) {
    const std::size_t lo = std::max(seg.begin, w.begin), hi = std::min(seg.end, w.end);
    if (lo < hi) std::copy(src + (lo - seg.begin), src + (hi - seg.begin), dst + at + (lo - w.begin));
    at += w.size();
  }
}

// The replicated optimizer's own state layout (optim/sgd.hpp, optim/adamw.hpp), cut per parameter
// from the flat state of the whole space.
template <class T>
void put_replicated_state(state_writer& w, const shard_optimizer_state<T>& st, const std::vector<std::size_t>& sizes) {
  const auto& a = st.arrays;
  std::size_t at = 0;
  if (st.kind == "sgd") {
    optim::put_sgd_state_header(w, st.steps, sizes.size());
    for (const auto n : sizes) {
      optim::put_sgd_state_entry(w, !a.empty(), a.empty() ? std::span<const T>() : std::span<const T>(a[0]).subspan(at, n));
      at += n;
    }
  } else {
    optim::put_adamw_state_header(w, st.steps, sizes.size());
    if (a.size() != 2) return;
    for (const auto n : sizes) {
      optim::put_adamw_state_entry(w, std::span<const T>(a[0]).subspan(at, n), std::span<const T>(a[1]).subspan(at, n));
      at += n;
    }
  }
}

// A model made of the index's names and shapes (what consolidation hands checkpoint_bytes).
template <class T>
struct flat_model {
  struct param {
    flat_model* m;
    std::size_t i;
    [[nodiscard]] tensor_view<T> value() const { return {m->values.data() + m->starts[i], m->entries[i].dims}; }
    [[nodiscard]] tensor_view<T> grad() const { return value(); }
    [[nodiscard]] const std::string& name() const { return m->entries[i].name; }
  };
  explicit flat_model(std::vector<param_entry> e) : entries(std::move(e)) {
    std::size_t at = 0;
    for (std::size_t i = 0; i < entries.size(); ++i) {
      starts.push_back(at);
      at += entries[i].dims.numel();
      ps.push_back({this, i});
    }
    values.assign(at, T(0));
  }
  flat_model(const flat_model&) = delete;
  flat_model& operator=(const flat_model&) = delete;
  [[nodiscard]] std::vector<param>& parameters() { return ps; }
  // The saved model's buffers, so a consolidated checkpoint keeps them (none: an empty list).
  [[nodiscard]] std::vector<tensor_view<float>> buffers() {
    std::vector<tensor_view<float>> out;
    for (auto& b : buffer_values) out.emplace_back(b.data(), b.size());
    return out;
  }
  std::vector<std::vector<float>> buffer_values;
  [[nodiscard]] std::size_t total() const noexcept { return values.size(); }
  [[nodiscard]] std::vector<std::size_t> sizes() const {
    std::vector<std::size_t> out;
    for (const auto& e : entries) out.push_back(e.dims.numel());
    return out;
  }
  std::vector<param_entry> entries;
  std::vector<std::size_t> starts;
  std::vector<param> ps;
  std::vector<T> values;
};

// Loaded optimizer state as a stateful_optimizer, so checkpoint_bytes writes it as the
// replicated optimizer would.
template <class T>
struct state_of {
  const shard_optimizer_state<T>* st;
  std::vector<std::size_t> sizes;
  void step() {}
  void zero_grad() {}
  void save_state(state_writer& w) const { put_replicated_state<T>(w, *st, sizes); }
  void load_state(state_reader&) {}
};

// Every rank's failure flag through one all_reduce, so all ranks fail together: the rank that
// failed rethrows its own error, the others name it.
inline void agree(process_group& g, std::exception_ptr mine, const std::string& what) {
  std::vector<std::int64_t> flags(static_cast<std::size_t>(g.size()), 0);
  flags[static_cast<std::size_t>(g.rank())] = mine ? 1 : 0;
  g.all_reduce(tensor_view<std::int64_t>(flags.data(), flags.size()), reduce_op::sum).wait();
  if (mine) std::rethrow_exception(mine);
  for (std::size_t q = 0; q < flags.size(); ++q) {
    if (flags[q]) throw checkpoint_error("rank " + std::to_string(q) + " failed to " + what + " (see its error)");
  }
}

// What one rank saves: the model's names and shapes, the slices (segments) of the flat space it
// holds, ascending, and their values and optimizer state laid end to end.
template <class T>
struct shard_content {
  std::vector<param_entry> entries;
  std::vector<flat_range> segments;
  std::vector<T> values;
  shard_optimizer_state<T> state;
  std::vector<std::byte> buffers{};  // rank 0's go into the index
};

// Collective: every rank writes its shard, then rank 0 the index, which names every rank's
// segments (segments_of(q)) and CRC; shards of older saves are removed once it is in place.
template <class T, class SegmentsOf>
void save(process_group& g, const std::filesystem::path& index, const checkpoint_extra& extra, const shard_content<T>& c,
          SegmentsOf segments_of) {
  const int rank = g.rank(), world = g.size();
  const auto total = total_of(c.entries);
  const auto fingerprint = fingerprint_of(c.entries);
  const auto path = shard_path(index, extra.step, rank, world);
  std::uint32_t crc = 0;
  std::exception_ptr err;
  try {
    // Every rank makes the folder it writes into (ranks may not share rank 0's view of it yet).
    if (index.has_parent_path()) {
      std::error_code ec;
      std::filesystem::create_directories(index.parent_path(), ec);
      if (!std::filesystem::is_directory(index.parent_path())) {
        throw checkpoint_error("rank " + std::to_string(rank) + " cannot create the checkpoint folder '" +
                               index.parent_path().string() + "': " + ec.message());
      }
    }
    state_writer w;
    w.put(static_cast<std::uint8_t>(dtype_of<T>));
    w.put(total);
    w.put(fingerprint);
    w.put(static_cast<std::uint64_t>(world));
    w.put(static_cast<std::uint64_t>(rank));
    put_segments(w, c.segments);
    w.put(extra.step);
    w.put_array(std::span<const T>(c.values));
    w.put_string(c.state.kind);
    w.put(c.state.steps);
    w.put(static_cast<std::uint64_t>(c.state.arrays.size()));
    for (const auto& a : c.state.arrays) w.put_array(std::span<const T>(a));
    crc = detail::crc32(w.bytes());
    detail::ckpt::write_file_atomically(path, detail::ckpt::frame(shard_file_magic, sharded_checkpoint_version, w.bytes()));
  } catch (...) {
    err = std::current_exception();
  }
  agree(g, err, "write its shard of " + index.string());
  std::vector<std::int64_t> crcs(static_cast<std::size_t>(world), 0);
  crcs[static_cast<std::size_t>(rank)] = crc;
  g.all_reduce(tensor_view<std::int64_t>(crcs.data(), crcs.size()), reduce_op::sum).wait();
  err = nullptr;
  if (rank == 0) {
    try {
      index_record x{static_cast<std::uint8_t>(dtype_of<T>), total, c.entries.size(), fingerprint,
                     static_cast<std::uint64_t>(world), extra.step, c.state.kind, {}, extra, c.entries, c.buffers};
      for (int q = 0; q < world; ++q) {
        x.shards.push_back({shard_path(index, extra.step, q, world).filename().string(), segments_of(q),
                            static_cast<std::uint32_t>(crcs[static_cast<std::size_t>(q)])});
      }
      detail::ckpt::write_file_atomically(index, detail::ckpt::frame(sharded_index_magic, sharded_checkpoint_version, encode(x)));
      // The new index is in place: shards of older saves are garbage now (best effort).
      const auto dir = index.has_parent_path() ? index.parent_path() : std::filesystem::path(".");
      const std::string prefix = index.filename().string() + ".step-";
      std::error_code ec;
      for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
        const auto name = e.path().filename().string();
        const bool ours = name.starts_with(prefix) && name.find(".shard-") != std::string::npos &&
                          name.find(".tmp") == std::string::npos;
        const bool current = std::any_of(x.shards.begin(), x.shards.end(), [&](const auto& s) { return s.file == name; });
        if (ours && !current) std::filesystem::remove(e.path(), ec);
      }
    } catch (...) {
      err = std::current_exception();
    }
  }
  agree(g, err, "write the index " + index.string());
}

template <class T>
struct loaded {
  index_record index;
  std::vector<T> values;           // over the ranges asked for, end to end
  shard_optimizer_state<T> state;  // over the ranges asked for, end to end
};

// Reads and checks the index and every shard it names, for a model of these names and shapes
// stepped by a `kind` optimizer: the parameter values of the ranges `want_values` and the
// optimizer state of the ranges `want_state` (each ascending), from whichever shards hold them.
template <class T>
[[nodiscard]] loaded<T> read(const std::filesystem::path& index, const std::vector<param_entry>& entries,
                             const std::string& kind, const std::vector<flat_range>& want_values,
                             const std::vector<flat_range>& want_state) {
  const std::string where = "sharded checkpoint index '" + index.string() + "'";
  loaded<T> out;
  auto& x = out.index;
  x = read_index(index, where);
  const auto fingerprint = fingerprint_of(entries);
  const std::uint64_t params = entries.size();
  const auto total = total_of(entries);
  if (x.type != static_cast<std::uint8_t>(dtype_of<T>) || x.total != total || x.params != params ||
      x.fingerprint != fingerprint) {
    throw checkpoint_error(where + " was written for another model: " + std::to_string(x.params) + " parameters of " +
                           std::to_string(x.total) + " " + std::string(to_string(static_cast<dtype>(x.type))) +
                           " elements (names and shapes fingerprint " + std::to_string(x.fingerprint) +
                           "), this model has " + std::to_string(params) + " of " + std::to_string(total) + " " +
                           std::string(to_string(dtype_of<T>)) + " (fingerprint " + std::to_string(fingerprint) + ")");
  }
  if (x.optimizer != kind) {
    throw checkpoint_error(where + " holds " + x.optimizer + " optimizer state, this run steps with " + kind);
  }
  // The shards' segments together must cover the flat space once: no gap, no overlap.
  std::vector<std::pair<flat_range, std::size_t>> pieces;
  for (std::size_t q = 0; q < x.shards.size(); ++q) {
    for (const auto& r : x.shards[q].segments) {
      if (r.size() != 0) pieces.emplace_back(r, q);
    }
  }
  std::sort(pieces.begin(), pieces.end(), [](const auto& a, const auto& b) { return a.first.begin < b.first.begin; });
  std::uint64_t covered = 0;
  for (const auto& [r, q] : pieces) {
    if (r.begin != covered) {
      throw checkpoint_error(where + " is malformed: shard " + std::to_string(q) + " covers [" + std::to_string(r.begin) +
                             ", " + std::to_string(r.end) + "), but the shards before it end at " + std::to_string(covered));
    }
    covered = r.end;
  }
  if (covered != x.total) throw checkpoint_error(where + " is malformed: its shards end at " + std::to_string(covered));

  out.values.resize(elements_of(want_values));
  auto& state = out.state;
  state.kind = x.optimizer;
  const auto dir = index.parent_path();
  for (std::size_t q = 0; q < x.shards.size(); ++q) {
    const auto& e = x.shards[q];
    const auto path = dir / e.file;
    const std::string sw = "shard '" + path.string() + "' (rank " + std::to_string(q) + " of " + std::to_string(x.world) + ")";
    if (!std::filesystem::exists(path)) {
      throw checkpoint_error(where + " names " + sw + ", which is missing (expected one shard file per rank of the "
                             "saving run)");
    }
    const auto bytes = detail::ckpt::read_framed_file(path, "checkpoint shard");
    std::uint32_t crc = 0, version = 0;
    state_reader r(ckpt::unframe(bytes, shard_file_magic, readable, sw, &crc, &version), sw);
    (void)r.get<std::uint8_t>("dtype");
    (void)r.get<std::uint64_t>("element count");
    (void)r.get<std::uint64_t>("model fingerprint");
    const auto sworld = r.get<std::uint64_t>("world size");
    const auto srank = r.get<std::uint64_t>("rank");
    const auto segments = get_segments(r, version, x.total, sw);
    const auto sstep = r.get<std::uint64_t>("save step");
    if (sstep != x.step) {
      throw checkpoint_error(sw + " is from step " + std::to_string(sstep) + " but the index from step " +
                             std::to_string(x.step) + " (shards of two different saves)");
    }
    if (crc != e.crc || sworld != x.world || srank != q || segments != e.segments) {
      throw checkpoint_error(sw + " is not the shard the index names (its CRC, rank or slices differ: a file of another "
                             "save at the same step?)");
    }
    // Each array of the shard holds its segments end to end; the parts asked for go out.
    const auto scatter = [&](const std::vector<T>& a, const std::vector<flat_range>& want, T* dst) {
      std::size_t at = 0;
      for (const auto& seg : segments) {
        copy_overlap(seg, a.data() + at, want, dst);
        at += seg.size();
      }
    };
    std::vector<T> a(elements_of(segments));
    r.get_array(std::span<T>(a), sw + " values");
    scatter(a, want_values, out.values.data());
    const auto skind = r.get_string("optimizer kind");
    const auto steps = r.get<std::int64_t>("optimizer steps");
    const auto arrays = r.get<std::uint64_t>("optimizer array count");
    if (skind != x.optimizer || (q > 0 && (steps != state.steps || arrays != state.arrays.size())) || arrays > 2) {
      throw checkpoint_error(sw + " holds " + skind + " state after " + std::to_string(steps) + " steps with " +
                             std::to_string(arrays) + " arrays, unlike the other shards (shards of different runs)");
    }
    state.steps = steps;
    state.arrays.resize(arrays);
    for (std::uint64_t j = 0; j < arrays; ++j) {
      r.get_array(std::span<T>(a), sw + " optimizer array " + std::to_string(j));
      state.arrays[j].resize(elements_of(want_state));
      scatter(a, want_state, state.arrays[j].data());
    }
    if (r.remaining() != 0) throw checkpoint_error(sw + " is malformed: " + std::to_string(r.remaining()) + " unread bytes");
  }
  return out;
}

// Runs read on every rank and agrees on the outcome, so all ranks fail together (naming the
// rank that failed) before any of them changes its model.
template <class T, class... A>
[[nodiscard]] loaded<T> read_together(process_group& g, const std::filesystem::path& index, const A&... args) {
  std::optional<loaded<T>> got;
  std::exception_ptr err;
  try {
    got = read<T>(index, args...);
  } catch (...) {
    err = std::current_exception();
  }
  agree(g, err, "read " + index.string());
  return std::move(*got);
}

// The names and shapes of a fully sharded model's parameters (its layers hold none of them
// between steps: the shapes are its record).
template <class Fsdp>
[[nodiscard]] std::vector<param_entry> fsdp_entries(Fsdp& f) {
  const auto names = f.parameter_names();
  const auto shapes = f.parameter_shapes();
  std::vector<param_entry> out;
  for (std::size_t i = 0; i < names.size(); ++i) out.push_back({names[i], shapes[i]});
  return out;
}

template <class S>
concept fully_sharded = requires(S& s) { s.shard_values(); };

// A fully sharded model's checkpoint holds its parameters, not its layers' buffers (non-trainable
// state): layers that have some are refused before anything is written.
template <class Fsdp>
void check_no_buffers(Fsdp& z, const std::string& who) {
  using layer_type = detail::layers::layer_t<std::remove_cvref_t<decltype(z.layers())>>;
  if constexpr (has_buffers<layer_type>) {
    for (auto& e : z.layers()) {
      for (auto&& b : detail::layers::layer_of(e).buffers()) {
        if (tensor_view<float>(b).size() != 0) {
          throw checkpoint_error(who + ": the layers have buffers (non-trainable state), which a "
                                 "fully_sharded_data_parallel checkpoint does not hold yet; nothing was written");
        }
      }
    }
  }
}

}  // namespace detail::zero_ckpt

// Every rank calls it, for a sharded_data_parallel (ZeRO-1/2) or a fully_sharded_data_parallel.
// `extra.step` names the save (the shard files carry it).
template <class Sharded>
void save_sharded_checkpoint(Sharded& z, const std::filesystem::path& index, const checkpoint_extra& extra = {}) {
  namespace ck = detail::zero_ckpt;
  process_group& g = z.comm();
  if constexpr (ck::fully_sharded<Sharded>) {
    ck::check_no_buffers(z, "save_sharded_checkpoint");
    const ck::shard_content<float> c{ck::fsdp_entries(z), z.flat_segments(static_cast<std::size_t>(g.rank())),
                                     z.shard_values(), z.optimizer_state()};
    ck::save(g, index, extra, c, [&](int q) { return z.flat_segments(static_cast<std::size_t>(q)); });
  } else {
    // The master type: fp32 for 16-bit parameters, whose masters the ranks hold in pieces.
    using T = typename Sharded::master_type;
    const ck::shard_content<T> c{ck::param_entries(z.module()), z.flat_segments(static_cast<std::size_t>(g.rank())),
                                 z.master_values(), z.optimizer_state(), detail::ckpt::buffer_bytes(z.module())};
    ck::save(g, index, extra, c, [&](int q) { return z.flat_segments(static_cast<std::size_t>(q)); });
  }
}

// Every rank calls it; the world size may differ from the one that saved, and a checkpoint of a
// sharded_data_parallel loads into a fully_sharded_data_parallel of the same parameters and the
// other way round. Everything is read and checked before the model or the optimizer changes.
// Returns where training stood.
template <class Sharded>
checkpoint_extra load_sharded_checkpoint(Sharded& z, const std::filesystem::path& index) {
  namespace ck = detail::zero_ckpt;
  process_group& g = z.comm();
  const std::string source = "sharded checkpoint '" + index.string() + "'";
  if constexpr (ck::fully_sharded<Sharded>) {
    const auto mine = z.flat_segments(static_cast<std::size_t>(g.rank()));
    auto got = ck::read_together<float>(g, index, ck::fsdp_entries(z), z.optimizer_kind(), mine, mine);
    if (!detail::ckpt::decode_buffers(got.index.buffers, source).empty()) {
      throw checkpoint_error(source + " holds the model's buffers; fully_sharded_data_parallel does not restore "
                             "buffers (load it into sharded_data_parallel or a replicated model)");
    }
    z.load_optimizer_state(got.state, source);
    z.load_shard_values(got.values);
    return got.index.extra;
  } else {
    using T = typename Sharded::master_type;
    const std::vector<ck::flat_range> all{{0, z.total_elements()}};
    auto got = ck::read_together<T>(g, index, ck::param_entries(z.module()), z.optimizer_kind(), all,
                                    z.flat_segments(static_cast<std::size_t>(g.rank())));
    const auto buffers = detail::ckpt::read_buffers(got.index.buffers, z.module(), source);
    z.load_optimizer_state(got.state, source);
    z.load_values(got.values);
    detail::ckpt::restore_buffers(z.module(), buffers);
    return got.index.extra;
  }
}

// A sharded checkpoint into a replicated model and optimizer (sgd or adamw): e.g. to resume a
// ZeRO or FSDP run under plain DDP, or on one process. Each caller reads every shard; nothing is
// communicated. Returns where training stood.
template <model M, stateful_optimizer O>
checkpoint_extra load_sharded_checkpoint(const std::filesystem::path& index, M& m, O& opt) {
  static_assert(detail::ckpt::check_checkpointable<M>());
  using T = model_element_t<M>;
  using opts_t = std::remove_cvref_t<decltype(opt.options())>;
  constexpr bool is_sgd = std::same_as<opts_t, sgd_options>;
  static_assert(is_sgd || std::same_as<opts_t, adamw_options>,
                "partrain: a sharded checkpoint loads into partrain::sgd or partrain::adamw");
  namespace ck = detail::zero_ckpt;
  auto views = ck::value_views(m);
  const std::vector<ck::flat_range> all{{0, views.total()}};
  const auto got = ck::read<T>(index, ck::param_entries(m), is_sgd ? "sgd" : "adamw", all, all);
  const auto buffers = detail::ckpt::read_buffers(got.index.buffers, m, "sharded checkpoint '" + index.string() + "'");
  std::vector<std::size_t> sizes;
  for (auto&& p : m.parameters()) sizes.push_back(p.value().size());
  state_writer w;
  ck::put_replicated_state<T>(w, got.state, sizes);
  state_reader r(w.bytes());
  opt.load_state(r);
  views.write({0, got.values.size()}, got.values.data());
  detail::ckpt::restore_buffers(m, buffers);
  return got.index.extra;
}

// Writes the whole model and optimizer state of a sharded checkpoint into one ordinary checkpoint
// (train/checkpoint.hpp's format, atomically), readable by load_checkpoint with the model and a
// replicated sgd or adamw; no model type is needed. The element type is the checkpoint's
// (float or double).
inline void consolidate_sharded_checkpoint(const std::filesystem::path& index, const std::filesystem::path& out) {
  namespace ck = detail::zero_ckpt;
  const std::string where = "sharded checkpoint index '" + index.string() + "'";
  const auto x = ck::read_index(index, where);
  const auto run = [&]<class T>(std::type_identity<T>) {
    ck::flat_model<T> m(x.names);
    m.buffer_values = detail::ckpt::decode_buffers(x.buffers, where);
    const std::vector<ck::flat_range> all{{0, m.total()}};
    const auto got = ck::read<T>(index, x.names, x.optimizer, all, all);
    m.values = got.values;
    const ck::state_of<T> opt{&got.state, m.sizes()};
    detail::ckpt::write_file_atomically(out, checkpoint_bytes(m, opt, x.extra));
  };
  if (x.type == static_cast<std::uint8_t>(dtype::float32)) {
    run(std::type_identity<float>{});
  } else if (x.type == static_cast<std::uint8_t>(dtype::float64)) {
    run(std::type_identity<double>{});
  } else {
    throw checkpoint_error(where + " holds " + std::string(to_string(static_cast<dtype>(x.type))) +
                           " parameters; consolidation writes float or double");
  }
}

}  // namespace partrain::inline v0
