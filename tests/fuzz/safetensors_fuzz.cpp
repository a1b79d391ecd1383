// libFuzzer target for the safetensors reader (train/safetensors.hpp): any byte string either
// parses or is refused with a checkpoint_error; nothing may crash, read out of bounds or allocate
// past the input. What parses must survive a round trip: written again and read back, the same
// tensors (names, dtypes, shapes, bytes) and metadata. Build and run: see tests/fuzz/safetensors.cmake.
// With PARTRAIN_FUZZ_REPLAY_MAIN it is a plain program that replays files (the seed corpus in the
// normal test suite, where clang's libFuzzer is not used).
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include <partrain/train/safetensors.hpp>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const auto* b = reinterpret_cast<const std::byte*>(data);
  partrain::safetensors_file f;
  try {
    f = partrain::parse_safetensors(std::vector<std::byte>(b, b + size), "fuzz-input");
  } catch (const partrain::checkpoint_error& e) {
    if (std::string_view(e.what()).find("fuzz-input") == std::string_view::npos) __builtin_trap();  // names the file
    return 0;
  }
  const auto again = partrain::parse_safetensors(partrain::safetensors_bytes(f.tensors(), f.metadata()));
  if (again.metadata() != f.metadata() || again.tensors().size() != f.tensors().size()) __builtin_trap();
  for (const auto& t : f.tensors()) {
    const auto* u = again.find(t.name);
    if (!u || u->dtype_name != t.dtype_name || u->shape != t.shape ||
        !std::ranges::equal(u->data, t.data)) {
      __builtin_trap();
    }
  }
  return 0;
}

#include "replay_main.hpp"
