// partrain/train/checkpoint.hpp: training checkpoints. One file holds the model's parameters
// (with names and shapes), the optimizer's state and where training stood (epoch, step, sampler
// position, RNG and scaler state as bytes). It is written atomically with a CRC-32 of its
// contents; a file that is truncated, corrupted, of another format version, or made for other
// parameter shapes is refused with a checkpoint_error saying which.
//
// Layout (little-endian): "PTRNCKPT" | u32 version | u32 crc32(payload) | u64 payload bytes |
// payload = u8 dtype, u64 count, per parameter (name, u8 rank, u64 extents), per parameter its
// values, the optimizer state, the extra fields, then (version 3) the model's buffers.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <filesystem>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <partrain/comm/process_group.hpp>
#include <partrain/core/dtype.hpp>
#include <partrain/core/error.hpp>
#include <partrain/core/memory_space.hpp>
#include <partrain/model/concepts.hpp>
#include <partrain/optim/optimizer.hpp>
#include <partrain/optim/state_io.hpp>
#include <partrain/parallel/detail/host_staging.hpp>
#include <partrain/train/detail/atomic_file.hpp>
#include <partrain/train/detail/crc32.hpp>
#include <partrain/train/detail/framed_file.hpp>

namespace partrain::inline v0 {

// Where training stood; the byte fields are opaque to partrain (an RNG's or a scaler's state).
struct checkpoint_extra {
  std::uint64_t epoch = 0;
  std::uint64_t step = 0;
  std::uint64_t sampler_position = 0;  // samples of the current epoch already consumed
  std::vector<std::byte> rng_state{};
  std::vector<std::byte> scaler_state{};
  std::vector<std::byte> user{};
  // The trainer's record (train/trainer.hpp): the last epoch's results, so resuming a finished run
  // reports them instead of training nothing. Format version 2; empty in version 1 files.
  std::vector<std::byte> trainer_state{};

  friend bool operator==(const checkpoint_extra&, const checkpoint_extra&) = default;
};

inline constexpr std::array<char, 8> checkpoint_magic{'P', 'T', 'R', 'N', 'C', 'K', 'P', 'T'};
// The index of a sharded checkpoint (train/sharded_checkpoint.hpp): known here so that a reader
// handed one says what it is.
inline constexpr std::array<char, 8> sharded_checkpoint_magic{'P', 'T', 'R', 'N', 'Z', 'I', 'D', 'X'};
// 2 added trainer_state, 3 the model's buffers; 1 and 2 are still read.
inline constexpr std::uint32_t checkpoint_version = 3;
inline constexpr std::size_t checkpoint_header_bytes = 8 + 4 + 4 + 8;

namespace detail::ckpt {

template <model M>
consteval bool check_checkpointable() {
  static_assert(std::same_as<model_space_t<M>, host>,
                "partrain: checkpoints read and write host parameters (copy CUDA parameters to the host first)");
  static_assert(element_type<model_element_t<M>>, "partrain: checkpoint parameters must have a partrain dtype");
  return true;
}

// checkpoint_extra's layout, the same in plain and sharded checkpoints. Version 1 files end
// before the trainer state.
inline void put_extra(state_writer& w, const checkpoint_extra& e) {
  w.put(e.epoch);
  w.put(e.step);
  w.put(e.sampler_position);
  w.put_bytes(e.rng_state);
  w.put_bytes(e.scaler_state);
  w.put_bytes(e.user);
  w.put_bytes(e.trainer_state);
}
[[nodiscard]] inline checkpoint_extra get_extra(state_reader& r, bool with_trainer_state = true) {
  checkpoint_extra e;
  e.epoch = r.get<std::uint64_t>("epoch");
  e.step = r.get<std::uint64_t>("step");
  e.sampler_position = r.get<std::uint64_t>("sampler position");
  const auto bytes = [&](const char* what) {
    const auto b = r.get_bytes(what);
    return std::vector<std::byte>(b.begin(), b.end());
  };
  e.rng_state = bytes("rng state");
  e.scaler_state = bytes("scaler state");
  e.user = bytes("user bytes");
  if (with_trainer_state) e.trainer_state = bytes("trainer state");
  return e;
}

// The model's buffers (has_buffers): their count, then each one's values. Empty for a model
// without buffers.
template <class M>
[[nodiscard]] std::vector<std::byte> buffer_bytes(M& m) {
  state_writer w;
  if constexpr (has_buffers<M>) {
    std::uint64_t n = 0;
    for (auto&& b : m.buffers()) {
      (void)b;
      ++n;
    }
    w.put(n);
    for (auto&& b : m.buffers()) {
      const tensor_view<float> v(b);
      w.put_array(std::span<const float>(v.data(), v.size()));
    }
  }
  return w.release();
}
// What buffer_bytes wrote, as values (no model needed).
[[nodiscard]] inline std::vector<std::vector<float>> decode_buffers(std::span<const std::byte> bytes, const std::string& where) {
  std::vector<std::vector<float>> out;
  if (bytes.empty()) return out;
  state_reader r(bytes, where + " (buffers)");
  const auto n = r.get<std::uint64_t>("buffer count");
  if (n > (1u << 24)) throw checkpoint_error(where + " is malformed: " + std::to_string(n) + " buffers");
  for (std::uint64_t k = 0; k < n; ++k) {
    const auto b = r.get_bytes("buffer values");
    if (b.size() % sizeof(float) != 0) throw checkpoint_error(where + " is malformed: buffer #" + std::to_string(k) + " is not floats");
    auto& v = out.emplace_back(b.size() / sizeof(float));
    if (!b.empty()) std::memcpy(v.data(), b.data(), b.size());
  }
  if (r.remaining() != 0) throw checkpoint_error(where + " is malformed: " + std::to_string(r.remaining()) + " bytes after the buffers");
  return out;
}
// The saved buffers checked against the model's before anything changes: the same count and sizes.
template <class M>
[[nodiscard]] std::vector<std::vector<float>> read_buffers(std::span<const std::byte> bytes, M& m, const std::string& where) {
  auto saved = decode_buffers(bytes, where);
  std::vector<std::size_t> sizes;
  if constexpr (has_buffers<M>) {
    for (auto&& b : m.buffers()) sizes.push_back(tensor_view<float>(b).size());
  }
  if (saved.empty() && !sizes.empty()) {
    throw checkpoint_error(where + " holds no buffers, the model has " + std::to_string(sizes.size()) +
                           " (saved by a build or model without them?)");
  }
  if (!saved.empty() && sizes.empty()) {
    throw checkpoint_error(where + " holds buffers (non-trainable state) this model does not have");
  }
  if (saved.size() != sizes.size()) {
    throw checkpoint_error(where + " does not match the model: " + std::to_string(saved.size()) +
                           " buffers in the checkpoint, " + std::to_string(sizes.size()) + " in the model");
  }
  for (std::size_t k = 0; k < sizes.size(); ++k) {
    if (saved[k].size() != sizes[k]) {
      throw checkpoint_error(where + " does not match the model: buffer #" + std::to_string(k) + " has " +
                             std::to_string(saved[k].size()) + " values in the checkpoint, " + std::to_string(sizes[k]) +
                             " in the model");
    }
  }
  return saved;
}
template <class M>
void restore_buffers(M& m, const std::vector<std::vector<float>>& values) {
  if constexpr (has_buffers<M>) {
    std::size_t k = 0;
    for (auto&& b : m.buffers()) {
      const tensor_view<float> v(b);
      if (v.size()) std::memcpy(v.data(), values[k].data(), v.size_bytes());
      ++k;
    }
  }
}

template <std::size_t N>
void put_raw(std::vector<std::byte>& out, const void* p) {
  const auto* b = static_cast<const std::byte*>(p);
  out.insert(out.end(), b, b + N);
}

}  // namespace detail::ckpt

// Serializes model, optimizer and extra into checkpoint bytes (what save_checkpoint writes).
template <model M, stateful_optimizer O>
[[nodiscard]] std::vector<std::byte> checkpoint_bytes(M& m, const O& opt, const checkpoint_extra& extra = {}) {
  static_assert(detail::ckpt::check_checkpointable<M>());
  using T = model_element_t<M>;
  state_writer w;
  w.put(static_cast<std::uint8_t>(dtype_of<T>));
  w.put(static_cast<std::uint64_t>(detail::parameter_count(m)));
  std::size_t i = 0;
  for (auto&& p : m.parameters()) {
    const auto v = p.value();
    w.put_string(detail::param_name(p, i++));
    w.put(static_cast<std::uint8_t>(v.rank()));
    for (std::size_t d = 0; d < v.rank(); ++d) w.put(static_cast<std::uint64_t>(v.extent(d)));
  }
  for (auto&& p : m.parameters()) {
    const auto v = p.value();
    w.put_array(std::span<const T>(v.data(), v.size()));
  }
  state_writer ow;
  opt.save_state(ow);
  w.put_bytes(ow.bytes());
  detail::ckpt::put_extra(w, extra);
  w.put_bytes(detail::ckpt::buffer_bytes(m));

  const auto& payload = w.bytes();
  const std::uint32_t version = checkpoint_version;
  const std::uint32_t crc = detail::crc32(payload);
  const std::uint64_t size = payload.size();
  std::vector<std::byte> out;
  out.reserve(checkpoint_header_bytes + payload.size());
  detail::ckpt::put_raw<8>(out, checkpoint_magic.data());
  detail::ckpt::put_raw<4>(out, &version);
  detail::ckpt::put_raw<4>(out, &crc);
  detail::ckpt::put_raw<8>(out, &size);
  out.insert(out.end(), payload.begin(), payload.end());
  return out;
}

// Writes the checkpoint to `path` atomically (temporary file, fsync, rename). Call it on one rank.
template <model M, stateful_optimizer O>
void save_checkpoint(const std::filesystem::path& path, M& m, const O& opt, const checkpoint_extra& extra = {}) {
  detail::ckpt::write_file_atomically(path, checkpoint_bytes(m, opt, extra));
}

// Every rank calls it: rank 0 writes, then all meet at a barrier, so no rank reads the file
// before it is complete.
template <model M, stateful_optimizer O>
void save_checkpoint(process_group& comm, const std::filesystem::path& path, M& m, const O& opt,
                     const checkpoint_extra& extra = {}) {
  std::exception_ptr err;
  if (comm.rank() == 0) {
    try {
      save_checkpoint(path, m, opt, extra);
    } catch (...) {
      err = std::current_exception();
    }
  }
  // The barrier runs even when rank 0 failed, so the others are not left waiting for it.
  comm.barrier().wait();
  if (err) std::rethrow_exception(err);
}

// Restores model parameters and optimizer state from checkpoint bytes; returns the extra fields.
// The header, checksum and every parameter's name and shape are checked before anything is
// changed. `source` names the file in messages.
template <model M, stateful_optimizer O>
checkpoint_extra load_checkpoint_bytes(std::span<const std::byte> file, M& m, O& opt, std::string_view source = "<memory>") {
  static_assert(detail::ckpt::check_checkpointable<M>());
  using T = model_element_t<M>;
  const std::string where = "checkpoint '" + std::string(source) + "'";
  if (file.size() < checkpoint_header_bytes) {
    throw checkpoint_error(where + " is truncated: " + std::to_string(file.size()) + " bytes, less than the " +
                           std::to_string(checkpoint_header_bytes) + "-byte header");
  }
  if (std::memcmp(file.data(), sharded_checkpoint_magic.data(), sharded_checkpoint_magic.size()) == 0) {
    throw checkpoint_error(where + " is the index of a sharded checkpoint (ZeRO or FSDP: one file per rank), not a "
                                  "single-file one: resume it with that mode (any world size), load it into a "
                                  "replicated model with load_sharded_checkpoint, or make one file of it with "
                                  "partrain_consolidate");
  }
  if (std::memcmp(file.data(), checkpoint_magic.data(), checkpoint_magic.size()) != 0) {
    throw checkpoint_error(where + " is not a partrain checkpoint (bad magic; expected \"PTRNCKPT\")");
  }
  std::uint32_t version = 0, crc = 0;
  std::uint64_t size = 0;
  std::memcpy(&version, file.data() + 8, 4);
  std::memcpy(&crc, file.data() + 12, 4);
  std::memcpy(&size, file.data() + 16, 8);
  if (version < 1 || version > checkpoint_version) {
    throw checkpoint_error(where + " has format version " + std::to_string(version) + "; this build reads versions 1 to " +
                           std::to_string(checkpoint_version));
  }
  const std::size_t have = file.size() - checkpoint_header_bytes;
  if (size != have) {
    throw checkpoint_error(where + (have < size ? " is truncated" : " has trailing bytes") + ": the header says " +
                           std::to_string(size) + " payload bytes, the file has " + std::to_string(have));
  }
  const auto payload = file.subspan(checkpoint_header_bytes);
  if (const auto got = detail::crc32(payload); got != crc) {
    throw checkpoint_error(where + " is corrupted: the payload's CRC-32 is " + std::to_string(got) +
                           ", the header says " + std::to_string(crc));
  }

  state_reader r(payload, where);
  const auto mismatch = [&](const std::string& what) {
    return checkpoint_error(where + " does not match the model: " + what);
  };
  const auto stored_type = static_cast<dtype>(r.get<std::uint8_t>("parameter dtype"));
  if (stored_type != dtype_of<T>) {
    throw mismatch("parameters are " + std::string(to_string(stored_type)) + " in the checkpoint, " +
                   std::string(to_string(dtype_of<T>)) + " in the model");
  }
  const auto count = r.get<std::uint64_t>("parameter count");
  const auto have_count = detail::parameter_count(m);
  if (count != have_count) {
    throw mismatch(std::to_string(count) + " parameters in the checkpoint, " + std::to_string(have_count) +
                   " in the model");
  }
  std::size_t i = 0;
  for (auto&& p : m.parameters()) {
    const auto name = r.get_string("parameter name");
    const auto rank = r.get<std::uint8_t>("parameter rank");
    if (rank > max_rank) throw checkpoint_error(where + " is malformed: parameter " + name + " has rank " + std::to_string(rank));
    shape stored;
    std::array<std::size_t, max_rank> dims{};
    for (std::size_t d = 0; d < rank; ++d) dims[d] = static_cast<std::size_t>(r.get<std::uint64_t>("parameter extent"));
    stored = shape(std::span<const std::size_t>(dims.data(), rank));
    const auto v = p.value();
    const auto mine = detail::param_name(p, i);
    if (name != mine) throw mismatch("parameter #" + std::to_string(i) + " is '" + name + "' in the checkpoint, '" + mine + "' in the model");
    if (stored != v.shape()) {
      throw mismatch("parameter #" + std::to_string(i) + " (" + name + ") has shape " + stored.to_string() +
                     " in the checkpoint, " + v.shape().to_string() + " in the model");
    }
    ++i;
  }
  // Values go to a staging copy first: the model is changed only once everything parsed.
  std::vector<std::vector<T>> values;
  for (auto&& p : m.parameters()) {
    auto& dst = values.emplace_back(p.value().size());
    r.get_array(std::span<T>(dst), "values of parameter #" + std::to_string(values.size() - 1));
  }
  const auto opt_state = r.get_bytes("optimizer state");
  const checkpoint_extra extra = detail::ckpt::get_extra(r, version >= 2);
  const std::span<const std::byte> buffers = version >= 3 ? r.get_bytes("buffers") : std::span<const std::byte>{};
  if (r.remaining() != 0) throw checkpoint_error(where + " is malformed: " + std::to_string(r.remaining()) + " unread bytes");
  const auto buffer_values = detail::ckpt::read_buffers(buffers, m, where);

  state_reader orr(opt_state, where + " (optimizer state)");
  opt.load_state(orr);
  std::size_t k = 0;
  for (auto&& p : m.parameters()) {
    auto v = p.value();
    if (v.size()) std::memcpy(v.data(), values[k].data(), v.size_bytes());
    ++k;
  }
  detail::ckpt::restore_buffers(m, buffer_values);
  return extra;
}

// Reads `path` (every rank does) and restores model and optimizer; returns the extra fields.
template <model M, stateful_optimizer O>
checkpoint_extra load_checkpoint(const std::filesystem::path& path, M& m, O& opt) {
  const auto file = detail::ckpt::read_framed_file(path, "checkpoint");
  return load_checkpoint_bytes(file, m, opt, path.string());
}

// FNV-1a over every parameter's bytes: equal checksums mean bit-identical parameters (what a
// restart test compares between an interrupted and an uninterrupted run). CUDA parameters are
// read through a host copy, after the work queued on the model's stream.
template <model M>
[[nodiscard]] std::uint64_t parameter_checksum(M& m) {
  std::uint64_t h = 0xcbf29ce484222325ull;
  auto add = [&h](const auto& v) {
    const auto* bytes = reinterpret_cast<const unsigned char*>(v.data());
    for (std::size_t i = 0; i < v.size_bytes(); ++i) h = (h ^ bytes[i]) * 0x100000001b3ull;
  };
  if constexpr (std::same_as<model_space_t<M>, host>) {
    for (auto&& p : m.parameters()) add(p.value());
  } else {
    detail::host_values<M> copy(m);
    copy.pull("parameter_checksum");
    for (const auto& v : copy.views()) add(v);
  }
  return h;
}

}  // namespace partrain::inline v0
