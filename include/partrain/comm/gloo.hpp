// partrain/comm/gloo.hpp: the `gloo` backend, processes (on one host or several) over TCP with
// Gloo, the engine torch uses for CPU tensors. Collectives run in issue order on one worker
// thread (or on the thread that waits for one before it started); send/recv are posted at once
// and each is waited on its own pooled thread, so a rank may post sends and receives to a peer
// in any order before waiting on them. Every operation carries the group's timeout. After Gloo
// fails (a peer died, or stalled past the timeout) its context is not reusable: later calls fail
// at once saying so, and the caller builds a new group. Building one makes SIGPIPE harmless
// where it still has its default action (see detail/sigpipe.hpp).
#pragma once

#if !__has_include(<gloo/allreduce.h>)
#error "partrain/comm/gloo.hpp needs Gloo (Debian libgloo-dev); link partrain::gloo"
#endif

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/common/error.h>
#include <gloo/context.h>
#include <gloo/reduce.h>
#include <gloo/transport/unbound_buffer.h>
#include <gloo/types.h>

#include <partrain/comm/detail/gloo_context.hpp>
#include <partrain/comm/detail/host_reduce.hpp>
#include <partrain/comm/detail/sigpipe.hpp>
#include <partrain/comm/process_group.hpp>
#include <partrain/comm/store.hpp>
#include <partrain/core/executor.hpp>
#include <partrain/core/log.hpp>

namespace partrain::inline v0 {

// Transport choices of a gloo_group; empty fields fall back to the environment, then loopback.
struct gloo_options {
  std::string ifname{};    // interface to listen on, e.g. "eth0" (env PARTRAIN_GLOO_IFNAME)
  std::string hostname{};  // local address or host name to listen on (env PARTRAIN_GLOO_HOST)
  // Store key prefix of this group's rendezvous. Empty: "gloo/<n>/", n counting the groups this
  // rank built on the same store (ranks must then build their groups in the same order).
  std::string prefix{};
};

class gloo_group final : public process_group {
 public:
  gloo_group(std::shared_ptr<store> s, int rank, int size, process_group_options opts)
      : gloo_group(std::move(s), rank, size, opts, gloo_options{}) {}

  gloo_group(std::shared_ptr<store> s, int rank, int size, process_group_options opts, gloo_options gopts)
      : process_group(rank, size, opts) {
    if (!s) throw invalid_argument_error("gloo_group: the store is null (expected a connected rendezvous store)");
    if (opts.timeout.count() <= 0) {
      throw config_error("gloo_group: timeout must be positive, got " + std::to_string(opts.timeout.count()) + " ms");
    }
    // A peer that dies mid-write must fail this rank with our error, not kill it with SIGPIPE.
    (void)detail::gloo::survive_sigpipe();
    gopts.prefix = gopts.prefix.empty() ? detail::gloo::next_prefix(s, rank) : gopts.prefix;
    context_ = detail::gloo::connect(s, gopts.prefix, rank, size, opts.timeout,
                                    detail::gloo::device_attr(gopts.ifname, gopts.hostname));
    // Kept for split(), as PyTorch keeps the default group's store (on rank 0 of a tcp:// or
    // env:// job it is the store's server).
    store_ = std::move(s);
    gopts_ = std::move(gopts);
    PARTRAIN_LOG(debug, "rank " + std::to_string(rank) + " gloo group ready: world size " + std::to_string(size) +
                            ", store prefix '" + gopts_.prefix + "', every pair connected");
  }

  ~gloo_group() override {
    // Stop the threads first: they use the context.
    p2p_.reset();
    worker_.reset();
  }

  [[nodiscard]] std::string_view backend() const noexcept override { return "gloo"; }
  // The connected Gloo context, for code that calls Gloo directly (only while no op is pending).
  [[nodiscard]] const std::shared_ptr<gloo::Context>& context() const noexcept { return context_; }
  // Empty while the group is usable; else why it is not.
  [[nodiscard]] std::string failure() const {
    std::lock_guard lock(mutex_);
    return failure_;
  }

 protected:
  // A new Gloo context on the same store, under a prefix of its own (this group's, the split's
  // number and the color), so the subgroups' rendezvous keys never meet.
  std::unique_ptr<process_group> do_split(const split_request& r) override {
    gloo_options o = gopts_;
    o.prefix = gopts_.prefix + "split" + std::to_string(r.seq) + "/" + std::to_string(r.color) + "/";
    return std::make_unique<gloo_group>(store_, r.index, static_cast<int>(r.members.size()), options(), std::move(o));
  }
  work do_all_reduce(raw_tensor t, reduce_op op) override {
    if (t.count == 0) return work::completed();
    return run(collective::all_reduce, "", [this, t, op] {
      gloo::AllreduceOptions o(context_);
      visit_dtype(t.type, [&]<class T>(std::type_identity<T>) { o.setOutput(static_cast<T*>(t.data), t.count); });
      o.setReduceFunction(detail::gloo::make_reduce_fn(t.type, op));
      o.setTag(signature_tag(collective::all_reduce, t.type, t.count));
      o.setTimeout(timeout());
      gloo::allreduce(o);
      if (op == reduce_op::avg) detail::host_divide(t.data, t.count, t.type, size());
    });
  }

  work do_broadcast(raw_tensor t, int root) override {
    if (t.count == 0) return work::completed();
    return run(collective::broadcast, "root " + std::to_string(root), [this, t, root] {
      gloo::BroadcastOptions o(context_);
      visit_dtype(t.type, [&]<class T>(std::type_identity<T>) { o.setOutput(static_cast<T*>(t.data), t.count); });
      o.setRoot(root);
      o.setTag(signature_tag(collective::broadcast, t.type, t.count, root));
      o.setTimeout(timeout());
      gloo::broadcast(o);
    });
  }

  work do_reduce(raw_tensor t, int root, reduce_op op) override {
    if (t.count == 0) return work::completed();
    return run(collective::reduce, "root " + std::to_string(root), [this, t, root, op] {
      // Gloo's ring reduce uses the output as scratch on every rank; non-roots reduce into a
      // scratch copy so their buffers stay as they were (our contract, and torch's).
      std::byte* scratch = rank() == root ? nullptr : worker_scratch(t.bytes());
      gloo::ReduceOptions o(context_);
      visit_dtype(t.type, [&]<class T>(std::type_identity<T>) {
        if (rank() == root) {
          o.setOutput(static_cast<T*>(t.data), t.count);
        } else {
          o.setInput(static_cast<T*>(t.data), t.count);
          o.setOutput(reinterpret_cast<T*>(scratch), t.count);
        }
      });
      o.setRoot(root);
      o.setReduceFunction(detail::gloo::make_reduce_fn(t.type, op));
      o.setTag(signature_tag(collective::reduce, t.type, t.count, root));
      o.setTimeout(timeout());
      gloo::reduce(o);
      if (op == reduce_op::avg && rank() == root) detail::host_divide(t.data, t.count, t.type, size());
    });
  }

  work do_all_gather(raw_tensor in, raw_tensor out) override {
    if (in.count == 0) return work::completed();
    return run(collective::all_gather, "", [this, in, out] {
      gloo::AllgatherOptions o(context_);
      visit_dtype(in.type, [&]<class T>(std::type_identity<T>) {
        o.setInput(static_cast<T*>(in.data), in.count);
        o.setOutput(static_cast<T*>(out.data), out.count);
      });
      o.setTag(signature_tag(collective::all_gather, in.type, in.count));
      o.setTimeout(timeout());
      gloo::allgather(o);
    });
  }

  // Gloo's new-style API has no reduce_scatter, and its old halving-doubling one allocates per
  // call and slows down past a few MiB. So a ring over Gloo's own transport (its unbound
  // buffers): n-1 steps, each sending one block to the next rank and reducing the block received
  // from the previous one, (n-1)/n of the buffer per rank, the least a reduce_scatter can send.
  work do_reduce_scatter(raw_tensor in, raw_tensor out, reduce_op op) override {
    if (out.count == 0) return work::completed();
    return run(collective::reduce_scatter, "", [this, in, out, op] {
      const std::size_t n = static_cast<std::size_t>(size()), r = static_cast<std::size_t>(rank()), blk = out.bytes();
      std::byte* acc = worker_scratch(in.bytes() + blk);  // the partial sums, then one incoming block
      std::byte* incoming = acc + in.bytes();
      std::memcpy(acc, in.data, in.bytes());
      const auto slot = gloo::Slot::build(kRingSlotPrefix, signature_tag(collective::reduce_scatter, out.type, out.count));
      const int next = static_cast<int>((r + 1) % n), prev = static_cast<int>((r + n - 1) % n);
      auto receive = context_->createUnboundBuffer(incoming, blk);
      // Step s sends block r-s-1 and reduces into block r-s-2 (mod n): after n-1 steps block r
      // holds every rank's contribution.
      for (std::size_t s = 0; s + 1 < n; ++s) {
        const std::size_t send_block = (r + 2 * n - s - 1) % n, recv_block = (r + 2 * n - s - 2) % n;
        auto send = context_->createUnboundBuffer(acc + send_block * blk, blk);
        send->send(next, slot);
        receive->recv(prev, slot);
        receive->waitRecv(timeout());
        detail::host_reduce(acc + recv_block * blk, incoming, out.count, out.type, op);
        send->waitSend(timeout());
      }
      std::memcpy(out.data, acc + r * blk, blk);
      if (op == reduce_op::avg) detail::host_divide(out.data, out.count, out.type, size());
    });
  }

  work do_barrier() override {
    return run(collective::barrier, "", [this] {
      gloo::BarrierOptions o(context_);
      o.setTag(signature_tag(collective::barrier, dtype::uint8, 0));
      o.setTimeout(timeout());
      gloo::barrier(o);
    });
  }

  work do_send(raw_tensor t, int dst, int tag) override {
    return post_p2p(collective::send, t, dst, tag);
  }
  work do_recv(raw_tensor t, int src, int tag) override {
    return post_p2p(collective::recv, t, src, tag);
  }

 private:
  // The slot prefix of our own ring collectives (Gloo's use 0x01-0x08).
  static constexpr std::uint8_t kRingSlotPrefix = 0x7f;

  // Gloo's I/O thread copies an incoming message into the buffer posted on its slot and, when the
  // message is larger, throws on that thread of Gloo's, where nothing can catch it: the process
  // ends with SIGABRT ("op.preamble.length <= op.nbytes"). So calls that differ between ranks must
  // never meet on a slot. One collective runs at a time (one worker), so its tag (the 32 bits of
  // its slot under Gloo's prefix byte) is free to carry a hash of what was called: kind, element
  // type, count and root. Calls that differ then wait on different slots and fail at the group's
  // timeout, on every rank, as this rank's sited error.
  [[nodiscard]] static std::uint32_t signature_tag(collective c, dtype t, std::size_t count, int root = -1) noexcept {
    std::uint32_t h = 2166136261u;  // FNV-1a
    auto mix = [&](std::uint64_t v) {
      for (int i = 0; i < 8; ++i, v >>= 8) h = (h ^ static_cast<std::uint32_t>(v & 0xff)) * 16777619u;
    };
    mix(static_cast<std::uint64_t>(c));
    mix(static_cast<std::uint64_t>(t));
    mix(count);
    mix(static_cast<std::uint64_t>(static_cast<std::int64_t>(root)));
    return h;
  }
  // A point-to-point slot: the user's tag (bits 0-30) and 24 bits of a hash of the byte count
  // (bits 32-55), so a send and a recv of different sizes never meet either; the top byte stays
  // 0, apart from Gloo's collective prefixes.
  [[nodiscard]] static std::uint64_t p2p_slot(int tag, std::size_t bytes) noexcept {
    const std::uint64_t h = signature_tag(collective::send, dtype::uint8, bytes) & 0xffffffu;
    return (h << 32) | static_cast<std::uint64_t>(static_cast<std::uint32_t>(tag));
  }

  // Scratch reused across calls (a fresh buffer per call costs page faults and a memset at
  // large sizes). Only the worker thread touches it.
  std::byte* worker_scratch(std::size_t bytes) {
    if (scratch_.size() < bytes) scratch_.resize(bytes);
    return scratch_.data();
  }

  // Runs body on the worker, in issue order, translating Gloo's failures.
  template <class Body>
  work run(collective c, std::string peers, Body body) {
    return worker_->submit([this, c, op = issued_operations(), peers = std::move(peers), body = std::move(body)] {
      throw_if_failed(c, peers);
      guarded(c, peers, body, -1, op);
    });
  }

  template <class Body>
  void guarded(collective c, const std::string& peers, Body& body, int peer = -1, std::uint64_t op = 0) {
    try {
      body();
    } catch (const partrain::error&) {
      throw;
    } catch (const gloo::IoException& e) {
      fail(c, peers, e.what(), peer, op);
    } catch (const std::exception& e) {  // gloo::EnforceNotMet and Gloo's other errors
      fail(c, peers, e.what(), peer, op);
    }
  }

  [[nodiscard]] std::string describe(collective c, const std::string& peers) const {
    return where(c) + (peers.empty() ? "" : " " + peers);
  }

  // `peer`: the other rank of a send or recv (-1 for collectives).
  // `op`: the operation's number on this rank, for the heartbeats' report of who never reached it.
  [[noreturn]] void fail(collective c, const std::string& peers, std::string_view gloo_what, int peer = -1,
                         std::uint64_t op = 0) {
    const bool timed_out = gloo_what.find("Timed out") != std::string_view::npos;
    const bool p2p = c == collective::send || c == collective::recv;
    // Gloo names a broken connection by its far end's address; the peers' records name the rank.
    const int lost = timed_out ? -1 : detail::gloo::rank_named_in(*store_, gopts_.prefix, rank(), size(), gloo_what);
    std::string msg = describe(c, peers) + ": ";
    if (timed_out) {
      msg += "timed out after " + std::to_string(timeout().count()) + " ms (" +
             (p2p ? std::string("the peer is stalled, never joined this transfer, or posted one of another size: a "
                                "send and a recv meet only at equal byte counts")
                  : std::string("a peer is stalled, never joined this operation, or called another one: ranks whose "
                                "calls differ in kind, size, element type or root wait apart; PARTRAIN_DEBUG=DETAIL "
                                "names both calls")) +
             "): ";
    } else if (lost >= 0) {
      msg += "Gloo failed: the connection with rank " + std::to_string(lost) + " broke (it died or left the group): ";
    } else {
      msg += "Gloo failed (a peer died or its connection broke): ";
    }
    msg += gloo_what;
    if (timed_out) {
      if (auto who = arrival_report(op); !who.empty()) msg += "; " + who;
    }
    {
      std::lock_guard lock(mutex_);
      if (failure_.empty()) failure_ = msg;
    }
    error_site site{.rank = rank(), .operation = std::string(to_string(c)), .peer = peer >= 0 ? peer : lost};
    if (timed_out) {
      site.timeout = timeout();
      throw timeout_error(msg, std::move(site));
    }
    throw communication_error(msg, std::move(site));
  }

  void throw_if_failed(collective c, const std::string& peers) const {
    std::lock_guard lock(mutex_);
    if (!failure_.empty()) {
      throw communication_error(describe(c, peers) +
                                ": the Gloo context is unusable after an earlier failure; build a new gloo_group "
                                "(earlier failure: " + failure_ + ")");
    }
  }

  // Posts the transfer now (so exchanges in any order work) and waits for it on p2p_.
  work post_p2p(collective c, raw_tensor t, int peer, int tag) {
    const std::string peers = (c == collective::send ? "to rank " : "from rank ") + std::to_string(peer) + " tag " +
                              std::to_string(tag);
    if (tag < 0) {
      throw invalid_argument_error(describe(c, peers) + ": tag must be >= 0, got " + std::to_string(tag));
    }
    if (peer == rank()) {
      throw invalid_argument_error(describe(c, peers) + ": a rank cannot " + std::string(to_string(c)) +
                                   " to itself with the gloo backend");
    }
    if (t.count == 0) return work::completed();
    try {
      throw_if_failed(c, peers);
    } catch (...) {
      return work::completed(std::current_exception());
    }
    std::shared_ptr<gloo::transport::UnboundBuffer> buf;
    try {
      buf = context_->createUnboundBuffer(t.data, t.bytes());
      if (c == collective::send) {
        buf->send(peer, p2p_slot(tag, t.bytes()));
      } else {
        buf->recv(peer, p2p_slot(tag, t.bytes()));
      }
    } catch (const std::exception& e) {
      try {
        fail(c, peers, e.what(), peer);
      } catch (...) {
        return work::completed(std::current_exception());
      }
    }
    return p2p_->submit([this, c, peers, buf, peer] {
      auto body = [&] {
        if (c == collective::send) {
          buf->waitSend(timeout());
        } else {
          buf->waitRecv(timeout());
        }
      };
      guarded(c, peers, body, peer);
    });
  }

  mutable std::mutex mutex_;
  std::string failure_;
  std::vector<std::byte> scratch_;
  std::shared_ptr<store> store_;
  gloo_options gopts_;
  std::shared_ptr<gloo::Context> context_;
  // Destroyed (joined) before context_; each blocking call inside is bounded by the timeout.
  // A collective waited on before it started runs on the waiting thread (see executor).
  std::unique_ptr<detail::executor> worker_ = std::make_unique<detail::executor>(
      1, detail::executor::abandoned_operation, detail::executor::waiting::runs);
  std::unique_ptr<detail::executor> p2p_ =
      std::make_unique<detail::executor>(detail::executor::unbounded, "process group destroyed before the transfer was waited on");
};

static_assert(communicator<gloo_group>);

// A factory of gloo_groups keyed by an id, each meeting under a store prefix of its own
// (base.prefix + id + "/", base.prefix "ft/group" when empty): replica_group's factory, which
// builds one group per quorum on the job's store, so successive quorums' rendezvous never mix.
[[nodiscard]] inline std::function<std::unique_ptr<process_group>(std::int64_t id, int rank, int size)>
gloo_groups_by_id(std::shared_ptr<store> rendezvous, process_group_options opts = {}, gloo_options base = {}) {
  if (!rendezvous) throw invalid_argument_error("gloo_groups_by_id: the rendezvous store is null");
  if (base.prefix.empty()) base.prefix = "ft/group";
  return [rendezvous = std::move(rendezvous), opts, base](std::int64_t id, int rank, int size) {
    auto g = base;
    g.prefix += std::to_string(id) + "/";
    return std::unique_ptr<process_group>(std::make_unique<gloo_group>(rendezvous, rank, size, opts, std::move(g)));
  };
}

}  // namespace partrain::inline v0
