// partrain/comm/detail/gloo_context.hpp: building a connected Gloo context (TCP device,
// full mesh through our store, timeouts) and the element-wise reduce functions Gloo calls.
// Shared by gloo_group and by bench_collectives, which times raw Gloo on the same setup.
#pragma once

#if !__has_include(<gloo/rendezvous/context.h>)
#error "partrain/comm/detail/gloo_context.hpp needs Gloo (Debian libgloo-dev); link partrain::gloo"
#endif

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <type_traits>
#include <utility>

#include <gloo/allreduce.h>
#include <gloo/common/error.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
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
