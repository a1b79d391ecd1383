// bench/support/median.hpp: the benchmarks' summary of alternated windows or rounds: the
// median, the upper of the two middle values for an even count (0 for none).
#pragma once

#include <algorithm>
#include <vector>

namespace partrain::bench {

[[nodiscard]] inline double median(std::vector<double> v) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace partrain::bench
