// partrain/parallel/detail/buckets.hpp: assignment of parameters to gradient buckets, and the check
// of the grad-ready reports that fill them.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include <partrain/core/error.hpp>

namespace partrain::inline v0 {

// One bucket of the layout DDP uses (what ddp_stats reports).
struct ddp_bucket_info {
  std::vector<std::size_t> params;  // parameter indices, in the bucket's memory order
  std::size_t elements = 0;
  std::size_t bytes = 0;
};

namespace detail::ddp {

// Walks the parameters in REVERSE order (backward finishes the last ones first) and closes a
// bucket once it holds at least its limit: first_bytes for the first bucket, cap_bytes for
// every later one. This is PyTorch's layout after its first-iteration rebuild, where the small
// first bucket holds the first-ready gradients so communication starts early. Buckets are
// reduced in this order.
[[nodiscard]] inline std::vector<ddp_bucket_info> assign_buckets(const std::vector<std::size_t>& numels,
                                                                 std::size_t element_bytes, std::size_t first_bytes,
                                                                 std::size_t cap_bytes) {
  std::vector<ddp_bucket_info> out;
  ddp_bucket_info open;
  for (std::size_t k = numels.size(); k-- > 0;) {
    open.params.push_back(k);
    open.elements += numels[k];
    open.bytes += numels[k] * element_bytes;
    const std::size_t limit = out.empty() ? first_bytes : cap_bytes;
    if (open.bytes >= limit) {
      out.push_back(std::move(open));
      open = {};
    }
  }
  if (!open.params.empty()) out.push_back(std::move(open));
  return out;
}

// The grad-ready contract (model/concepts.hpp) checked where DDP's and ZeRO's buckets take a
// report: an index the model has, reported once per step. `who` begins the message.
inline void check_grad_ready(std::string_view who, std::size_t i, std::size_t count, bool already_reported) {
  if (i >= count) {
    throw invalid_argument_error(std::string(who) + "grad-ready notification for parameter index " + std::to_string(i) +
                                 ", but the model has " + std::to_string(count) + " parameters");
  }
  if (already_reported) {
    throw invalid_argument_error(std::string(who) + "grad-ready notification for parameter " + std::to_string(i) +
                                 " came twice in one step (each gradient must be reported once, when final)");
  }
}

}  // namespace detail::ddp

}  // namespace partrain::inline v0
