// The IDX reader: round trips of files written here (plain and gzip, every element type), each
// kind of bad file, and the real Fashion-MNIST files (loaded once for the binary).
#include <catch2/catch.hpp>

#include <partrain/data/fashion_mnist.hpp>
#include <partrain/data/idx.hpp>
#include <partrain/data/idx_dataset.hpp>

#include "fifo.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <unistd.h>
#include <vector>

using namespace partrain;
namespace fs = std::filesystem;

namespace {

// A fresh directory per test case, removed afterwards.
struct temp_dir {
  fs::path path;
  temp_dir() {
    path = fs::temp_directory_path() / ("partrain_idx_" + std::to_string(::getpid()) + "_" + std::to_string(counter()++));
    fs::create_directories(path);
  }
  ~temp_dir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  static int& counter() {
    static int c = 0;
    return c;
  }
  fs::path operator/(const std::string& name) const { return path / name; }
};

void write_bytes(const fs::path& p, const std::vector<unsigned char>& bytes) {
  std::ofstream f(p, std::ios::binary);
  f.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

std::vector<std::uint8_t> pixel_pattern(std::size_t n) {
  std::vector<std::uint8_t> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<std::uint8_t>((i * 37 + 11) % 256);
  return v;
}

const in_memory_dataset& fashion_train() {
  static const in_memory_dataset ds = load_fashion_mnist(fashion_mnist_split::train);
  return ds;
}

}  // namespace

TEST_CASE("idx: round trip of every element type, plain and gzip", "[data][idx]") {
  temp_dir dir;
  for (bool gz : {false, true}) {
    const auto u8 = pixel_pattern(2 * 3 * 4);
    write_idx(dir / "u8.idx", idx_array::from(std::span<const std::uint8_t>(u8), shape{2, 3, 4}), gz);
    const auto a = read_idx(dir / "u8.idx");
    CHECK(a.type() == idx_type::u8);
    CHECK(a.shape() == shape{2, 3, 4});
    for (std::size_t i = 0; i < u8.size(); ++i) CHECK(a.at(i) == u8[i]);

    const std::vector<std::int16_t> i16{-32768, -1, 0, 1, 32767};
    write_idx(dir / "i16.idx", idx_array::from(std::span<const std::int16_t>(i16), shape{5}), gz);
    const auto b = read_idx(dir / "i16.idx");
    CHECK(b.type() == idx_type::i16);
    for (std::size_t i = 0; i < i16.size(); ++i) CHECK(b.at(i) == i16[i]);

    const std::vector<std::int32_t> i32{-2147483647 - 1, 7, 2147483647};
    write_idx(dir / "i32.idx", idx_array::from(std::span<const std::int32_t>(i32), shape{3, 1}), gz);
    const auto c = read_idx(dir / "i32.idx");
    for (std::size_t i = 0; i < i32.size(); ++i) CHECK(c.at(i) == i32[i]);

    const std::vector<float> f32{-1.5f, 0.0f, 3.25f, 1e-30f};
    write_idx(dir / "f32.idx", idx_array::from(std::span<const float>(f32), shape{2, 2}), gz);
    const auto d = read_idx(dir / "f32.idx");
    std::vector<float> back(4);
    d.to_float(back);
    CHECK(back == f32);

    const std::vector<double> f64{-1e300, 0.1, 2.0};
    write_idx(dir / "f64.idx", idx_array::from(std::span<const double>(f64), shape{3}), gz);
    const auto e = read_idx(dir / "f64.idx");
    for (std::size_t i = 0; i < f64.size(); ++i) CHECK(e.at(i) == f64[i]);

    const std::vector<std::int8_t> i8{-128, 0, 127};
    write_idx(dir / "i8.idx", idx_array::from(std::span<const std::int8_t>(i8), shape{3}), gz);
    CHECK(read_idx(dir / "i8.idx").at(0) == -128);
  }
  // Exact bytes of a tiny file: magic 0x00000901 (sbyte, one dimension), size 2, the values.
  const auto bytes = idx_array::from(std::span<const std::int8_t>(std::vector<std::int8_t>{1, 2}), shape{2}).serialize();
  CHECK(bytes == std::vector<std::byte>{std::byte{0}, std::byte{0}, std::byte{0x09}, std::byte{1}, std::byte{0},
                                        std::byte{0}, std::byte{0}, std::byte{2}, std::byte{1}, std::byte{2}});
}

TEST_CASE("idx: a dataset from written images and labels, with normalisation", "[data][idx]") {
  temp_dir dir;
  const std::size_t n = 6;
  const auto pixels = pixel_pattern(n * 2 * 3);
  const std::vector<std::uint8_t> labels{0, 1, 2, 9, 4, 5};
  write_idx(dir / "img.gz", idx_array::from(std::span<const std::uint8_t>(pixels), shape{n, 2, 3}), true);
  write_idx(dir / "lbl", idx_array::from(std::span<const std::uint8_t>(labels), shape{n}), false);

  const auto ds = load_idx_dataset(dir / "img.gz", dir / "lbl");
  REQUIRE(ds.size() == n);
  CHECK(ds.example_shape() == shape{6});
  CHECK(ds.features().shape() == shape{n, 6});
  for (std::size_t i = 0; i < pixels.size(); ++i) CHECK(ds.features()[i] == Approx(pixels[i] / 255.0f));
  CHECK(std::ranges::equal(ds.labels(), std::vector<std::int32_t>{0, 1, 2, 9, 4, 5}));

  const auto norm = load_idx_dataset(dir / "img.gz", dir / "lbl", {.mean = 0.5f, .std = 0.25f});
  for (std::size_t i = 0; i < pixels.size(); ++i) CHECK(norm.features()[i] == Approx((pixels[i] / 255.0f - 0.5f) / 0.25f));
  CHECK_THROWS_WITH(load_idx_dataset(dir / "img.gz", dir / "lbl", {.mean = 0.5f}), Catch::Contains("only one of mean and std"));
  CHECK_THROWS_WITH(load_idx_dataset(dir / "img.gz", dir / "lbl", {.mean = 0.5f, .std = 0.0f}), Catch::Contains("std is"));
}

TEST_CASE("idx: each kind of bad file gets an error naming the file and the problem", "[data][idx]") {
  temp_dir dir;
  const auto expect_error = [](const fs::path& p, const std::string& what) {
    INFO(p.string());
    CHECK_THROWS_AS(read_idx(p), data_error);
    CHECK_THROWS_WITH(read_idx(p), Catch::Contains(p.filename().string()) && Catch::Contains(what));
  };
  expect_error(dir / "missing.idx", "cannot open");
  fs::create_directories(dir / "a_directory");
  expect_error(dir / "a_directory", "is a directory, expected a regular file");
  write_bytes(dir / "magic", {0x12, 0x34, 0x08, 0x01, 0, 0, 0, 1, 7});
  expect_error(dir / "magic", "wrong magic 0x12340801");
  write_bytes(dir / "dtype", {0, 0, 0x0A, 0x01, 0, 0, 0, 1, 7});
  expect_error(dir / "dtype", "unsupported element type code 10");
  write_bytes(dir / "short", {0, 0});
  expect_error(dir / "short", "truncated");
  write_bytes(dir / "header", {0, 0, 0x08, 0x03, 0, 0, 0, 1});
  expect_error(dir / "header", "truncated header");
  write_bytes(dir / "data", {0, 0, 0x08, 0x02, 0, 0, 0, 2, 0, 0, 0, 3, 1, 2, 3});
  expect_error(dir / "data", "needs 6 bytes of data, the file has 3");
  write_bytes(dir / "trailing", {0, 0, 0x08, 0x01, 0, 0, 0, 1, 1, 2});
  expect_error(dir / "trailing", "1 unexpected bytes");
  write_bytes(dir / "rank0", {0, 0, 0x08, 0x00});
  expect_error(dir / "rank0", "0 dimensions");
  write_bytes(dir / "huge", {0, 0, 0x0E, 0x03, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff});
  expect_error(dir / "huge", "more data than can be addressed");
  write_bytes(dir / "big", {0, 0, 0x08, 0x01, 0xff, 0xff, 0xff, 0xff, 1, 2});
  expect_error(dir / "big", "needs 4294967295 bytes of data, the file has 2");

  // A gzip file cut short, and gzip garbage.
  const auto pixels = pixel_pattern(5000);
  write_idx(dir / "ok.gz", idx_array::from(std::span<const std::uint8_t>(pixels), shape{5000}), true);
  const auto size = fs::file_size(dir / "ok.gz");
  fs::copy_file(dir / "ok.gz", dir / "cut.gz");
  fs::resize_file(dir / "cut.gz", size / 2);
  expect_error(dir / "cut.gz", "truncated gzip");
  write_bytes(dir / "bad.gz", {0x1f, 0x8b, 0x08, 0, 0, 0, 0, 0, 0, 3, 0xde, 0xad, 0xbe, 0xef, 0, 0, 0, 0, 0, 0});
  expect_error(dir / "bad.gz", "gzip");
  // Writing into a folder that does not exist fails with the path, and leaves nothing behind.
  CHECK_THROWS_WITH(write_idx(dir / "no" / "such.idx", idx_array::from(std::span<const std::uint8_t>(pixels), shape{5000})),
                    Catch::Contains("cannot create") && Catch::Contains("such.idx.tmp"));
  // decode_idx reads from memory what read_idx reads from a file.
  const auto image = idx_array::from(std::span<const std::uint8_t>(pixels), shape{50, 100}).serialize();
  CHECK(decode_idx(image, "memory").shape() == shape{50, 100});
  CHECK(decode_idx(detail::data::gzip(image, "memory"), "memory").at(4999) == pixels[4999]);
  // A gzip bomb beyond the caller's limit.
  CHECK_THROWS_WITH(read_idx(dir / "ok.gz", {.max_bytes = 1000}), Catch::Contains("more than 1000 bytes"));

  // Images and labels that disagree, labels out of range.
  const std::vector<std::uint8_t> labels{0, 1, 12};
  write_idx(dir / "img", idx_array::from(std::span<const std::uint8_t>(pixel_pattern(8)), shape{2, 2, 2}));
  write_idx(dir / "lbl", idx_array::from(std::span<const std::uint8_t>(labels), shape{3}));
  CHECK_THROWS_WITH(load_idx_dataset(dir / "img", dir / "lbl"),
                    Catch::Contains("2 images but 3 labels") && Catch::Contains("img") && Catch::Contains("lbl"));
  write_idx(dir / "img3", idx_array::from(std::span<const std::uint8_t>(pixel_pattern(12)), shape{3, 2, 2}));
  CHECK_THROWS_WITH(load_idx_dataset(dir / "img3", dir / "lbl"),
                    Catch::Contains("label 2 is 12") && Catch::Contains("expected 0 <= label < 10"));
  CHECK_NOTHROW(load_idx_dataset(dir / "img3", dir / "lbl", {.num_classes = 13}));
}

TEST_CASE("idx: a FIFO or a device is refused by name before it is opened", "[data][idx][hostile]") {
  using namespace std::chrono_literals;
  temp_dir dir;
  // A FIFO blocks open() until a writer comes: the reader must not open it at all.
  const auto fifo = partrain::testing::make_fifo(dir / "train-images-idx3-ubyte.gz");
  const std::string refused = "IDX file '" + fifo.string() + "' is a FIFO, expected a regular file";
  CHECK_THAT(partrain::testing::error_within(5s, fifo, [&] { (void)read_idx(fifo); }), Catch::Contains(refused));
  write_idx(dir / "lbl", idx_array::from(std::span<const std::uint8_t>(std::vector<std::uint8_t>{1}), shape{1}));
  CHECK_THAT(partrain::testing::error_within(5s, fifo, [&] { (void)load_idx_dataset(fifo, dir / "lbl"); }),
             Catch::Contains(refused));
  // A device that never ends, refused by name (the limit only keeps a broken reader quick).
  CHECK_THROWS_AS(read_idx("/dev/zero", {.max_bytes = 1 << 20}), data_error);
  CHECK_THROWS_WITH(read_idx("/dev/zero", {.max_bytes = 1 << 20}),
                    Catch::Contains("IDX file '/dev/zero' is a character device, expected a regular file"));
  // A plain file larger than the limit is refused unread, by its size.
  write_idx(dir / "big.idx", idx_array::from(std::span<const std::uint8_t>(pixel_pattern(5000)), shape{5000}));
  CHECK_THROWS_WITH(read_idx(dir / "big.idx", {.max_bytes = 1000}), Catch::Contains("is 5008 bytes, more than 1000 bytes"));
}

TEST_CASE("idx: a gzip file is inflated no further than its header declares", "[data][idx][hostile]") {
  temp_dir dir;
  // The header declares 2 bytes of data; the stream holds 100,000 more.
  std::vector<std::byte> image = idx_array::from(std::span<const std::uint8_t>(std::vector<std::uint8_t>{1, 2}), shape{2}).serialize();
  image.resize(image.size() + 100000, std::byte{7});
  const auto gz = detail::data::gzip(image, "memory");
  CHECK_THROWS_WITH(decode_idx(gz, "extra.gz"),
                    Catch::Contains("IDX file 'extra.gz'") &&
                        Catch::Contains("decompresses past the 2 bytes of data its header declares for [2]"));
  // A stream whose header is wrong stops at the header: ten megabytes of zeros are refused by
  // their type code, not after inflating up to the limit.
  const auto zeros = detail::data::gzip(std::vector<std::byte>(10 << 20), "memory");
  CHECK_THROWS_WITH(decode_idx(zeros, "zeros.gz", {.max_bytes = 1 << 16}), Catch::Contains("unsupported element type code 0"));
  // read_idx takes the same path.
  {
    std::ofstream f(dir / "extra.gz", std::ios::binary);
    f.write(reinterpret_cast<const char*>(gz.data()), static_cast<std::streamsize>(gz.size()));
  }
  CHECK_THROWS_WITH(read_idx(dir / "extra.gz"), Catch::Contains("decompresses past the 2 bytes"));
}

TEST_CASE("idx: data that cannot train is refused where it is loaded, naming the file", "[data][idx][hostile]") {
  temp_dir dir;
  const std::vector<std::uint8_t> two_labels{1, 2};
  write_idx(dir / "lbl2", idx_array::from(std::span<const std::uint8_t>(two_labels), shape{2}));

  // A valid header of 0 images (and 0 labels): nothing to train on.
  write_idx(dir / "img0", idx_array::from(std::span<const std::uint8_t>(), shape{0, 28, 28}), true);
  write_idx(dir / "lbl0", idx_array::from(std::span<const std::uint8_t>(), shape{0}));
  CHECK_THROWS_AS(load_idx_dataset(dir / "img0", dir / "lbl0"), data_error);
  CHECK_THROWS_WITH(load_idx_dataset(dir / "img0", dir / "lbl0"),
                    Catch::Contains((dir / "img0").string()) && Catch::Contains("holds no images (shape [0, 28, 28])"));

  // Pixels /255 does not scale: refused by type unless the caller takes the values as they are.
  const std::vector<float> f32{0.f, 127.5f, 255.f, 1.f, 2.f, 3.f, 4.f, 5.f};
  write_idx(dir / "f32", idx_array::from(std::span<const float>(f32), shape{2, 2, 2}));
  CHECK_THROWS_WITH(load_idx_dataset(dir / "f32", dir / "lbl2"),
                    Catch::Contains((dir / "f32").string()) && Catch::Contains("images are float32, expected ubyte pixels"));
  const std::vector<std::int8_t> i8{-128, -1, 0, 1, 2, 3, 4, 127};
  write_idx(dir / "i8", idx_array::from(std::span<const std::int8_t>(i8), shape{2, 2, 2}));
  CHECK_THROWS_WITH(load_idx_dataset(dir / "i8", dir / "lbl2"), Catch::Contains("images are sbyte, expected ubyte pixels"));
  const auto raw = load_idx_dataset(dir / "f32", dir / "lbl2", {.scale = false});
  CHECK(raw.features()[1] == 127.5f);
  CHECK(load_idx_dataset(dir / "i8", dir / "lbl2", {.scale = false}).features()[0] == -128.f);
  // ... and a value that is not a number is refused, naming the image.
  auto with_nan = f32;
  with_nan[5] = std::numeric_limits<float>::quiet_NaN();
  write_idx(dir / "nan", idx_array::from(std::span<const float>(with_nan), shape{2, 2, 2}));
  CHECK_THROWS_WITH(load_idx_dataset(dir / "nan", dir / "lbl2", {.scale = false}),
                    Catch::Contains("value 5 (image 1) is nan, expected a finite number"));

  // Images of another size than asked.
  write_idx(dir / "u8", idx_array::from(std::span<const std::uint8_t>(pixel_pattern(8)), shape{2, 2, 2}));
  CHECK_NOTHROW(load_idx_dataset(dir / "u8", dir / "lbl2", {.image_shape = {2, 2}}));
  CHECK_THROWS_WITH(load_idx_dataset(dir / "u8", dir / "lbl2", {.image_shape = {2, 3}}),
                    Catch::Contains("images have shape [2, 2, 2], expected [N, 2, 3]"));

  // Fashion-MNIST's files: a test split of 32x32 images beside 28x28 training images is refused
  // when loaded, naming the test file (the two splits could not feed one model).
  write_idx(dir / "train-images-idx3-ubyte.gz", idx_array::from(std::span<const std::uint8_t>(pixel_pattern(2 * 784)), shape{2, 28, 28}), true);
  write_idx(dir / "train-labels-idx1-ubyte.gz", idx_array::from(std::span<const std::uint8_t>(two_labels), shape{2}), true);
  write_idx(dir / "t10k-images-idx3-ubyte.gz", idx_array::from(std::span<const std::uint8_t>(pixel_pattern(2 * 1024)), shape{2, 32, 32}), true);
  write_idx(dir / "t10k-labels-idx1-ubyte.gz", idx_array::from(std::span<const std::uint8_t>(two_labels), shape{2}), true);
  CHECK(load_fashion_mnist(fashion_mnist_split::train, fashion_mnist_normalization(), dir.path).size() == 2);
  CHECK_THROWS_WITH(load_fashion_mnist(fashion_mnist_split::test, fashion_mnist_normalization(), dir.path),
                    Catch::Contains((dir / "t10k-images-idx3-ubyte.gz").string()) &&
                        Catch::Contains("images have shape [2, 32, 32], expected [N, 28, 28]"));
}

TEST_CASE("idx: the real Fashion-MNIST training set", "[data][idx][fashion_mnist]") {
  const auto dir = fashion_mnist_dir();
  if (!fs::exists(dir / "train-images-idx3-ubyte.gz")) {
    WARN("Fashion-MNIST not found under " << dir << " (install dataset-fashion-mnist); skipped");
    return;
  }
  const auto& ds = fashion_train();
  CHECK(ds.size() == 60000);
  CHECK(ds.example_shape() == shape{784});
  // The first labels of train-labels-idx1-ubyte: ankle boot, t-shirt, t-shirt, dress, t-shirt.
  CHECK(std::ranges::equal(ds.labels().first(5), std::vector<std::int32_t>{9, 0, 0, 3, 0}));
  // Pixels scaled to [0, 1], both ends reached (a raw loop: this runs in debug builds too).
  float lo = 1e9f, hi = -1e9f;
  const float* x = ds.features().data();
  for (std::size_t i = 0, n = ds.features().size(); i < n; ++i) {
    lo = x[i] < lo ? x[i] : lo;
    hi = x[i] > hi ? x[i] : hi;
  }
  CHECK(lo == 0.0f);
  CHECK(hi == 1.0f);
  // Each of the 10 classes has 6000 examples.
  std::vector<int> per_class(10);
  for (auto y : ds.labels()) ++per_class[static_cast<std::size_t>(y)];
  CHECK(std::ranges::all_of(per_class, [](int c) { return c == 6000; }));
  // The test split reads too.
  const auto test = load_fashion_mnist(fashion_mnist_split::test);
  CHECK(test.size() == 10000);
}
