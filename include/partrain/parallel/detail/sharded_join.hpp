// partrain/parallel/detail/sharded_join.hpp: what ZeRO and FSDP share around their collectives:
// the checks of the join protocol (PyTorch's Join, for uneven inputs; every step the active ranks
// all_reduce {1, synchronising ? 1 : 0} and the ranks inside join() {0, 0}: the sums say how many
// ranks still have data and whether their step reduces), and how a failed wait is reported.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include <partrain/core/error.hpp>
#include <partrain/core/work.hpp>

namespace partrain::inline v0::detail::zero {

// join() may start: the option is on and no no_sync micro-step still waits for its reduction.
inline void check_join_allowed(bool enabled, std::size_t accumulated, const std::string& where, std::string_view options) {
  if (!enabled) {
    throw config_error(where + "join() needs join enabled: construct with " + std::string(options) +
                       "{.join = true} (every rank then agrees each step on which ranks still have data)");
  }
  if (accumulated > 0) {
    throw invalid_argument_error(where + "join() with " + std::to_string(accumulated) +
                                 " no_sync micro-steps not yet reduced (finish them with a synchronizing step first)");
  }
}

// The active ranks' agreement: every one of them inside no_sync, or none.
inline void check_active_ranks(const std::array<std::int64_t, 2>& flag, const std::string& where) {
  if (flag[1] != 0 && flag[1] != flag[0]) {
    throw invalid_argument_error(where + std::to_string(flag[0] - flag[1]) + " of " + std::to_string(flag[0]) +
                                 " active ranks are inside no_sync and the others are not (all ranks must "
                                 "accumulate the same micro-steps)");
  }
}

// Waits for w. A failure keeps its type and fields (an echo stays an aborted_error; the rank and
// operation are filled where the backend knew none), its text led by `context` (this rank, the
// class and what it waited for); a timeout's text ends with `timeout_hint`.
inline void wait_named(const work& w, const std::string& context, int rank, std::string_view operation,
                       std::string_view timeout_hint) {
  try {
    w.wait();
  } catch (const aborted_error& e) {
    throw aborted_error(context, e);
  } catch (const timeout_error& e) {
    throw timeout_error(context + " failed: " + unprefixed(e.what()) + std::string(timeout_hint),
                        site_or(e, rank, operation));
  } catch (const communication_error& e) {
    throw communication_error(context + " failed: " + unprefixed(e.what()), site_or(e, rank, operation));
  }
}

}  // namespace partrain::inline v0::detail::zero
