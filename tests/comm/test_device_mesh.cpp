// device_mesh (comm/device_mesh.hpp): coordinates row-major with the last dimension innermost,
// each dimension's group and each flattened pair's holding exactly the ranks that differ only
// there (checked by summing world ranks in each), and the refusals, on a world of 8 threads.
#include <catch2/catch.hpp>

#include <partrain/comm/device_mesh.hpp>
#include <partrain/comm/local.hpp>

#include <array>
#include <string>
#include <vector>

using namespace partrain;

namespace {

// The sum of the world ranks in this rank's group: which ranks it holds.
int members_sum(process_group& g, int world_rank) {
  std::vector<int> v{world_rank};
  g.all_reduce(tensor_view<int>(v)).wait();
  return v[0];
}

}  // namespace

TEST_CASE("device_mesh: a 2 x 2 x 2 grid of 8 ranks and its groups", "[comm][device_mesh]") {
  std::vector<std::array<int, 11>> seen(8);
  run_local(8, [&](local_group& world) {
    device_mesh mesh(world, {{"pp", 2}, {"dp", 2}, {"tp", 2}});
    const int r = world.rank();
    auto& out = seen[static_cast<std::size_t>(r)];
    // Recorded here, checked below: Catch's assertions are not thread-safe.
    out = {mesh.coordinate("pp"), mesh.coordinate("dp"), mesh.coordinate("tp"), mesh.group("tp").size(),
           mesh.group("dp", "tp").size(), members_sum(mesh.group("tp"), r), members_sum(mesh.group("pp"), r),
           members_sum(mesh.group("dp", "tp"), r), mesh.group("tp").rank(), mesh.group("tp", "dp").rank(), mesh.size("pp")};
  });
  for (int r = 0; r < 8; ++r) {
    CAPTURE(r);
    const auto& s = seen[static_cast<std::size_t>(r)];
    const int pp = r / 4, dp = r / 2 % 2, tp = r % 2;
    CHECK((s[0] == pp && s[1] == dp && s[2] == tp));
    CHECK((s[3] == 2 && s[4] == 4));
    CHECK(s[5] == (r - tp) + (r - tp + 1));            // the two ranks that differ in tp: consecutive
    CHECK(s[6] == (r % 4) + (r % 4 + 4));              // pp: 4 apart
    CHECK(s[7] == 4 * pp + (4 * pp + 1) + (4 * pp + 2) + (4 * pp + 3));  // dp x tp: this pp stage's 4
    CHECK(s[8] == tp);               // ranked by their coordinate
    CHECK(s[9] == dp * 2 + tp);
    CHECK(s[10] == 2);
  }
}

TEST_CASE("device_mesh refuses sizes, names and dimensions it cannot use", "[comm][device_mesh]") {
  // Every refusal comes before any collective, so each rank meets it alone; rank 0 records them.
  std::vector<std::string> errors;
  auto message = [](auto&& f) -> std::string {
    try {
      f();
    } catch (const invalid_argument_error& e) {
      return e.what();
    }
    return "no error";
  };
  run_local(4, [&](local_group& world) {
    std::vector<std::string> mine{
        message([&] { device_mesh m(world, {{"dp", 2}, {"tp", 3}}); }),
        message([&] { device_mesh m(world, {{"tp", 2}, {"tp", 2}}); }),
        message([&] { device_mesh m(world, {{"dp", 4}, {"tp", 0}}); }),
        message([&] { device_mesh m(world, {}); })};
    device_mesh mesh(world, {{"dp", 2}, {"tp", 2}});
    mine.push_back(message([&] { (void)mesh.group("pp"); }));
    mine.push_back(message([&] { (void)mesh.group("tp", "tp"); }));
    if (world.rank() == 0) errors = std::move(mine);
  });
  REQUIRE(errors.size() == 6);
  CHECK_THAT(errors[0], Catch::Contains("dp 2 x tp 3 is 6 ranks, but the world has 4"));
  CHECK_THAT(errors[1], Catch::Contains("'tp' used twice"));
  CHECK_THAT(errors[2], Catch::Contains("'tp' has size 0"));
  CHECK_THAT(errors[3], Catch::Contains("no dimensions"));
  CHECK_THAT(errors[4], Catch::Contains("no dimension 'pp' in dp 2 x tp 2"));
  CHECK_THAT(errors[5], Catch::Contains("the same dimension twice"));
}
