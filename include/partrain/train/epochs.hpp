// partrain/train/epochs.hpp: `views::epochs(n)`, the outer range of a training loop.
//
//   for (std::size_t epoch : views::epochs(10)) ...            // 0, 1, ..., 9
//   for (std::size_t epoch : views::epochs(resumed_at, 10)) ... // what a resumed run iterates
#pragma once

#include <cstddef>
#include <ranges>
#include <string>

#include <partrain/core/error.hpp>

namespace partrain::inline v0::views {

struct epochs_t {
  // Epochs [first, last): a resumed run starts at the epoch its checkpoint recorded.
  [[nodiscard]] auto operator()(std::size_t first, std::size_t last) const {
    if (first > last) {
      throw invalid_argument_error("views::epochs(" + std::to_string(first) + ", " + std::to_string(last) +
                                   "): the first epoch is past the last (expected first <= last)");
    }
    return std::views::iota(first, last);
  }
  [[nodiscard]] auto operator()(std::size_t count) const { return (*this)(0, count); }
};

inline constexpr epochs_t epochs{};

}  // namespace partrain::inline v0::views
