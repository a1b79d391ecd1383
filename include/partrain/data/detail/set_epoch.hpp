// partrain/data/detail/set_epoch.hpp: forwards set_epoch(e) through wrapping views (ref_view,
// owning_view, partrain's adaptors) to the sampler underneath, if there is one.
#pragma once

#include <cstdint>
#include <utility>

namespace partrain::inline v0::detail::data {

template <class R>
concept has_set_epoch = requires(R& r, std::uint64_t e) { r.set_epoch(e); };

template <class R>
concept has_base = requires(R& r) { r.base(); };

// Returns whether some sampler in the chain took the epoch.
template <class R>
constexpr bool forward_set_epoch(R& r, std::uint64_t epoch) {
  if constexpr (has_set_epoch<R>) {
    (void)r.set_epoch(epoch);
    return true;
  } else if constexpr (has_base<R>) {
    auto&& inner = r.base();
    if constexpr (std::is_lvalue_reference_v<decltype(inner)>) {
      return forward_set_epoch(inner, epoch);
    } else {
      return false;  // base() returned a copy: setting its epoch would change nothing
    }
  } else {
    return false;
  }
}

}  // namespace partrain::inline v0::detail::data
