// N gloo ranks as forked processes over a file store, each handing floats back to the test: what
// the gloo equivalence tests (DDP, ZeRO, FSDP) compare against a single process.
#pragma once

#include <catch2/catch.hpp>

#include <chrono>
#include <cstring>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

#include <partrain/comm/gloo.hpp>
#include <partrain/rendezvous/file_store.hpp>

#include "fork_ranks.hpp"
#include "temp_dir.hpp"

namespace partrain::testing {

// fn(group, out) runs in each forked rank; what it leaves in `out` comes back per rank. Without
// `outcomes` a rank that failed fails the test, naming it; with it, the caller judges them.
template <class Fn>
std::vector<std::vector<float>> run_gloo(int world, Fn fn, std::chrono::milliseconds timeout = std::chrono::seconds(20),
                                         std::vector<rank_outcome>* outcomes = nullptr) {
  temp_dir dir("partrain_gloo_ranks");
  const auto store_path = (dir.path / "store").string();
  auto out = fork_ranks(world, [&](int r) {
    process_group_options o;
    o.timeout = timeout;
    gloo_group g(std::make_shared<file_store>(store_path), r, world, o);
    std::vector<float> result;
    fn(g, result);
    std::ofstream f(dir.path / ("rank" + std::to_string(r)), std::ios::binary);
    f.write(reinterpret_cast<const char*>(result.data()), static_cast<std::streamsize>(result.size() * sizeof(float)));
  });
  if (outcomes) *outcomes = out;
  std::vector<std::vector<float>> results(static_cast<std::size_t>(world));
  for (int r = 0; r < world; ++r) {
    if (!outcomes) {
      INFO("rank " << r << ": " << out[static_cast<std::size_t>(r)].message);
      REQUIRE(out[static_cast<std::size_t>(r)].ok);
    }
    std::ifstream f(dir.path / ("rank" + std::to_string(r)), std::ios::binary);
    std::vector<char> bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    auto& v = results[static_cast<std::size_t>(r)];
    v.resize(bytes.size() / sizeof(float));
    if (!v.empty()) std::memcpy(v.data(), bytes.data(), v.size() * sizeof(float));
  }
  return results;
}

}  // namespace partrain::testing
