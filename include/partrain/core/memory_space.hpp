// partrain/core/memory_space.hpp: where the bytes of a view live.
#pragma once

#include <concepts>
#include <string_view>

namespace partrain::inline v0 {

struct host_space {
  static constexpr std::string_view name = "host";
};
struct cuda_space {
  static constexpr std::string_view name = "cuda";
};

// Short spellings used in tensor_view<float, host>.
using host = host_space;
using cuda = cuda_space;

template <class S>
concept memory_space = std::same_as<S, host_space> || std::same_as<S, cuda_space>;

}  // namespace partrain::inline v0
