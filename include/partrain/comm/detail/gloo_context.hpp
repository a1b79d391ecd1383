// partrain/comm/detail/gloo_context.hpp: building a connected Gloo context (TCP device,
// full mesh through our store, timeouts) and the element-wise reduce functions Gloo calls.
// Shared by gloo_group and by bench_collectives, which times raw Gloo on the same setup.
#pragma once

#if !__has_include(<gloo/rendezvous/context.h>)
#error "partrain/comm/detail/gloo_context.hpp needs Gloo (Debian libgloo-dev); link partrain::gloo"
#endif

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include <gloo/allreduce.h>
#include <gloo/common/error.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/transport/tcp/address.h>
#include <gloo/transport/tcp/device.h>

#include <partrain/comm/detail/gloo_store.hpp>
#include <partrain/comm/detail/host_reduce.hpp>
#include <partrain/comm/reduce_op.hpp>
#include <partrain/comm/store.hpp>
#include <partrain/core/dtype.hpp>
#include <partrain/core/error.hpp>

namespace partrain::inline v0::detail::gloo {

[[nodiscard]] inline std::string env_or(const char* name, const std::string& fallback) {
  const char* v = std::getenv(name);
  return (v && *v) ? std::string(v) : fallback;
}

// Where the TCP device listens: an explicit interface or host wins, then the environment
// (PARTRAIN_GLOO_IFNAME, PARTRAIN_GLOO_HOST), then loopback (single-host default).
[[nodiscard]] inline ::gloo::transport::tcp::attr device_attr(const std::string& ifname, const std::string& hostname) {
  ::gloo::transport::tcp::attr attr;
  if (!ifname.empty() || !hostname.empty()) {
    attr.iface = ifname;
    attr.hostname = hostname;
    return attr;
  }
  attr.iface = env_or("PARTRAIN_GLOO_IFNAME", "");
  attr.hostname = env_or("PARTRAIN_GLOO_HOST", "");
  if (attr.iface.empty() && attr.hostname.empty()) attr.hostname = "127.0.0.1";
  return attr;
}

// "gloo/<n>/" where n counts the groups this rank built on this store: every rank builds its
// groups in the same order (as in torch), so the n-th group meets under the same prefix.
[[nodiscard]] inline std::string next_prefix(const std::shared_ptr<store>& s, int rank) {
  static std::mutex m;
  static std::map<std::pair<const store*, int>, std::pair<std::weak_ptr<store>, int>> counters;
  std::lock_guard lock(m);
  auto& [owner, n] = counters[{s.get(), rank}];
  if (owner.expired()) {  // a new store at a recycled address starts over
    owner = s;
    n = 0;
  }
  return "gloo/" + std::to_string(n++) + "/";
}

[[nodiscard]] inline std::string describe_attr(const ::gloo::transport::tcp::attr& a) {
  std::string s;
  if (!a.iface.empty()) s += "interface '" + a.iface + "'";
  if (!a.hostname.empty()) s += (s.empty() ? "" : ", ") + std::string("host '") + a.hostname + "'";
  return s.empty() ? "default address" : s;
}

// Gloo's errors name a broken connection by the address its far end had ("Connection closed by
// peer [127.0.0.1]:41234"), never by rank. That address is one of two: the far end's own end of
// the connection, or (where this rank accepted the connection before it asked for it) the address
// the far end listened on, which Gloo's rendezvous left in the store under the far end's rank.
// So every rank also leaves, once connected, its own end of each pair ("<peer>=<address>;...").
[[nodiscard]] inline std::string endpoints_key(const std::string& prefix, int rank) {
  return prefix + "endpoints/" + std::to_string(rank);
}

inline void publish_endpoints(store& s, const std::string& prefix, ::gloo::Context& ctx) {
  std::string record;
  for (int peer = 0; peer < ctx.size; ++peer) {
    if (peer == ctx.rank) continue;
    record += std::to_string(peer) + "=" + ctx.getPair(peer)->address().str() + ";";
  }
  try {
    s.set(endpoints_key(prefix, ctx.rank), record);
  } catch (const std::exception&) {
    // Only a later error's peer name depends on it.
  }
}

// Whether `what` names `address` whole (":4123" is not ":41234").
[[nodiscard]] inline bool names_address(std::string_view what, std::string_view address) {
  if (address.empty()) return false;
  for (auto at = what.find(address); at != std::string_view::npos; at = what.find(address, at + 1)) {
    const auto end = at + address.size();
    if (end == what.size() || what[end] < '0' || what[end] > '9') return true;
  }
  return false;
}

// The rank whose address in Gloo's message `what` is the far end of its connection with `rank`;
// -1 when none is (or the store does not answer: then its host may be the one lost).
[[nodiscard]] inline int rank_named_in(store& s, const std::string& prefix, int rank, int size, std::string_view what) {
  if (what.find("]:") == std::string_view::npos || size < 2) return -1;
  const std::string mine = std::to_string(rank) + "=";
  const auto wait = std::chrono::milliseconds(500);
  // Only keys that exist are read, and the first store error ends the search (its host may be the
  // rank lost): naming the peer must never delay the error by more than a round trip or two.
  try {
    for (int r = 0; r < size; ++r) {
      if (r == rank) continue;
      // Where r listened for this rank: Gloo's rendezvous value, one address per peer of r's.
      const std::string listened = prefix + std::to_string(r);
      if (s.check({listened})) {
        const auto all = s.get(listened, wait);
        const std::size_t each = all.size() / static_cast<std::size_t>(size - 1);
        const std::size_t slot = static_cast<std::size_t>(rank > r ? rank - 1 : rank);
        if (each > 0 && (slot + 1) * each <= all.size()) {
          const auto* first = reinterpret_cast<const char*>(all.data()) + slot * each;
          const std::vector<char> bytes(first, first + each);
          try {  // Gloo's Address checks the size, and throws
            if (names_address(what, ::gloo::transport::tcp::Address(bytes).str())) return r;
          } catch (const std::exception&) {  // EnforceNotMet: not an address
          }
        }
      }
      if (s.check({endpoints_key(prefix, r)})) {
        const std::string record = s.get_string(endpoints_key(prefix, r), wait);
        for (std::size_t at = 0; at < record.size();) {
          const auto end = std::min(record.find(';', at), record.size());
          const std::string_view entry(record.data() + at, end - at);
          if (entry.starts_with(mine) && names_address(what, entry.substr(mine.size()))) return r;
          at = end + 1;
        }
      }
    }
  } catch (const std::exception&) {
  }
  return -1;
}

// Creates the TCP device and a full-mesh context with the timeout on it. Every rank must call
// this concurrently with the same prefix; it returns once all pairs are connected.
[[nodiscard]] inline std::shared_ptr<::gloo::Context> connect(const std::shared_ptr<store>& s, const std::string& prefix,
                                                               int rank, int size, std::chrono::milliseconds timeout,
                                                               const ::gloo::transport::tcp::attr& attr) {
  const std::string where = "rank " + std::to_string(rank) + " gloo rendezvous (world size " + std::to_string(size) +
                            ", store prefix '" + prefix + "', " + describe_attr(attr) + ")";
  std::shared_ptr<::gloo::transport::Device> dev;
  try {
    dev = ::gloo::transport::tcp::CreateDevice(attr);
  } catch (const std::exception& e) {
    throw config_error(where + ": cannot create the TCP device: " + e.what() +
                       " (set PARTRAIN_GLOO_IFNAME to an interface or PARTRAIN_GLOO_HOST to a local address)");
  }
  auto ctx = std::make_shared<::gloo::rendezvous::Context>(rank, size);
  ctx->setTimeout(timeout);  // connectFullMesh waits on the store with this timeout
  store_adapter adapter(s, prefix, timeout);
  try {
    ctx->connectFullMesh(adapter, dev);
  } catch (const timeout_error& e) {
    throw timeout_error(where + ": " + e.what());
  } catch (const partrain::error&) {
    throw;
  } catch (const std::exception& e) {
    throw communication_error(where + ": connecting to the peers failed: " + e.what());
  }
  publish_endpoints(*s, prefix, *ctx);
  return ctx;
}

using reduce_fn = ::gloo::AllreduceOptions::Func;

// Gloo's typed kernels where it has them; the 16-bit types reduce through float via
// host_reduce. Gloo calls fn(out, a, b, n) with out == a allowed.
[[nodiscard]] inline reduce_fn make_reduce_fn(dtype t, reduce_op op) {
  if (t == dtype::float16 || t == dtype::bfloat16) {
    return [t, op](void* c, const void* a, const void* b, std::size_t n) {
      const std::size_t bytes = n * size_of(t);
      if (c == a) {
        host_reduce(c, b, n, t, op);
      } else if (c == b) {
        host_reduce(c, a, n, t, op);  // every op here is commutative
      } else {
        std::memcpy(c, a, bytes);
        host_reduce(c, b, n, t, op);
      }
    };
  }
  return visit_dtype(t, [op]<class T>(std::type_identity<T>) -> reduce_fn {
    if constexpr (std::is_same_v<T, half> || std::is_same_v<T, bfloat16>) {
      throw invalid_argument_error("internal: 16-bit types take the host_reduce path");
    } else {
    switch (op) {
      case reduce_op::sum: case reduce_op::avg: return [](void* c, const void* a, const void* b, std::size_t n) { ::gloo::sum<T>(c, a, b, n); };
      case reduce_op::prod: return [](void* c, const void* a, const void* b, std::size_t n) { ::gloo::product<T>(c, a, b, n); };
      case reduce_op::min: return [](void* c, const void* a, const void* b, std::size_t n) { ::gloo::min<T>(c, a, b, n); };
      case reduce_op::max: return [](void* c, const void* a, const void* b, std::size_t n) { ::gloo::max<T>(c, a, b, n); };
    }
    throw invalid_argument_error("unknown reduce_op code " + std::to_string(static_cast<int>(op)));
    }
  });
}

}  // namespace partrain::inline v0::detail::gloo
