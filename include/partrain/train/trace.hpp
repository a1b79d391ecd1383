// partrain/train/trace.hpp: a per-rank timeline (spans) merged by rank 0 into one Chrome-trace
// JSON file that Perfetto and chrome://tracing open, one process per rank (Horovod's timeline,
// for our loop). Enabled by PARTRAIN_TRACE=path (trace_recorder::from_env) or enable(path).
//
// Cost when off: span() and trace_work() test one relaxed atomic bool and return; nothing is
// allocated and the clock is not read. When on: one steady_clock read per span end point and a
// locked push_back into a reserved vector (comm completion threads record too).
//
// Clock alignment: start() estimates each rank's steady_clock offset to rank 0 with a ping-pong
// over send/recv (Cristian's algorithm, best of several rounds). The error of the estimate is at
// most half of the chosen round trip; it is written into the trace as "clock_error_us" in each
// rank's process metadata. Ranks on one host share CLOCK_MONOTONIC, so their offset is ~0.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <iterator>
#include <limits>
#include <memory>
#include <mutex>
#include <ranges>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <partrain/comm/process_group.hpp>
#include <partrain/core/device.hpp>
#include <partrain/core/error.hpp>
#include <partrain/core/tensor_view.hpp>
#include <partrain/core/work.hpp>
#include <partrain/train/detail/atomic_file.hpp>
#include <partrain/core/detail/json_text.hpp>

namespace partrain::inline v0 {

// Tracks ("tid" in the trace): one row each in the viewer. Spans on one track must nest.
namespace trace_track {
inline constexpr int step = 0;        // the loop: step, forward_backward, optimizer, checkpoint
inline constexpr int data = 1;        // waiting for the next batch
inline constexpr int recovery = 2;    // a fault-tolerant replica's events: joined, healed, failed, ...
inline constexpr int bucket0 = 16;    // bucket i's all_reduce runs on track bucket0 + i
[[nodiscard]] constexpr int bucket(std::size_t i) noexcept { return bucket0 + static_cast<int>(i); }
}  // namespace trace_track

namespace detail::trace {

struct event {
  std::string name;  // short names (<= 15 chars) stay in the string's own storage
  std::int64_t begin_ns = 0;
  std::int64_t end_ns = 0;
  int tid = 0;
  const char* arg_name = nullptr;  // a string literal; the arg is written only when set
  std::int64_t arg = 0;
};

// Events in fixed-size chunks: growing never moves what was recorded (no pause proportional to
// the trace so far), and chunks are written through when allocated, so recording into them
// takes no page faults (expensive under some sandboxes and hypervisors).
class event_store {
 public:
  static constexpr std::size_t chunk_events = 4096;

  void reserve(std::size_t n) {
    while (chunks_.size() * chunk_events < n) add_chunk();
  }
  void push(event&& e) {
    if (size_ == chunks_.size() * chunk_events) add_chunk();
    chunks_[size_ / chunk_events][size_ % chunk_events] = std::move(e);
    ++size_;
  }
  [[nodiscard]] std::size_t size() const noexcept { return size_; }
  template <class F>
  void for_each(F&& f) const {
    for (std::size_t i = 0; i < size_; ++i) f(chunks_[i / chunk_events][i % chunk_events]);
  }

 private:
  void add_chunk() { chunks_.push_back(std::make_unique<event[]>(chunk_events)); }

  std::vector<std::unique_ptr<event[]>> chunks_;
  std::size_t size_ = 0;
};

[[nodiscard]] inline std::int64_t steady_ns() noexcept {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

[[nodiscard]] inline std::string track_name(int tid) {
  if (tid == trace_track::step) return "step";
  if (tid == trace_track::data) return "data";
  if (tid == trace_track::recovery) return "recovery";
  if (tid >= trace_track::bucket0) return "bucket " + std::to_string(tid - trace_track::bucket0) + " all_reduce";
  return "track " + std::to_string(tid);
}

}  // namespace detail::trace

class trace_recorder;

// Records [construction, destruction) as one span. Empty (and free) when tracing is off.
class [[nodiscard]] trace_span {
 public:
  trace_span() noexcept = default;
  trace_span(const trace_span&) = delete;
  trace_span& operator=(const trace_span&) = delete;
  trace_span(trace_span&& o) noexcept
      : rec_(std::exchange(o.rec_, nullptr)), name_(o.name_), tid_(o.tid_), arg_name_(o.arg_name_), arg_(o.arg_),
        begin_ns_(o.begin_ns_) {}
  trace_span& operator=(trace_span&&) = delete;
  inline ~trace_span();
  // Ends the span now instead of at scope exit.
  inline void end() noexcept;

 private:
  friend class trace_recorder;
  trace_span(trace_recorder* r, std::string_view name, int tid, const char* arg_name, std::int64_t arg) noexcept
      : rec_(r), name_(name), tid_(tid), arg_name_(arg_name), arg_(arg), begin_ns_(detail::trace::steady_ns()) {}

  trace_recorder* rec_ = nullptr;
  std::string_view name_;
  int tid_ = 0;
  const char* arg_name_ = nullptr;
  std::int64_t arg_ = 0;
  std::int64_t begin_ns_ = 0;
};

class trace_recorder {
 public:
  // Off.
  trace_recorder() noexcept = default;
  // On: rank 0 will write the merged trace to `path` in finish().
  explicit trace_recorder(std::filesystem::path path, std::size_t reserve_events = 1 << 14) {
    enable(std::move(path), reserve_events);
  }
  // On when PARTRAIN_TRACE names a file, off otherwise. Every rank sees the same environment
  // under partrun/torchrun-style launchers, so all ranks agree.
  [[nodiscard]] static trace_recorder from_env() {
    const char* p = std::getenv("PARTRAIN_TRACE");
    if (!p || !*p) return trace_recorder();
    return trace_recorder(std::filesystem::path(p));
  }
  trace_recorder(const trace_recorder&) = delete;
  trace_recorder& operator=(const trace_recorder&) = delete;
  // Waits (bounded) for traced collectives whose completion callbacks still point here.
  ~trace_recorder() { (void)wait_idle(default_timeout); }
  // Movable before recording starts (work callbacks hold a pointer to the recorder afterwards).
  trace_recorder(trace_recorder&& o) noexcept
      : enabled_(o.enabled_.load(std::memory_order_relaxed)), path_(std::move(o.path_)), events_(std::move(o.events_)) {}

  void enable(std::filesystem::path path, std::size_t reserve_events = 1 << 14) {
    if (path.empty()) throw invalid_argument_error("trace_recorder::enable: the trace path is empty (expected a file name)");
    // Written only at the end of the run: a folder that cannot take it must fail now.
    detail::ckpt::ensure_writable_folder(path.parent_path(), "trace: cannot write '" + path.filename().string() + "'");
    std::lock_guard lock(mutex_);
    path_ = std::move(path);
    events_.reserve(reserve_events);
    enabled_.store(true, std::memory_order_release);
  }
  // Stops recording; what was recorded stays for finish().
  void disable() noexcept { enabled_.store(false, std::memory_order_release); }
  [[nodiscard]] bool enabled() const noexcept { return enabled_.load(std::memory_order_relaxed); }
  [[nodiscard]] const std::filesystem::path& path() const noexcept { return path_; }

  // arg_name must be a string literal (it is kept as a pointer): span("optimizer"),
  // span("step", trace_track::step, "step", i).
  [[nodiscard]] trace_span span(std::string_view name, int tid = trace_track::step, const char* arg_name = nullptr,
                                std::int64_t arg = 0) noexcept {
    if (!enabled()) return {};
    return trace_span(this, name, tid, arg_name, arg);
  }

  // A span from now until w completes, recorded by whichever thread completes it. Use for
  // collectives: trace_work(w, "all_reduce", trace_track::bucket(i), "bucket", i). The end is
  // read when the completion callback runs, which is after waiters are woken: it may show a few
  // microseconds past the moment the loop saw the work finish.
  void trace_work(const work& w, std::string_view name, int tid, const char* arg_name = nullptr, std::int64_t arg = 0) {
    if (!enabled()) return;
    const std::int64_t begin = detail::trace::steady_ns();
    {
      // Counted until the callback ran: the waiter of w may wake before it, and finish() (or the
      // destructor) must not drop or outlive it.
      std::lock_guard lock(mutex_);
      ++pending_;
    }
    w.then([this, n = std::string(name), tid, arg_name, arg, begin] {
      const std::int64_t end = detail::trace::steady_ns();
      std::lock_guard lock(mutex_);
      try {
        if (enabled()) events_.push({n, begin, end, tid, arg_name, arg});
      } catch (...) {
        // Out of memory while tracing: drop the span, keep training.
      }
      --pending_;
      idle_.notify_all();
    });
  }

  // A ddp_options::on_bucket_launch that draws each bucket's reduction, from launch to
  // completion, as an "all_reduce" span on trace_track::bucket(i):
  //   distributed_data_parallel ddp(model, pg, {.on_bucket_launch = trace.bucket_spans()});
  // The recorder must outlive the DDP's steps (it is not movable once spans point to it).
  [[nodiscard]] std::function<void(const work&, std::size_t)> bucket_spans() {
    return [this](const work& w, std::size_t bucket) {
      trace_work(w, "all_reduce", trace_track::bucket(bucket), "bucket", static_cast<std::int64_t>(bucket));
    };
  }

  // Adds a finished span (timestamps from detail::trace::steady_ns()). Thread-safe.
  void record(std::string_view name, int tid, std::int64_t begin_ns, std::int64_t end_ns, const char* arg_name = nullptr,
              std::int64_t arg = 0) {
    if (!enabled()) return;
    std::lock_guard lock(mutex_);
    events_.push({std::string(name), begin_ns, std::max(begin_ns, end_ns), tid, arg_name, arg});
  }

  [[nodiscard]] std::size_t event_count() const {
    std::lock_guard lock(mutex_);
    return events_.size();
  }
  [[nodiscard]] std::int64_t clock_offset_ns() const noexcept { return offset_ns_; }
  [[nodiscard]] std::int64_t clock_error_ns() const noexcept { return error_ns_; }

  // Collective: every rank of pg calls it (or none: a recorder that is off does nothing).
  // Estimates this rank's clock offset to rank 0 and fixes the trace's time origin.
  void start(process_group& pg, int rounds = 8) {
    if (!enabled()) return;
    require_host(pg, "start");
    rank_ = pg.rank();
    constexpr int tag = 0x7ace;
    std::int64_t best_rtt = std::numeric_limits<std::int64_t>::max();
    if (pg.rank() == 0) {
      offset_ns_ = 0;
      error_ns_ = 0;
      std::int64_t ping = 0, now = 0;
      for (int r = 1; r < pg.size(); ++r) {
        for (int i = 0; i < rounds; ++i) {
          wait_named(pg.recv(tensor_view<std::int64_t>(&ping, shape{1}), r, tag), pg, "trace clock ping recv");
          now = detail::trace::steady_ns();
          wait_named(pg.send(tensor_view<std::int64_t>(&now, shape{1}), r, tag), pg, "trace clock reply send");
        }
      }
    } else {
      std::int64_t ping = 0, theirs = 0;
      for (int i = 0; i < rounds; ++i) {
        const std::int64_t t1 = detail::trace::steady_ns();
        ping = t1;
        wait_named(pg.send(tensor_view<std::int64_t>(&ping, shape{1}), 0, tag), pg, "trace clock ping send");
        wait_named(pg.recv(tensor_view<std::int64_t>(&theirs, shape{1}), 0, tag), pg, "trace clock reply recv");
        const std::int64_t t2 = detail::trace::steady_ns();
        if (t2 - t1 < best_rtt) {
          best_rtt = t2 - t1;
          // Rank 0 read its clock somewhere in [t1, t2]; assume the middle.
          offset_ns_ = theirs - (t1 + (t2 - t1) / 2);
          error_ns_ = (t2 - t1 + 1) / 2;
        }
      }
    }
    // Rank 0's "now" is the trace's time zero on every rank.
    origin_ns_ = detail::trace::steady_ns() + offset_ns_;
    wait_named(pg.broadcast(tensor_view<std::int64_t>(&origin_ns_, shape{1}), 0), pg, "trace origin broadcast");
  }

  // Collective: every rank sends its events to rank 0, which writes one Chrome-trace JSON file
  // atomically (temporary file + rename). Returns true on the rank that wrote it.
  bool finish(process_group& pg) {
    if (!enabled()) return false;
    require_host(pg, "finish");
    if (!wait_idle(pg.timeout())) {
      throw timeout_error("rank " + std::to_string(pg.rank()) + " trace finish: traced collectives still running after " +
                          std::to_string(pg.timeout().count()) + " ms");
    }
    disable();
    rank_ = pg.rank();
    const std::string mine = fragment();  // JSON objects separated by commas, this rank only
    std::vector<std::int64_t> sizes(static_cast<std::size_t>(pg.size()));
    std::int64_t my_size = static_cast<std::int64_t>(mine.size());
    wait_named(pg.all_gather(tensor_view<const std::int64_t>(&my_size, shape{1}),
                             tensor_view<std::int64_t>(sizes.data(), shape{sizes.size()})),
               pg, "trace size all_gather");
    constexpr int tag = 0x7acf;
    if (pg.rank() != 0) {
      if (!mine.empty()) {
        wait_named(pg.send(tensor_view<const std::uint8_t>(reinterpret_cast<const std::uint8_t*>(mine.data()),
                                                           shape{mine.size()}),
                           0, tag),
                   pg, "trace events send");
      }
      return false;
    }
    std::string json = mine;
    for (int r = 1; r < pg.size(); ++r) {
      const auto n = static_cast<std::size_t>(sizes[static_cast<std::size_t>(r)]);
      if (n == 0) continue;
      std::string theirs(n, '\0');
      wait_named(pg.recv(tensor_view<std::uint8_t>(reinterpret_cast<std::uint8_t*>(theirs.data()), shape{n}), r, tag),
                 pg, "trace events recv from rank " + std::to_string(r));
      if (!json.empty()) json += ',';
      json += theirs;
    }
    write(json);
    return true;
  }

  // Not collective: this process's events alone into the file, its events labelled `id` (what a
  // fault-tolerant replica writes, each to a file of its own: its groups change with failures, so
  // no group of every replica is left at the end to merge them over). Returns false when off.
  bool finish_alone(int id, std::chrono::milliseconds timeout = default_timeout) {
    if (!enabled()) return false;
    if (!wait_idle(timeout)) {
      throw timeout_error("trace finish of process " + std::to_string(id) + ": traced work still running after " +
                          std::to_string(timeout.count()) + " ms");
    }
    disable();
    rank_ = id;
    write(fragment());
    return true;
  }

  // This rank's events as JSON (no surrounding brackets); what finish() sends to rank 0.
  [[nodiscard]] std::string fragment() const {
    std::lock_guard lock(mutex_);
    std::string out;
    out.reserve(160 * (events_.size() + 8));
    const std::string pid = std::to_string(rank_);
    auto meta = [&](std::string_view what, int tid, std::string_view key, const std::string& value_json) {
      if (!out.empty()) out += ',';
      out += "{\"ph\":\"M\",\"name\":\"";
      out += what;
      out += "\",\"pid\":" + pid + ",\"tid\":" + std::to_string(tid) + ",\"args\":{\"";
      out += key;
      out += "\":" + value_json + "}}";
    };
    std::string pname;
    detail::json::append_string(pname, "rank " + pid);
    meta("process_name", 0, "name", pname);
    meta("process_sort_index", 0, "sort_index", pid);
    std::string err;
    detail::json::append_fixed_point(err, error_ns_, 1000, 3);
    meta("process_labels", 0, "labels", "\"clock_error_us=" + err + "\"");
    std::set<int> tids;
    events_.for_each([&](const detail::trace::event& e) { tids.insert(e.tid); });
    for (const int tid : tids) {
      std::string tname;
      detail::json::append_string(tname, detail::trace::track_name(tid));
      meta("thread_name", tid, "name", tname);
      meta("thread_sort_index", tid, "sort_index", std::to_string(tid));
    }
    events_.for_each([&](const detail::trace::event& e) {
      out += ",{\"ph\":\"X\",\"name\":";
      detail::json::append_string(out, e.name);
      out += ",\"pid\":" + pid + ",\"tid\":" + std::to_string(e.tid) + ",\"ts\":";
      detail::json::append_fixed_point(out, e.begin_ns + offset_ns_ - origin_ns_, 1000, 3);
      out += ",\"dur\":";
      detail::json::append_fixed_point(out, e.end_ns - e.begin_ns, 1000, 3);
      if (e.arg_name) {
        out += ",\"args\":{";
        detail::json::append_string(out, e.arg_name);
        out += ':';
        detail::json::append_number(out, e.arg);
        out += '}';
      }
      out += '}';
    });
    return out;
  }

 private:
  // The Chrome-trace file around `events` (JSON objects separated by commas), written atomically
  // (a temporary file, then a rename).
  void write(const std::string& events) const {
    const std::string json = "{\"displayTimeUnit\":\"ms\",\"traceEvents\":[" + events + "]}\n";
    detail::ckpt::write_file_atomically(path_, std::as_bytes(std::span(json.data(), json.size())));
  }
  // The exchange moves host integers and bytes; a CUDA-only group (nccl) cannot carry them.
  static void require_host(process_group& pg, const char* what) {
    if (!pg.accepts(device_kind::cpu)) {
      throw invalid_argument_error("rank " + std::to_string(pg.rank()) + " trace_recorder::" + what + ": the " +
                                   std::string(pg.backend()) +
                                   " backend takes only device tensors; pass a host process group (local or gloo) "
                                   "for the trace exchange");
    }
  }
  [[nodiscard]] bool wait_idle(std::chrono::milliseconds limit) {
    std::unique_lock lock(mutex_);
    return idle_.wait_for(lock, limit, [&] { return pending_ == 0; });
  }
  static void wait_named(const work& w, process_group& pg, const std::string& what) {
    if (!w.wait_for(pg.timeout())) {
      throw timeout_error("rank " + std::to_string(pg.rank()) + " " + what + " (" + std::string(pg.backend()) +
                          "): timed out after " + std::to_string(pg.timeout().count()) + " ms");
    }
  }

  std::atomic<bool> enabled_{false};
  std::filesystem::path path_;
  mutable std::mutex mutex_;
  std::condition_variable idle_;
  int pending_ = 0;  // trace_work callbacks not yet run
  detail::trace::event_store events_;
  int rank_ = 0;
  std::int64_t offset_ns_ = 0;  // add to this rank's steady_ns() to get rank 0's
  std::int64_t error_ns_ = 0;   // bound on |offset error|
  std::int64_t origin_ns_ = 0;  // rank 0's clock at start(): ts 0
};

inline trace_span::~trace_span() { end(); }

// A view of a range of batches (a loader) that records how long each batch took to arrive, as
// "data_wait" spans on trace_track::data (the time spent in begin() and in each ++):
//   for (const batch& b : traced_batches(train, trace)) ...
// When the recorder is off it costs one relaxed load per batch. Single pass, like the loader.
template <std::ranges::input_range R>
class traced_batches : public std::ranges::view_interface<traced_batches<R>> {
  using base_iterator = std::ranges::iterator_t<R>;
  using base_sentinel = std::ranges::sentinel_t<R>;

 public:
  struct sentinel {
    base_sentinel end;
  };
  class iterator {
   public:
    using value_type = std::ranges::range_value_t<R>;
    using difference_type = std::ptrdiff_t;
    using iterator_concept = std::input_iterator_tag;

    iterator() = default;
    iterator(base_iterator it, trace_recorder* rec) : it_(std::move(it)), rec_(rec) {}
    [[nodiscard]] decltype(auto) operator*() const { return *it_; }
    iterator& operator++() {
      auto wait = rec_->span("data_wait", trace_track::data);
      ++it_;
      return *this;
    }
    void operator++(int) { ++*this; }
    [[nodiscard]] friend bool operator==(const iterator& i, const sentinel& s) { return i.it_ == s.end; }

   private:
    base_iterator it_{};
    trace_recorder* rec_ = nullptr;
  };

  traced_batches() = default;
  traced_batches(R& r, trace_recorder& rec) noexcept : r_(&r), rec_(&rec) {}

  [[nodiscard]] iterator begin() {
    auto wait = rec_->span("data_wait", trace_track::data);
    return iterator(std::ranges::begin(*r_), rec_);
  }
  [[nodiscard]] sentinel end() { return sentinel{std::ranges::end(*r_)}; }

 private:
  R* r_ = nullptr;
  trace_recorder* rec_ = nullptr;
};

inline void trace_span::end() noexcept {
  if (!rec_) return;
  auto* r = std::exchange(rec_, nullptr);
  try {
    r->record(name_, tid_, begin_ns_, detail::trace::steady_ns(), arg_name_, arg_);
  } catch (...) {
    // Out of memory while tracing: drop the span rather than terminate the training run.
  }
}

}  // namespace partrain::inline v0
