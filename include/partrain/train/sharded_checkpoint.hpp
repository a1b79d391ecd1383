// partrain/train/sharded_checkpoint.hpp: checkpoints of a sharded_data_parallel without a trip
// through rank 0. Every rank writes its own shard file (its slice of the flat parameters and of
// the optimizer state, atomically, CRC'd); then rank 0 writes a small index at the checkpoint's
// path naming the shards, their slices and CRCs, the model's fingerprint and where training
// stood. Loading reads the index and the shards and works at any world size: the slices are
// contiguous ranges of the flat parameter space, so each rank takes the parameters from every
// shard and the optimizer state from the shards that overlap its new slice (resharding). A
// replicated model and optimizer (plain DDP, or one process) load it too: the state of the whole
// flat space, cut per parameter; consolidate_sharded_checkpoint writes one ordinary checkpoint
// file from it (names and shapes are in the index, no model type needed).
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
#include <vector>

#include <partrain/comm/process_group.hpp>
#include <partrain/core/dtype.hpp>
#include <partrain/core/error.hpp>
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

inline constexpr std::array<char, 8> sharded_index_magic{'P', 'T', 'R', 'N', 'Z', 'I', 'D', 'X'};
inline constexpr std::array<char, 8> shard_file_magic{'P', 'T', 'R', 'N', 'Z', 'S', 'H', 'D'};
inline constexpr std::uint32_t sharded_checkpoint_version = 1;

namespace detail::zero_ckpt {

// FNV-1a over every parameter's name and shape: "the same model" for a checkpoint.
template <class M>
[[nodiscard]] std::uint64_t model_fingerprint(M& m) {
  std::uint64_t h = 0xcbf29ce484222325ull;
  const auto mix = [&h](std::uint64_t x) {
    for (int b = 0; b < 8; ++b) h = (h ^ ((x >> (8 * b)) & 0xffu)) * 0x100000001b3ull;
  };
  std::size_t i = 0;
  for (auto&& p : m.parameters()) {
    for (const char c : param_name(p, i++)) mix(static_cast<unsigned char>(c));
    const auto v = p.value();
    mix(v.rank());
    for (std::size_t d = 0; d < v.rank(); ++d) mix(v.extent(d));
  }
  return h;
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

struct shard_entry {
  std::string file;  // relative to the index's folder
  std::uint64_t begin = 0, end = 0;
  std::uint32_t crc = 0;
};

struct param_entry {
  std::string name;
  shape dims;
};

struct index_record {
  std::uint8_t type = 0;
  std::uint64_t total = 0, params = 0, fingerprint = 0, world = 0, step = 0;
  std::string optimizer;
  std::vector<shard_entry> shards;
  checkpoint_extra extra;
  std::vector<param_entry> names;  // every parameter's name and shape (what consolidation writes)
};

template <class M>
[[nodiscard]] std::vector<param_entry> param_entries(M& m) {
  std::vector<param_entry> out;
  std::size_t i = 0;
  for (auto&& p : m.parameters()) out.push_back({param_name(p, i++), p.value().shape()});
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
    w.put(s.begin);
    w.put(s.end);
    w.put(s.crc);
  }
  ckpt::put_extra(w, x.extra);
  for (const auto& e : x.names) {
    w.put_string(e.name);
    w.put(static_cast<std::uint8_t>(e.dims.rank()));
    for (std::size_t d = 0; d < e.dims.rank(); ++d) w.put(static_cast<std::uint64_t>(e.dims[d]));
  }
  return w.release();
}
[[nodiscard]] inline index_record decode_index(std::span<const std::byte> payload, const std::string& where) {
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
    s.begin = r.get<std::uint64_t>("shard begin");
    s.end = r.get<std::uint64_t>("shard end");
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
  if (r.remaining() != 0) throw checkpoint_error(where + " is malformed: " + std::to_string(r.remaining()) + " unread bytes");
  return x;
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

}  // namespace detail::zero_ckpt

// Every rank calls it. `extra.step` names the save (the shard files carry it).
template <class Zero>
void save_sharded_checkpoint(Zero& z, const std::filesystem::path& index, const checkpoint_extra& extra = {}) {
  namespace ck = detail::zero_ckpt;
  auto& m = z.module();
  using T = model_element_t<std::remove_cvref_t<decltype(m)>>;
  process_group& g = z.comm();
  const int rank = g.rank(), world = g.size();
  const auto shard = z.shard();
  const auto fingerprint = ck::model_fingerprint(m);
  const auto path = ck::shard_path(index, extra.step, rank, world);
  std::uint32_t crc = 0;
  std::exception_ptr err;
  try {
    if (rank == 0 && index.has_parent_path()) std::filesystem::create_directories(index.parent_path());
    state_writer w;
    w.put(static_cast<std::uint8_t>(dtype_of<T>));
    w.put(static_cast<std::uint64_t>(z.total_elements()));
    w.put(fingerprint);
    w.put(static_cast<std::uint64_t>(world));
    w.put(static_cast<std::uint64_t>(rank));
    w.put(static_cast<std::uint64_t>(shard.begin));
    w.put(static_cast<std::uint64_t>(shard.end));
    w.put(extra.step);
    std::vector<T> values(shard.size());
    ck::value_views(m).read(shard, values.data(), false);
    w.put_array(std::span<const T>(values));
    const auto state = z.optimizer_state();
    w.put_string(state.kind);
    w.put(state.steps);
    w.put(static_cast<std::uint64_t>(state.arrays.size()));
    for (const auto& a : state.arrays) w.put_array(std::span<const T>(a));
    crc = detail::crc32(w.bytes());
    detail::ckpt::write_file_atomically(path, detail::ckpt::frame(shard_file_magic, sharded_checkpoint_version, w.bytes()));
  } catch (...) {
    err = std::current_exception();
  }
  // Directory creation on rank 0 happens before the others write: the agreement is a barrier.
  ck::agree(g, err, "write its shard of " + index.string());
  std::vector<std::int64_t> crcs(static_cast<std::size_t>(world), 0);
  crcs[static_cast<std::size_t>(rank)] = crc;
  g.all_reduce(tensor_view<std::int64_t>(crcs.data(), crcs.size()), reduce_op::sum).wait();
  err = nullptr;
  if (rank == 0) {
    try {
      ck::index_record x{static_cast<std::uint8_t>(dtype_of<T>), z.total_elements(), detail::parameter_count(m), fingerprint,
                         static_cast<std::uint64_t>(world), extra.step, z.optimizer_kind(), {}, extra,
                         ck::param_entries(m)};
      for (int q = 0; q < world; ++q) {
        const auto s = detail::zero::shard_of(z.total_elements(), static_cast<std::size_t>(world), static_cast<std::size_t>(q));
        x.shards.push_back({ck::shard_path(index, extra.step, q, world).filename().string(), s.begin, s.end,
                            static_cast<std::uint32_t>(crcs[static_cast<std::size_t>(q)])});
      }
      detail::ckpt::write_file_atomically(index, detail::ckpt::frame(sharded_index_magic, sharded_checkpoint_version, ck::encode(x)));
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
  ck::agree(g, err, "write the index " + index.string());
}

namespace detail::zero_ckpt {

template <class T>
struct loaded {
  index_record index;
  std::vector<T> values;             // the whole flat parameter space
  shard_optimizer_state<T> state;    // over the slice asked for
};

// Reads and checks the index and every shard it names, for model m stepped by a `kind`
// optimizer: all parameter values, and the optimizer state of the flat slice `mine`.
template <class M>
[[nodiscard]] loaded<model_element_t<M>> read(const std::filesystem::path& index, M& m, zero::flat_range mine,
                                               const std::string& kind) {
  using T = model_element_t<M>;
  const std::string where = "sharded checkpoint index '" + index.string() + "'";
  loaded<T> out;
  auto& x = out.index;
  const auto file = detail::ckpt::read_whole_file(index);
  x = decode_index(ckpt::unframe(file, sharded_index_magic, sharded_checkpoint_version, where), where);
  const auto fingerprint = model_fingerprint(m);
  const auto params = parameter_count(m);
  const auto total = value_views(m).total();
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
  out.values.resize(total);
  const auto values_view = std::span<T>(out.values);
  auto& state = out.state;
  state.kind = x.optimizer;
  const auto dir = index.parent_path();
  std::uint64_t expect_begin = 0;
  for (std::size_t q = 0; q < x.shards.size(); ++q) {
    const auto& e = x.shards[q];
    const auto path = dir / e.file;
    const std::string sw = "shard '" + path.string() + "' (rank " + std::to_string(q) + " of " + std::to_string(x.world) + ")";
    if (e.begin != expect_begin || e.end < e.begin || e.end > x.total) {
      throw checkpoint_error(where + " is malformed: shard " + std::to_string(q) + " covers [" + std::to_string(e.begin) +
                             ", " + std::to_string(e.end) + ")");
    }
    expect_begin = e.end;
    if (!std::filesystem::exists(path)) {
      throw checkpoint_error(where + " names " + sw + ", which is missing (expected one shard file per rank of the "
                             "saving run)");
    }
    const auto bytes = detail::ckpt::read_whole_file(path);
    std::uint32_t crc = 0;
    state_reader r(ckpt::unframe(bytes, shard_file_magic, sharded_checkpoint_version, sw, &crc), sw);
    (void)r.get<std::uint8_t>("dtype");
    (void)r.get<std::uint64_t>("element count");
    (void)r.get<std::uint64_t>("model fingerprint");
    const auto sworld = r.get<std::uint64_t>("world size");
    const auto srank = r.get<std::uint64_t>("rank");
    const auto sbegin = r.get<std::uint64_t>("shard begin");
    const auto send = r.get<std::uint64_t>("shard end");
    const auto sstep = r.get<std::uint64_t>("save step");
    if (sstep != x.step) {
      throw checkpoint_error(sw + " is from step " + std::to_string(sstep) + " but the index from step " +
                             std::to_string(x.step) + " (shards of two different saves)");
    }
    if (crc != e.crc || sworld != x.world || srank != q || sbegin != e.begin || send != e.end) {
      throw checkpoint_error(sw + " is not the shard the index names (its CRC, rank or slice differ: a file of another "
                             "save at the same step?)");
    }
    r.get_array(values_view.subspan(e.begin, e.end - e.begin), sw + " values");
    const auto skind = r.get_string("optimizer kind");
    const auto steps = r.get<std::int64_t>("optimizer steps");
    const auto arrays = r.get<std::uint64_t>("optimizer array count");
    if (skind != x.optimizer || (q > 0 && (steps != state.steps || arrays != state.arrays.size())) || arrays > 2) {
      throw checkpoint_error(sw + " holds " + skind + " state after " + std::to_string(steps) + " steps with " +
                             std::to_string(arrays) + " arrays, unlike the other shards (shards of different runs)");
    }
    state.steps = steps;
    state.arrays.resize(arrays);
    std::vector<T> a(e.end - e.begin);
    for (std::uint64_t j = 0; j < arrays; ++j) {
      r.get_array(std::span<T>(a), sw + " optimizer array " + std::to_string(j));
      // The part of this old shard inside the slice asked for.
      auto& dst = state.arrays[j];
      dst.resize(mine.size());
      const std::uint64_t lo = std::max<std::uint64_t>(e.begin, mine.begin);
      const std::uint64_t hi = std::min<std::uint64_t>(e.end, mine.end);
      if (lo < hi) {
        std::copy(a.begin() + static_cast<std::ptrdiff_t>(lo - e.begin), a.begin() + static_cast<std::ptrdiff_t>(hi - e.begin),
                  dst.begin() + static_cast<std::ptrdiff_t>(lo - mine.begin));
      }
    }
    if (r.remaining() != 0) throw checkpoint_error(sw + " is malformed: " + std::to_string(r.remaining()) + " unread bytes");
  }
  if (expect_begin != x.total) throw checkpoint_error(where + " is malformed: its shards end at " + std::to_string(expect_begin));
  return out;
}

}  // namespace detail::zero_ckpt

// Every rank calls it; the world size may differ from the one that saved. Everything is read and
// checked before the model or the optimizer changes. Returns where training stood.
template <class Zero>
checkpoint_extra load_sharded_checkpoint(Zero& z, const std::filesystem::path& index) {
  namespace ck = detail::zero_ckpt;
  auto& m = z.module();
  process_group& g = z.comm();
  std::optional<ck::loaded<model_element_t<std::remove_cvref_t<decltype(m)>>>> got;
  std::exception_ptr err;
  try {
    got = ck::read(index, m, z.shard(), z.optimizer_kind());
  } catch (...) {
    err = std::current_exception();
  }
  ck::agree(g, err, "read " + index.string());
  z.load_optimizer_state(got->state, "sharded checkpoint '" + index.string() + "'");
  ck::value_views(m).write({0, got->values.size()}, got->values.data());
  return got->index.extra;
}

// A sharded checkpoint into a replicated model and optimizer (sgd or adamw): e.g. to resume a
// ZeRO run under plain DDP, or on one process. Each caller reads every shard; nothing is
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
  const auto got = ck::read(index, m, {0, views.total()}, is_sgd ? "sgd" : "adamw");
  std::vector<std::size_t> sizes;
  for (auto&& p : m.parameters()) sizes.push_back(p.value().size());
  state_writer w;
  ck::put_replicated_state<T>(w, got.state, sizes);
  state_reader r(w.bytes());
  opt.load_state(r);
  views.write({0, got.values.size()}, got.values.data());
  return got.index.extra;
}

// Writes the whole model and optimizer state of a sharded checkpoint into one ordinary checkpoint
// (train/checkpoint.hpp's format, atomically), readable by load_checkpoint with the model and a
// replicated sgd or adamw; no model type is needed. The element type is the checkpoint's
// (float or double).
inline void consolidate_sharded_checkpoint(const std::filesystem::path& index, const std::filesystem::path& out) {
  namespace ck = detail::zero_ckpt;
  const std::string where = "sharded checkpoint index '" + index.string() + "'";
  const auto file = detail::ckpt::read_whole_file(index);
  const auto x = ck::decode_index(detail::ckpt::unframe(file, sharded_index_magic, sharded_checkpoint_version, where), where);
  const auto run = [&]<class T>(std::type_identity<T>) {
    ck::flat_model<T> m(x.names);
    const auto got = ck::read(index, m, {0, m.total()}, x.optimizer);
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
