// tests/fuzz/replay_main.hpp: the main a fuzz target's source gets when built as an ordinary
// test (PARTRAIN_FUZZ_REPLAY_MAIN): it replays every file named on the command line, or in every
// folder named, through LLVMFuzzerTestOneInput, so the seed corpus runs in the suite with any
// compiler. Included at the end of the target's source, after LLVMFuzzerTestOneInput.
#pragma once

#ifdef PARTRAIN_FUZZ_REPLAY_MAIN
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <vector>

int main(int argc, char** argv) {
  std::size_t n = 0;
  auto run = [&](const std::filesystem::path& p) {
    std::ifstream in(p, std::ios::binary);
    std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    LLVMFuzzerTestOneInput(reinterpret_cast<const std::uint8_t*>(bytes.data()), bytes.size());
    ++n;
  };
  for (int i = 1; i < argc; ++i) {
    if (std::filesystem::is_directory(argv[i])) {
      for (const auto& e : std::filesystem::directory_iterator(argv[i])) run(e.path());
    } else {
      run(argv[i]);
    }
  }
  std::cout << "replayed " << n << " input(s)\n";
  return n > 0 ? 0 : 1;
}
#endif
