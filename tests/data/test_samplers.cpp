// Samplers as views: PyTorch's DistributedSampler semantics (worked examples and a literal
// transcription of its __iter__ as the reference), shuffling, batching, the weighted split.
#include <catch2/catch.hpp>

#include <partrain/data/batched.hpp>
#include <partrain/data/distributed.hpp>
#include <partrain/data/sequential.hpp>
#include <partrain/data/shard.hpp>
#include <partrain/data/shuffled.hpp>
#include <partrain/data/weighted_split.hpp>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <map>
#include <limits>
#include <numeric>
#include <ranges>
#include <set>
#include <vector>

using namespace partrain;
using indices = std::vector<std::size_t>;

namespace {

template <class R>
indices to_vector(R&& r) {
  indices out;
  for (auto i : r) out.push_back(static_cast<std::size_t>(i));
  return out;
}

// DistributedSampler.__iter__ transcribed line by line (torch/utils/data/distributed.py).
indices reference_distributed(indices order, std::size_t world, std::size_t rank, bool drop_last) {
  const std::size_t n = order.size();
  const std::size_t num_samples =
      drop_last && n % world != 0
          ? static_cast<std::size_t>(std::ceil((static_cast<double>(n) - static_cast<double>(world)) / static_cast<double>(world)))
          : static_cast<std::size_t>(std::ceil(static_cast<double>(n) / static_cast<double>(world)));
  const std::size_t total = num_samples * world;
  if (!drop_last) {
    const std::size_t pad = total - n;
    if (pad <= n) {
      order.insert(order.end(), order.begin(), order.begin() + static_cast<std::ptrdiff_t>(pad));
    } else if (n > 0) {
      indices repeated;
      const std::size_t times = (pad + n - 1) / n;
      for (std::size_t t = 0; t < times; ++t) repeated.insert(repeated.end(), order.begin(), order.begin() + static_cast<std::ptrdiff_t>(n));
      order.insert(order.end(), repeated.begin(), repeated.begin() + static_cast<std::ptrdiff_t>(pad));
    }
  } else {
    order.resize(total);
  }
  REQUIRE(order.size() == total);
  indices mine;
  for (std::size_t p = rank; p < total; p += world) mine.push_back(order[p]);
  REQUIRE(mine.size() == num_samples);
  return mine;
}

}  // namespace

// Shape math at compile time: num_samples as DistributedSampler computes it.
static_assert(distributed_num_samples(10, 4, false) == 3);
static_assert(distributed_num_samples(10, 4, true) == 2);
static_assert(distributed_num_samples(12, 4, true) == 3);
static_assert(distributed_num_samples(2, 5, false) == 1);
static_assert(distributed_num_samples(2, 5, true) == 0);
static_assert(distributed_num_samples(0, 3, false) == 0);
// splitmix64's published first output for seed 0: the PRNG is the one we claim it is.
static_assert(detail::splitmix64(0)() == 0xe220a8397b1dcdafULL);
static_assert(std::ranges::random_access_range<distributed_view> && std::ranges::sized_range<distributed_view>);
static_assert(std::ranges::view<distributed_view> && std::ranges::view<shuffled_view> && std::ranges::view<sequential_view>);
static_assert(index_range<sequential_view>);

TEST_CASE("distributed: PyTorch's worked examples", "[data][sampler][distributed]") {
  const distributed_options plain{.shuffle = false};
  const distributed_options drop{.shuffle = false, .drop_last = true};
  const std::vector<indices> padded{{0, 4, 8}, {1, 5, 9}, {2, 6, 0}, {3, 7, 1}};
  const std::vector<indices> dropped{{0, 4}, {1, 5}, {2, 6}, {3, 7}};
  for (int r = 0; r < 4; ++r) {
    CHECK(to_vector(views::distributed(10, 4, r, plain)) == padded[static_cast<std::size_t>(r)]);
    CHECK(to_vector(views::distributed(10, 4, r, drop)) == dropped[static_cast<std::size_t>(r)]);
  }
  const std::vector<indices> tiny{{0}, {1}, {0}, {1}, {0}};
  for (int r = 0; r < 5; ++r) {
    CHECK(to_vector(views::distributed(2, 5, r, plain)) == tiny[static_cast<std::size_t>(r)]);
    CHECK(views::distributed(2, 5, r, drop).empty());
  }
}

TEST_CASE("distributed: matches DistributedSampler.__iter__ for 1 to 8 ranks", "[data][sampler][distributed]") {
  for (std::size_t n : {0u, 1u, 2u, 7u, 8u, 10u, 17u, 60u, 61u, 97u}) {
    for (int world = 1; world <= 8; ++world) {
      for (bool shuffle : {false, true}) {
        for (bool drop_last : {false, true}) {
          for (std::uint64_t epoch : {0u, 3u}) {
            const distributed_options o{.shuffle = shuffle, .seed = 7, .drop_last = drop_last};
            indices order(n);
            std::iota(order.begin(), order.end(), std::size_t{0});
            if (shuffle) order = detail::data::permutation(n, o.seed + epoch);
            for (int r = 0; r < world; ++r) {
              INFO("n=" << n << " world=" << world << " rank=" << r << " shuffle=" << shuffle
                        << " drop_last=" << drop_last << " epoch=" << epoch);
              const auto view = views::distributed(n, world, r, o).set_epoch(epoch);
              CHECK(to_vector(view) ==
                    reference_distributed(order, static_cast<std::size_t>(world), static_cast<std::size_t>(r), drop_last));
            }
          }
        }
      }
    }
  }
}

TEST_CASE("distributed: per-epoch properties of the ranks' shares", "[data][sampler][distributed]") {
  for (std::size_t n : {1u, 5u, 10u, 64u, 100u, 101u, 1000u}) {
    for (int world = 1; world <= 8; ++world) {
      for (bool drop_last : {false, true}) {
        INFO("n=" << n << " world=" << world << " drop_last=" << drop_last);
        const distributed_options o{.shuffle = true, .seed = 1234, .drop_last = drop_last};
        std::map<std::size_t, int> count;
        std::vector<indices> shares;
        for (int r = 0; r < world; ++r) {
          shares.push_back(to_vector(views::distributed(n, world, r, o).set_epoch(5)));
          for (auto i : shares.back()) ++count[i];
        }
        const std::size_t per_rank = distributed_num_samples(n, static_cast<std::size_t>(world), drop_last);
        for (const auto& s : shares) CHECK(s.size() == per_rank);  // equal length
        for (const auto& [i, c] : count) CHECK(i < n);
        const std::size_t total = per_rank * static_cast<std::size_t>(world);
        if (drop_last) {
          // Disjoint, and exactly n rounded down to a multiple of world_size of them.
          CHECK(count.size() == total);
          for (const auto& [i, c] : count) CHECK(c == 1);
        } else {
          // Cover the dataset; the total - n padded ones are repeats (at most ceil(total / n) each).
          CHECK(count.size() == n);
          std::size_t repeats = 0;
          for (const auto& [i, c] : count) repeats += static_cast<std::size_t>(c - 1);
          CHECK(repeats == total - n);
        }
      }
    }
  }
}

TEST_CASE("distributed: the order changes with the epoch, is fixed by the seed", "[data][sampler][distributed]") {
  const distributed_options o{.shuffle = true, .seed = 42};
  for (int r = 0; r < 4; ++r) {
    const auto e0 = to_vector(views::distributed(1000, 4, r, o).set_epoch(0));
    const auto e1 = to_vector(views::distributed(1000, 4, r, o).set_epoch(1));
    const auto again = to_vector(views::distributed(1000, 4, r, o).set_epoch(1));
    const auto other_seed = to_vector(views::distributed(1000, 4, r, {.shuffle = true, .seed = 43}).set_epoch(1));
    CHECK(e0 != e1);
    CHECK(e1 == again);
    CHECK(e1 != other_seed);
  }
  // set_epoch on an lvalue changes it in place; copies taken before keep their order.
  auto v = views::distributed(100, 2, 1, o);
  const auto before = v;
  v.set_epoch(9);
  CHECK(v.epoch() == 9);
  CHECK(to_vector(before) != to_vector(v));
  CHECK(to_vector(v) == to_vector(views::distributed(100, 2, 1, o).set_epoch(9)));
}

TEST_CASE("distributed: bad rank or world size is a clear error", "[data][sampler][distributed]") {
  CHECK_THROWS_WITH(views::distributed(10, 4, 4), Catch::Contains("rank 4 is out of range") &&
                                                      Catch::Contains("world_size = 4"));
  CHECK_THROWS_WITH(views::distributed(10, 4, -1), Catch::Contains("rank -1"));
  CHECK_THROWS_WITH(views::distributed(10, 0, 0), Catch::Contains("world_size is 0"));
}

TEST_CASE("sequential and shuffled samplers", "[data][sampler]") {
  CHECK(to_vector(views::sequential(5)) == indices{0, 1, 2, 3, 4});
  CHECK(views::sequential(0).empty());

  const auto s = views::shuffled(500, 3);
  auto sorted = to_vector(s);
  CHECK(sorted != to_vector(views::sequential(500)));  // 500! orders: identity would be a bug
  std::ranges::sort(sorted);
  CHECK(sorted == to_vector(views::sequential(500)));  // a permutation
  CHECK(to_vector(s) == to_vector(views::shuffled(500, 3)));
  CHECK(to_vector(s) != to_vector(views::shuffled(500, 3).set_epoch(1)));
  CHECK(to_vector(views::shuffled(500, 3).set_epoch(1)) == to_vector(views::shuffled(500, 3).set_epoch(1)));
  // shuffled(n, seed) at epoch e is the order distributed uses at world_size 1.
  CHECK(to_vector(views::shuffled(77, 5).set_epoch(2)) ==
        to_vector(views::distributed(77, 1, 0, {.seed = 5}).set_epoch(2)));
  // The frozen order for (n = 10, seed = 0): every platform and release must agree on it, or
  // resumed runs and mixed builds shuffle differently.
  CHECK(to_vector(views::shuffled(10, 0)) == detail::data::permutation(10, 0));
}

TEST_CASE("shuffle draws are uniform enough", "[data][sampler]") {
  // Position of element 0 over 4000 seeds of a 4-element shuffle: each of 4 places ~1000 times.
  std::array<int, 4> where{};
  for (std::uint64_t seed = 0; seed < 4000; ++seed) {
    const auto p = detail::data::permutation(4, seed);
    ++where[static_cast<std::size_t>(std::ranges::find(p, std::size_t{0}) - p.begin())];
  }
  for (int c : where) CHECK(std::abs(c - 1000) < 150);  // > 5 sigma
}

TEST_CASE("batched: fixed-size batches, last partial or dropped", "[data][sampler][batched]") {
  const auto b = views::sequential(10) | views::batched(4);
  REQUIRE(b.size() == 3);
  CHECK(to_vector(b[0]) == indices{0, 1, 2, 3});
  CHECK(to_vector(b[2]) == indices{8, 9});
  const auto d = views::sequential(10) | views::batched(4, true);
  REQUIRE(d.size() == 2);
  CHECK(to_vector(d[1]) == indices{4, 5, 6, 7});
  CHECK((views::sequential(3) | views::batched(4, true)).empty());

  // Over a container: lvalues are referenced, rvalues owned.
  std::vector<std::size_t> v{5, 6, 7};
  CHECK(to_vector((v | views::batched(2))[1]) == indices{7});
  CHECK(to_vector((std::vector<std::size_t>{1, 2, 3} | views::batched(2))[0]) == indices{1, 2});
  CHECK_THROWS_WITH(views::batched(0), Catch::Contains("batch_size is 0"));
}

TEST_CASE("batched: set_epoch reaches the distributed sampler underneath", "[data][sampler][batched]") {
  const distributed_options o{.seed = 11};
  auto b = views::distributed(50, 3, 2, o) | views::batched(4);
  b.set_epoch(6);
  const auto expect = views::distributed(50, 3, 2, o).set_epoch(6) | views::batched(4);
  REQUIRE(b.size() == expect.size());
  for (std::size_t k = 0; k < b.size(); ++k) CHECK(to_vector(b[k]) == to_vector(expect[k]));
}

TEST_CASE("weighted_shares: proportional within one row, summing to the batch", "[data][sampler][weighted]") {
  CHECK(weighted_shares(512, std::vector<double>{3, 1}) == indices{384, 128});
  CHECK(weighted_shares(10, std::vector<double>{1, 1, 1}) == indices{4, 3, 3});  // ties to the lower rank
  CHECK(weighted_shares(7, std::vector<double>{0, 1}) == indices{0, 7});
  for (std::size_t total : {0u, 1u, 5u, 63u, 256u, 1000u}) {
    for (const std::vector<double>& w : {std::vector<double>{1}, {1, 2}, {0.3, 0.3, 0.4}, {5, 1, 1, 1, 2.5}, {1, 1, 1, 1, 1, 1, 1, 1}}) {
      const auto s = weighted_shares(total, w);
      const double sum = std::accumulate(w.begin(), w.end(), 0.0);
      CHECK(std::accumulate(s.begin(), s.end(), std::size_t{0}) == total);
      for (std::size_t i = 0; i < w.size(); ++i) {
        CHECK(std::abs(static_cast<double>(s[i]) - static_cast<double>(total) * w[i] / sum) < 1.0);
      }
    }
  }
  CHECK_THROWS_WITH(weighted_shares(4, std::vector<double>{1, -1}), Catch::Contains("weight 1"));
  CHECK_THROWS_WITH(weighted_shares(4, std::vector<double>{0, 0}), Catch::Contains("sum to 0"));
  CHECK_THROWS_WITH(weighted_shares(4, std::vector<double>{}), Catch::Contains("no weights"));
}

TEST_CASE("weighted_split: ranks' shares tile every batch in order", "[data][sampler][weighted]") {
  const std::vector<double> speed{2.0, 1.0, 1.0};
  const auto global = views::shuffled(103, 9).set_epoch(1) | views::batched(32);
  std::vector<decltype(global | views::weighted_split(speed, 0))> ranks;
  for (int r = 0; r < 3; ++r) ranks.push_back(global | views::weighted_split(speed, r));
  for (std::size_t k = 0; k < global.size(); ++k) {
    indices joined;
    for (const auto& rank_view : ranks) {
      const auto part = to_vector(rank_view[k]);
      joined.insert(joined.end(), part.begin(), part.end());
    }
    CHECK(joined == to_vector(global[k]));
  }
  CHECK(ranks[0][0].size() == 16);
  CHECK(ranks[1][0].size() == 8);
  // The last batch has 103 - 96 = 7 rows: quotas 3.5, 1.75, 1.75 -> floors 3, 1, 1, and the two
  // rows left go to the largest remainders (0.75, 0.75): 3, 2, 2.
  CHECK(ranks[0][3].size() == 3);
  CHECK(ranks[1][3].size() == 2);
  CHECK(ranks[2][3].size() == 2);
  CHECK_THROWS_WITH(global | views::weighted_split(speed, 3), Catch::Contains("rank 3 is out of range"));

  // Composed closures, and set_epoch through the whole chain.
  const auto pipeline = views::batched(8) | views::weighted_split({1.0, 1.0}, 1);
  auto mine = views::shuffled(20, 4) | pipeline;
  const auto epoch0 = views::shuffled(20, 4) | views::batched(8);
  CHECK(to_vector(mine[0]) == indices(epoch0[0].begin() + 4, epoch0[0].end()));
  const auto reference = views::shuffled(20, 4).set_epoch(2) | views::batched(8);
  mine.set_epoch(2);
  CHECK(to_vector(mine[1]) == indices(reference[1].begin() + 4, reference[1].end()));
}

TEST_CASE("shard: contiguous blocks that hold every index once, without padding", "[data][sampler][shard]") {
  for (const std::size_t n : {0u, 1u, 5u, 10u, 10000u, 10001u}) {
    for (int w = 1; w <= 7; ++w) {
      std::vector<std::size_t> all;
      std::size_t smallest = n, largest = 0;
      for (int r = 0; r < w; ++r) {
        const auto v = views::shard(n, w, r);
        smallest = std::min(smallest, v.size());
        largest = std::max(largest, v.size());
        for (const std::size_t i : v) all.push_back(i);
      }
      INFO("n " << n << ", world " << w);
      std::vector<std::size_t> want(n);
      std::iota(want.begin(), want.end(), std::size_t{0});
      CHECK(all == want);  // in order, each once
      CHECK(largest - smallest <= 1);
    }
  }
  CHECK(std::ranges::equal(views::shard(10, 3, 1), std::vector<std::size_t>{3, 4, 5}));
  // Near the top of size_t: no overflow in the block bounds.
  const std::size_t huge = std::numeric_limits<std::size_t>::max() - 1;
  CHECK(views::shard(huge, 3, 2).element(views::shard(huge, 3, 2).size() - 1) == huge - 1);
  CHECK_THROWS_WITH(views::shard(10, 0, 0), Catch::Contains("world_size is 0"));
  CHECK_THROWS_WITH(views::shard(10, 2, 2), Catch::Contains("rank 2 is out of range"));
}
