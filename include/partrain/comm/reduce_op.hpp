// partrain/comm/reduce_op.hpp: reduction operators of the collectives (torch ReduceOp names).
#pragma once

#include <string_view>

namespace partrain::inline v0 {

enum class reduce_op { sum, avg, min, max, prod };

[[nodiscard]] constexpr std::string_view to_string(reduce_op op) noexcept {
  switch (op) {
    case reduce_op::sum: return "sum";
    case reduce_op::avg: return "avg";
    case reduce_op::min: return "min";
    case reduce_op::max: return "max";
    case reduce_op::prod: return "prod";
  }
  return "unknown";
}

}  // namespace partrain::inline v0
