#include <catch2/catch.hpp>

#include "fifo.hpp"
#include "temp_dir.hpp"

#include <partrain/comm/local.hpp>
#include <partrain/optim/adamw.hpp>
#include <partrain/optim/sgd.hpp>
#include <partrain/parallel/ddp.hpp>
#include <partrain/train/checkpoint.hpp>
#include <partrain/train/rank_checkpoint.hpp>
#include <partrain/train/sharded_checkpoint.hpp>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <span>
#include <filesystem>
#include <fstream>
#include <string>
#include <sys/wait.h>
#include <unistd.h>
#include <vector>

#include "toy_models.hpp"

using namespace partrain;
using partrain::testing::make_toy_batch;
using partrain::testing::toy_mlp;
namespace fs = std::filesystem;

namespace {

struct temp_dir : partrain::testing::temp_dir {
  temp_dir() : partrain::testing::temp_dir("partrain_ckpt") {}
};

std::vector<std::byte> read(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::vector<char> c((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  std::vector<std::byte> b(c.size());
  std::memcpy(b.data(), c.data(), c.size());
  return b;
}
void write(const fs::path& p, const std::vector<std::byte>& b) {
  std::ofstream f(p, std::ios::binary | std::ios::trunc);
  f.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
}

template <class T, class Opt, class MakeOpt>
void train(toy_mlp<T, false>& m, Opt& opt, int from, int to, MakeOpt&&) {
  for (int s = from; s < to; ++s) {
    m.train_step(make_toy_batch<T>(static_cast<std::size_t>(s) * 8, 8));
    opt.step();
  }
}

}  // namespace

TEST_CASE("crc32 matches the standard check value", "[train][checkpoint]") {
  const std::string_view s = "123456789";
  CHECK(detail::crc32(std::as_bytes(std::span(s.data(), s.size()))) == 0xCBF43926u);
  CHECK(detail::crc32({}) == 0u);
}

TEST_CASE("checkpoint: resuming gives bit-identical parameters to an uninterrupted run", "[train][checkpoint]") {
  temp_dir dir;
  const auto file = dir.path / "ckpt.bin";
  SECTION("float, SGD with Nesterov momentum") {
    const sgd_options o{.lr = 0.05, .momentum = 0.9, .weight_decay = 1e-3, .nesterov = true};
    toy_mlp<float, false> straight(7);
    sgd so(straight, o);
    train(straight, so, 0, 10, 0);

    toy_mlp<float, false> first(7);
    sgd fo(first, o);
    train(first, fo, 0, 4, 0);
    save_checkpoint(file, first, fo, {.epoch = 1, .step = 4, .sampler_position = 32, .rng_state = {std::byte{42}}});

    toy_mlp<float, false> resumed(99);  // other initial weights: the checkpoint must overwrite them
    sgd ro(resumed, o);
    const auto extra = load_checkpoint(file, resumed, ro);
    CHECK(extra.epoch == 1);
    CHECK(extra.step == 4);
    CHECK(extra.sampler_position == 32);
    CHECK(extra.rng_state == std::vector<std::byte>{std::byte{42}});
    CHECK(resumed.flat_values() == first.flat_values());
    train(resumed, ro, 4, 10, 0);
    CHECK(resumed.flat_values() == straight.flat_values());
  }
  SECTION("double, AdamW") {
    const adamw_options o{.lr = 0.01, .weight_decay = 0.05};
    toy_mlp<double, false> straight(7);
    adamw so(straight, o);
    train(straight, so, 0, 10, 0);

    toy_mlp<double, false> first(7);
    adamw fo(first, o);
    train(first, fo, 0, 6, 0);
    save_checkpoint(file, first, fo);

    toy_mlp<double, false> resumed(3);
    adamw ro(resumed, o);
    load_checkpoint(file, resumed, ro);
    CHECK(ro.steps() == 6);
    train(resumed, ro, 6, 10, 0);
    CHECK(resumed.flat_values() == straight.flat_values());
  }
  // The temporary file was renamed away: only the checkpoint is left.
  std::size_t files = 0;
  for (const auto& e : fs::directory_iterator(dir.path)) files += e.is_regular_file() ? 1 : 0;
  CHECK(files == 1);
}

TEST_CASE("checkpoint: DDP ranks resume from rank 0's file bit for bit", "[train][checkpoint][threads]") {
  temp_dir dir;
  const auto file = dir.path / "ddp.ckpt";
  const sgd_options o{.lr = 0.05, .momentum = 0.9};
  auto run = [&](bool interrupt) {
    std::vector<std::vector<float>> out(2);
    run_local(2, [&](local_group& g) {
      auto batch = [&](int s) { return make_toy_batch<float>(static_cast<std::size_t>(s * 2 + g.rank()) * 4, 4); };
      toy_mlp<float> m(7);
      distributed_data_parallel ddp(m, g);
      sgd opt(m, o);
      int s = 0;
      for (; s < 3; ++s) {
        ddp.train_step(batch(s));
        opt.step();
      }
      if (interrupt) {
        save_checkpoint(g, file, m, opt, {.step = 3});
        toy_mlp<float> m2(50 + static_cast<std::uint64_t>(g.rank()));
        sgd opt2(m2, o);
        const auto extra = load_checkpoint(file, m2, opt2);
        distributed_data_parallel ddp2(m2, g, {.broadcast_parameters = false});
        for (s = static_cast<int>(extra.step); s < 8; ++s) {
          ddp2.train_step(batch(s));
          opt2.step();
        }
        out[static_cast<std::size_t>(g.rank())] = m2.flat_values();
      } else {
        for (; s < 8; ++s) {
          ddp.train_step(batch(s));
          opt.step();
        }
        out[static_cast<std::size_t>(g.rank())] = m.flat_values();
      }
    });
    CHECK(out[0] == out[1]);
    return out[0];
  };
  CHECK(run(true) == run(false));
}

TEST_CASE("checkpoint: bad files are refused with the reason", "[train][checkpoint]") {
  temp_dir dir;
  const auto file = dir.path / "ckpt.bin";
  toy_mlp<float, false> m(7);
  sgd opt(m, {.lr = 0.1, .momentum = 0.9});
  m.train_step(make_toy_batch<float>(0, 8));
  opt.step();
  save_checkpoint(file, m, opt, {.user = {std::byte{1}, std::byte{2}}});
  const auto good = read(file);
  toy_mlp<float, false> target(5);
  sgd topt(target, {.lr = 0.1, .momentum = 0.9});
  const auto before = target.flat_values();
  auto refused = [&](const std::vector<std::byte>& bytes, const std::string& why) {
    write(file, bytes);
    CHECK_THROWS_WITH(load_checkpoint(file, target, topt), Catch::Contains(why));
    CHECK(target.flat_values() == before);  // nothing was changed
  };

  SECTION("a corrupted byte") {
    auto b = good;
    b[b.size() / 2] ^= std::byte{0x10};
    refused(b, "is corrupted: the payload's CRC-32");
  }
  SECTION("a truncated file") {
    refused({good.begin(), good.end() - 5}, "is truncated: the header says");
    refused({good.begin(), good.begin() + 10}, "less than the 24-byte header");
  }
  SECTION("trailing bytes") {
    auto b = good;
    b.push_back(std::byte{0});
    refused(b, "has trailing bytes");
  }
  SECTION("wrong magic") {
    auto b = good;
    b[0] = std::byte{'X'};
    refused(b, "is not a partrain checkpoint (bad magic");
  }
  SECTION("wrong version") {
    auto b = good;
    b[8] = std::byte{7};
    refused(b, "has format version 7; this build reads versions 1 to 3");
  }
  SECTION("a valid CRC over a huge name length names the file and the field") {
    // A hostile or buggy writer: the payload checks out, but parameter #0's name claims 2^62 bytes.
    auto b = good;
    const std::uint64_t huge = std::uint64_t{1} << 62;
    std::memcpy(b.data() + 24 + 1 + 8, &huge, sizeof huge);  // header, dtype, parameter count
    const auto crc = detail::crc32(std::span<const std::byte>(b).subspan(24));
    std::memcpy(b.data() + 12, &crc, sizeof crc);
    refused(b, "checkpoint '" + file.string() + "': parameter name: needs 4611686018427387904 more bytes");
  }
  SECTION("a missing file") {
    CHECK_THROWS_WITH(load_checkpoint(dir.path / "nope.bin", target, topt), Catch::Contains("cannot open checkpoint"));
  }
  SECTION("other model shapes") {
    toy_mlp<float, false> wide(7, 6, 8);
    sgd wopt(wide, {});
    CHECK_THROWS_WITH(load_checkpoint(file, wide, wopt),
                      Catch::Contains("does not match the model: parameter #0 (fc1.weight) has shape [5, 6] in the "
                                      "checkpoint, [8, 6] in the model"));
  }
  SECTION("other parameter dtype") {
    toy_mlp<double, false> d(7);
    sgd dopt(d, {});
    CHECK_THROWS_WITH(load_checkpoint(file, d, dopt), Catch::Contains("parameters are float32 in the checkpoint, float64"));
  }
  SECTION("another optimizer") {
    adamw aopt(target, {});
    CHECK_THROWS_WITH(load_checkpoint(file, target, aopt), Catch::Contains("expected 'adamw'"));
    CHECK(target.flat_values() == before);
  }
  SECTION("the good file loads") {
    write(file, good);
    const auto extra = load_checkpoint(file, target, topt);
    CHECK(extra.user == std::vector<std::byte>{std::byte{1}, std::byte{2}});
    CHECK(target.flat_values() == m.flat_values());
  }
}

TEST_CASE("checkpoint: a FIFO, a device or a folder is refused by name before it is opened", "[train][checkpoint][hostile]") {
  using namespace std::chrono_literals;
  using partrain::testing::error_within;
  temp_dir dir;
  toy_mlp<float, false> m(5);
  sgd opt(m, {.lr = 0.1});
  const auto before = m.flat_values();
  // A FIFO blocks open() until a writer comes: every checkpoint reader must refuse it unopened.
  const auto fifo = partrain::testing::make_fifo(dir.path / "run.ckpt");
  const std::string is_fifo = "'" + fifo.string() + "' is a FIFO, expected a regular file";
  CHECK_THAT(error_within(5s, fifo, [&] { (void)load_checkpoint(fifo, m, opt); }), Catch::Contains("checkpoint " + is_fifo));
  CHECK_THAT(error_within(5s, fifo, [&] {
               run_local(1, [&](local_group& g) { (void)load_rank_checkpoint(g, fifo, m, opt); });
             }),
             Catch::Contains("rank checkpoint " + is_fifo));
  CHECK_THAT(error_within(5s, fifo, [&] { consolidate_sharded_checkpoint(fifo, dir.path / "out.ckpt"); }),
             Catch::Contains("sharded checkpoint index " + is_fifo));
  // /dev/zero never ends: read whole, it would exhaust memory.
  CHECK_THROWS_AS(load_checkpoint("/dev/zero", m, opt), checkpoint_error);
  CHECK_THROWS_WITH(load_checkpoint("/dev/zero", m, opt),
                    Catch::Contains("checkpoint '/dev/zero' is a character device, expected a regular file"));
  CHECK_THROWS_WITH(load_checkpoint(dir.path, m, opt), Catch::Contains("is a directory, expected a regular file"));
  CHECK(m.flat_values() == before);
}

TEST_CASE("checkpoint: a file is read no further than a partrain header declares", "[train][checkpoint][hostile]") {
  temp_dir dir;
  toy_mlp<float, false> m(5);
  sgd opt(m, {.lr = 0.1});
  // Sparse files of a terabyte: read whole, each would exhaust memory.
  const auto huge = std::uintmax_t{1} << 40;
  const auto other = dir.path / "not_a_checkpoint";
  std::ofstream(other) << "not a checkpoint, and then a terabyte of zeros";
  std::error_code ec;
  fs::resize_file(other, huge, ec);
  if (ec) {
    WARN("no sparse files here (" << ec.message() << "); skipped");
    return;
  }
  // Another kind of file: its first 24 bytes say so.
  CHECK_THROWS_WITH(load_checkpoint(other, m, opt), Catch::Contains("is not a partrain checkpoint (bad magic"));
  // A checkpoint's header with a terabyte after it: the header says how much is payload.
  const auto padded = dir.path / "padded.ckpt";
  save_checkpoint(padded, m, opt);
  const auto saved = fs::file_size(padded);
  fs::resize_file(padded, huge);
  CHECK_THROWS_WITH(load_checkpoint(padded, m, opt),
                    Catch::Contains("checkpoint '" + padded.string() + "' has trailing bytes: the header says " +
                                    std::to_string(saved - 24) + " payload bytes, the file has " + std::to_string(huge - 24)));
}

TEST_CASE("checkpoint: a save removes the temporaries that dead processes left behind", "[train][checkpoint]") {
  temp_dir dir;
  const auto file = dir.path / "ckpt.bin";
  const std::string host = detail::ckpt::host_name();
  // A pid that surely ended: a child that exited and was reaped.
  const pid_t child = ::fork();
  if (child == 0) ::_exit(0);
  REQUIRE(child > 0);
  int status = 0;
  REQUIRE(::waitpid(child, &status, 0) == child);
  const auto stale = dir.path / ("ckpt.bin.tmp." + host + "." + std::to_string(child));
  const auto stale_old_format = dir.path / ("ckpt.bin.tmp." + std::to_string(child));
  const auto live = dir.path / ("ckpt.bin.tmp." + host + "." + std::to_string(::getppid()));  // a save in progress
  const auto other_host = dir.path / ("ckpt.bin.tmp.elsewhere-node." + std::to_string(child));  // shared folders
  const auto other_file = dir.path / ("other.bin.tmp." + host + "." + std::to_string(child));
  for (const auto& p : {stale, stale_old_format, live, other_host, other_file}) write(p, {std::byte{1}});
  toy_mlp<float, false> m(7);
  sgd opt(m, {.lr = 0.1});
  save_checkpoint(file, m, opt);
  CHECK(fs::exists(file));
  CHECK_FALSE(fs::exists(stale));
  CHECK_FALSE(fs::exists(stale_old_format));
  CHECK(fs::exists(live));
  CHECK(fs::exists(other_host));
  CHECK(fs::exists(other_file));
}

TEST_CASE("checkpoint: a version 1 file (no trainer state) is still read", "[train][checkpoint]") {
  temp_dir dir;
  const auto file = dir.path / "ckpt.bin";
  toy_mlp<float, false> m(7);
  sgd opt(m, {.lr = 0.1, .momentum = 0.9});
  m.train_step(make_toy_batch<float>(0, 8));
  opt.step();
  save_checkpoint(file, m, opt, {.epoch = 3, .user = {std::byte{9}}, .trainer_state = {std::byte{4}, std::byte{5}}});
  toy_mlp<float, false> back(5);
  sgd bopt(back, {.lr = 0.1, .momentum = 0.9});
  CHECK(load_checkpoint(file, back, bopt).trainer_state == std::vector<std::byte>{std::byte{4}, std::byte{5}});
  // Version 1 is version 3 without the trailing buffers (a u64 length, 0 here) and trainer-state
  // field (a u64 length and its bytes).
  auto v1 = read(file);
  v1.resize(v1.size() - 8 - 8 - 2);
  const std::uint32_t version = 1;
  const std::uint64_t size = v1.size() - checkpoint_header_bytes;
  const std::uint32_t crc = detail::crc32(std::span<const std::byte>(v1).subspan(checkpoint_header_bytes));
  std::memcpy(v1.data() + 8, &version, 4);
  std::memcpy(v1.data() + 12, &crc, 4);
  std::memcpy(v1.data() + 16, &size, 8);
  write(file, v1);
  toy_mlp<float, false> old(5);
  sgd oopt(old, {.lr = 0.1, .momentum = 0.9});
  const auto extra = load_checkpoint(file, old, oopt);
  CHECK(extra.epoch == 3);
  CHECK(extra.user == std::vector<std::byte>{std::byte{9}});
  CHECK(extra.trainer_state.empty());
  CHECK(old.flat_values() == m.flat_values());
}
