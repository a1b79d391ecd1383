// The loader: exactly the sampler's examples in order (synchronous and prefetching), partial and
// dropped last batches, set_epoch passthrough, the generator API, exceptions from the dataset,
// early stop, destruction mid-epoch, the bounded queue and the timeout. Run under TSan too.
#include <catch2/catch.hpp>

#include <partrain/data/distributed.hpp>
#include <partrain/data/in_memory_dataset.hpp>
#include <partrain/data/loader.hpp>
#include <partrain/data/sequential.hpp>
#include <partrain/data/shuffled.hpp>
#include <partrain/data/weighted_split.hpp>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

using namespace partrain;
using namespace std::chrono_literals;
using indices = std::vector<std::size_t>;

namespace {

// Row i holds i * 1000 + j in column j, label i % 10: every value says where it came from.
in_memory_dataset make_dataset(std::size_t n, std::size_t row = 5) {
  host_buffer<float> x(shape{n, row});
  std::vector<std::int32_t> y(n);
  for (std::size_t i = 0; i < n; ++i) {
    for (std::size_t j = 0; j < row; ++j) x[i * row + j] = static_cast<float>(i * 1000 + j);
    y[i] = static_cast<std::int32_t>(i % 10);
  }
  return {std::move(x), std::move(y), 10};
}

// Checks one batch against the indices it should hold.
void check_batch(const batch& b, const indices& expect, std::size_t row = 5) {
  REQUIRE(b.size() == expect.size());
  CHECK(std::ranges::equal(b.indices, expect));
  REQUIRE(b.features.shape() == shape{expect.size(), row});
  for (std::size_t k = 0; k < expect.size(); ++k) {
    CHECK(b.labels[k] == static_cast<std::int32_t>(expect[k] % 10));
    for (std::size_t j = 0; j < row; ++j) CHECK(b.features[k * row + j] == static_cast<float>(expect[k] * 1000 + j));
  }
}

template <class R>
std::vector<indices> expected_batches(const R& order, std::size_t batch_size, bool drop_last) {
  std::vector<indices> out;
  indices all(order.begin(), order.end());
  for (std::size_t first = 0; first < all.size(); first += batch_size) {
    const std::size_t last = std::min(first + batch_size, all.size());
    if (last - first < batch_size && drop_last) break;
    out.emplace_back(all.begin() + static_cast<std::ptrdiff_t>(first), all.begin() + static_cast<std::ptrdiff_t>(last));
  }
  return out;
}

// A dataset wrapper that can fail at one index, count fetches, or block until released.
struct instrumented_dataset {
  const in_memory_dataset* inner;
  std::size_t fail_at = static_cast<std::size_t>(-1);
  std::atomic<int>* fetches = nullptr;
  struct gate_t {
    std::mutex m;
    std::condition_variable cv;
    bool open = true;
  }* gate = nullptr;

  std::size_t size() const { return inner->size(); }
  shape example_shape() const { return inner->example_shape(); }
  void fetch(std::span<const std::size_t> idx, tensor_view<float> f, tensor_view<std::int32_t> l) const {
    if (gate) {
      std::unique_lock lock(gate->m);
      gate->cv.wait(lock, [&] { return gate->open; });
    }
    for (auto i : idx) {
      if (i == fail_at) throw data_error("example " + std::to_string(i) + " is unreadable");
    }
    if (fetches) ++*fetches;
    inner->fetch(idx, f, l);
  }
};

}  // namespace

static_assert(dataset<in_memory_dataset>);
static_assert(dataset<instrumented_dataset>);
static_assert(!dataset<int>);
static_assert(std::input_iterator<loader<in_memory_dataset, sequential_view>::iterator>);

TEST_CASE("loader yields exactly the sampler's examples in order", "[data][loader]") {
  const auto ds = make_dataset(103);
  for (std::size_t prefetch : {0u, 1u, 2u, 5u}) {
    for (bool drop_last : {false, true}) {
      INFO("prefetch=" << prefetch << " drop_last=" << drop_last);
      const auto order = views::shuffled(ds.size(), 17).set_epoch(2);
      loader l(ds, order, {.batch_size = 10, .drop_last = drop_last, .prefetch = prefetch});
      const auto expect = expected_batches(order, 10, drop_last);
      CHECK(l.size() == expect.size());
      std::size_t k = 0;
      for (const batch& b : l) {
        REQUIRE(k < expect.size());
        check_batch(b, expect[k++]);
      }
      CHECK(k == expect.size());
      CHECK(l.stats().batches == expect.size());
    }
  }
}

TEST_CASE("a batch_size far beyond the data set is one batch of all of it, not a huge allocation", "[data][loader]") {
  const auto ds = make_dataset(37);
  // 10^12 rows of 5 floats would be 20 TB: the loader must size its slots by the data set.
  loader l(ds, views::sequential(ds.size()), {.batch_size = std::size_t{1'000'000'000'000}, .prefetch = 2});
  std::size_t batches = 0;
  for (const batch& b : l) {
    CHECK(b.size() == 37);
    ++batches;
  }
  CHECK(batches == 1);
}

TEST_CASE("loader over a distributed sampler, with set_epoch passed through", "[data][loader]") {
  const auto ds = make_dataset(50);
  const distributed_options o{.shuffle = true, .seed = 3};
  loader l(ds, views::distributed(ds.size(), 3, 1, o), {.batch_size = 4, .prefetch = 2});
  for (std::uint64_t epoch : {0u, 1u, 4u}) {
    CHECK(l.set_epoch(epoch));
    const auto expect = expected_batches(views::distributed(ds.size(), 3, 1, o).set_epoch(epoch), 4, false);
    std::size_t k = 0;
    for (const batch& b : l) check_batch(b, expect.at(k++));
    CHECK(k == expect.size());
  }
  // A plain index vector has no epoch to set.
  loader plain(ds, indices{1, 2, 3}, {.batch_size = 2});
  CHECK_FALSE(plain.set_epoch(1));
}

TEST_CASE("loader over a sampler of batches (weighted split) uses them as given", "[data][loader]") {
  const auto ds = make_dataset(40);
  const std::vector<double> speed{3.0, 1.0};
  const auto global = views::sequential(ds.size()) | views::batched(8);
  for (int rank = 0; rank < 2; ++rank) {
    loader l(ds, global | views::weighted_split(speed, rank), {.prefetch = 1});
    std::size_t k = 0;
    for (const batch& b : l) {
      const indices all(global[k].begin(), global[k].end());
      const auto expect = rank == 0 ? indices(all.begin(), all.begin() + 6) : indices(all.begin() + 6, all.end());
      check_batch(b, expect);
      ++k;
    }
    CHECK(k == 5);
  }
}

TEST_CASE("loader as a coroutine generator", "[data][loader][generator]") {
  const auto ds = make_dataset(23);
  for (std::size_t prefetch : {0u, 3u}) {
    loader l(ds, views::sequential(ds.size()), {.batch_size = 5, .prefetch = prefetch});
    const auto expect = expected_batches(views::sequential(ds.size()), 5, false);
    std::size_t k = 0;
    for (const batch& b : l.batches()) check_batch(b, expect.at(k++));
    CHECK(k == 5);
  }
}

TEST_CASE("an exception in the dataset reaches the consumer at its batch", "[data][loader]") {
  const auto inner = make_dataset(30);
  const instrumented_dataset ds{.inner = &inner, .fail_at = 17};
  for (std::size_t prefetch : {0u, 2u}) {
    INFO("prefetch=" << prefetch);
    loader l(ds, views::sequential(ds.size()), {.batch_size = 4, .prefetch = prefetch});
    std::size_t seen = 0;
    const auto consume = [&] {
      for (const batch& b : l) seen += b.size();
    };
    CHECK_THROWS_WITH(consume(), Catch::Contains("example 17 is unreadable"));
    CHECK(seen == 16);  // batches 0..3 arrived, batch 4 (16..19) failed
    // The loader is usable again: a new epoch starts from the beginning.
    auto it = l.begin();
    CHECK(it->indices[0] == 0);
  }
}

TEST_CASE("stopping early and destroying mid-epoch are clean", "[data][loader][threads]") {
  const auto inner = make_dataset(1000, 16);
  std::atomic<int> fetches{0};
  const instrumented_dataset ds{.inner = &inner, .fetches = &fetches};
  for (int round = 0; round < 20; ++round) {
    loader l(ds, views::shuffled(ds.size(), 1), {.batch_size = 7, .prefetch = 3});
    for (const batch& b : l) {
      if (b.indices[0] % 3 == 0) break;  // stop early, at a data-dependent point
    }
    // A second epoch after a break starts cleanly; destroying the loader mid-epoch joins the thread.
    auto it = l.begin();
    ++it;
    CHECK(it->size() == 7);
  }
  CHECK(fetches.load() > 0);
}

TEST_CASE("the queue is bounded by prefetch", "[data][loader][threads]") {
  const auto inner = make_dataset(200);
  std::atomic<int> fetches{0};
  const instrumented_dataset ds{.inner = &inner, .fetches = &fetches};
  loader l(ds, views::sequential(ds.size()), {.batch_size = 10, .prefetch = 2});
  auto it = l.begin();  // the consumer holds batch 0; the producer may fill batches 1 and 2 only
  for (int i = 0; i < 500 && fetches.load() < 3; ++i) std::this_thread::sleep_for(10ms);
  std::this_thread::sleep_for(50ms);
  CHECK(fetches.load() == 3);
  ++it;  // releases batch 0: room for batch 3
  for (int i = 0; i < 500 && fetches.load() < 4; ++i) std::this_thread::sleep_for(10ms);
  std::this_thread::sleep_for(50ms);
  CHECK(fetches.load() == 4);
  CHECK(it->indices[0] == 10);
}

TEST_CASE("a stuck dataset gives a timeout error, not a hang", "[data][loader][threads]") {
  const auto inner = make_dataset(20);
  instrumented_dataset::gate_t gate;
  gate.open = false;
  const instrumented_dataset ds{.inner = &inner, .gate = &gate};
  {
    loader l(ds, views::sequential(ds.size()), {.batch_size = 4, .prefetch = 1, .timeout = 50ms});
    // (One begin() only: a second would stop the epoch, which waits for the blocked fetch.)
    std::string message;
    try {
      (void)l.begin();
    } catch (const timeout_error& e) {
      message = e.what();
    }
    CHECK_THAT(message, Catch::Contains("batch 0 was not ready within 50 ms"));
    // Open the gate before the loader (and its thread, blocked in fetch) is destroyed.
    {
      std::lock_guard lock(gate.m);
      gate.open = true;
    }
    gate.cv.notify_all();
  }
  SUCCEED("the loader was destroyed after the dataset unblocked");
}

TEST_CASE("loader argument errors", "[data][loader]") {
  const auto ds = make_dataset(5);
  CHECK_THROWS_WITH(loader(ds, views::sequential(5), {.batch_size = 0}), Catch::Contains("batch_size is 0"));
  loader bad(ds, indices{1, 9}, {.batch_size = 2, .prefetch = 1});
  CHECK_THROWS_WITH(bad.begin(), Catch::Contains("index 9 is out of range for a dataset of 5"));
}
