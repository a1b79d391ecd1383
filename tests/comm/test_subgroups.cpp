// Groups made from a group (comm/subgroups.hpp) on the local backend: new_subgroups makes hosts
// of consecutive ranks, split_group any partition by color; each new group has its own ranks,
// size and collectives, the parent goes on working, splits may nest; bad sizes and colors are
// refused by name. (gloo and mpi: test_gloo.cpp and test_mpi.cpp.)
#include <catch2/catch.hpp>

#include <partrain/comm/local.hpp>
#include <partrain/comm/subgroups.hpp>

#include <chrono>
#include <cstdint>
#include <vector>

using namespace partrain;

namespace {

// The sum over the group of each member's parent rank, all-reduced in the group.
std::int64_t sum_of_parent_ranks(process_group& sub, int parent_rank) {
  std::vector<std::int64_t> v{parent_rank};
  sub.all_reduce(tensor_view<std::int64_t>(v)).wait();
  return v[0];
}

}  // namespace

TEST_CASE("new_subgroups: consecutive ranks form each host's group", "[comm][subgroups]") {
  std::vector<int> sizes(6), ranks(6);
  std::vector<std::int64_t> sums(6), parent_sums(6);
  run_local(6, [&](local_group& g) {
    const auto r = static_cast<std::size_t>(g.rank());
    std::unique_ptr<local_group> host = new_subgroups(g, 3);
    sizes[r] = host->size();
    ranks[r] = host->rank();
    sums[r] = sum_of_parent_ranks(*host, g.rank());
    parent_sums[r] = sum_of_parent_ranks(g, g.rank());  // the parent still works, in step
  }, {.timeout = std::chrono::seconds(10)});
  CHECK(sizes == std::vector<int>(6, 3));
  CHECK(ranks == std::vector<int>{0, 1, 2, 0, 1, 2});
  CHECK(sums == std::vector<std::int64_t>{3, 3, 3, 12, 12, 12});  // 0+1+2 and 3+4+5
  CHECK(parent_sums == std::vector<std::int64_t>(6, 15));
}

TEST_CASE("split_group: ranks of one color form a group in their parent order; splits nest", "[comm][subgroups]") {
  std::vector<int> ranks(5), sizes(5), inner_sizes(5);
  std::vector<std::int64_t> sums(5), inner_sums(5);
  run_local(5, [&](local_group& g) {
    const auto r = static_cast<std::size_t>(g.rank());
    auto parity = split_group(g, g.rank() % 2);  // {0, 2, 4} and {1, 3}
    ranks[r] = parity->rank();
    sizes[r] = parity->size();
    sums[r] = sum_of_parent_ranks(*parity, g.rank());
    // Twice from the same parent, then from a subgroup: each split has keys of its own.
    auto again = split_group(g, 0);
    auto inner = split_group(*parity, parity->rank() == 0 ? 1 : 2);
    inner_sizes[r] = inner->size();
    inner_sums[r] = sum_of_parent_ranks(*inner, g.rank());
    CHECK(sum_of_parent_ranks(*again, g.rank()) == 10);
  }, {.timeout = std::chrono::seconds(10)});
  CHECK(ranks == std::vector<int>{0, 0, 1, 1, 2});
  CHECK(sizes == std::vector<int>{3, 2, 3, 2, 3});
  CHECK(sums == std::vector<std::int64_t>{6, 4, 6, 4, 6});
  CHECK(inner_sizes == std::vector<int>{1, 1, 2, 1, 2});  // parity rank 0 alone: 0 and 1
  CHECK(inner_sums == std::vector<std::int64_t>{0, 1, 6, 3, 6});
}

TEST_CASE("subgroups: a size that does not divide the group, or a negative color, is refused", "[comm][subgroups][errors]") {
  run_local(4, [](local_group& g) {
    CHECK_THROWS_AS(new_subgroups(g, 3), invalid_argument_error);
    CHECK_THROWS_WITH(new_subgroups(g, 3), Catch::Contains("group_size 3 does not divide the group's 4 ranks"));
    CHECK_THROWS_WITH(new_subgroups(g, 0), Catch::Contains("group_size 0"));
    CHECK_THROWS_WITH(split_group(g, -1), Catch::Contains("split (local): color must be >= 0, got -1"));
    // Nothing was sent: the group is still in step.
    CHECK(sum_of_parent_ranks(g, g.rank()) == 6);
  });
}

TEST_CASE("subgroups: a rank that never splits leaves the others a timeout naming the split", "[comm][subgroups][errors]") {
  CHECK_THROWS_WITH(run_local(2, [](local_group& g) {
    if (g.rank() == 0) (void)new_subgroups(g, 1);
  }, {.timeout = std::chrono::milliseconds(300)}), Catch::Contains("rank 0 split") && Catch::Contains("every rank must call split"));
}
