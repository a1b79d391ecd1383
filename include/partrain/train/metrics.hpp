// partrain/train/metrics.hpp: a JSON-lines metrics file any loop can use. Each call writes one
// record ({"kind":"step",...} or {"kind":"epoch",...}) as one line. Fields marked mean, sum, min
// or max are reduced across ranks first (mean loss, total samples/s); the others are rank 0's.
// Only rank 0 writes. The file is opened with O_APPEND and each record goes out in one write(),
// so a record is never torn by a restart appending to the same file, and it is on disk
// (in the kernel's page cache) as soon as the call returns: a crash loses no finished record.
#pragma once

#include <cerrno>
#include <charconv>
#include <chrono>
#include <concepts>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <initializer_list>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include <fcntl.h>
#include <unistd.h>

#include <partrain/comm/process_group.hpp>
#include <partrain/comm/reduce_op.hpp>
#include <partrain/core/detail/regular_file.hpp>
#include <partrain/core/error.hpp>
#include <partrain/core/tensor_view.hpp>
#include <partrain/parallel/detail/host_staging.hpp>
#include <partrain/train/detail/atomic_file.hpp>
#include <partrain/core/detail/json_text.hpp>

namespace partrain::inline v0 {

// How a field combines across ranks before rank 0 writes it.
enum class across_ranks { rank0, mean, sum, min, max };

// One named value of a record. Numbers given with a reduction are reduced as doubles.
struct metric_field {
  using value_type = std::variant<double, std::int64_t, bool, std::string>;

  template <std::floating_point F>
  metric_field(std::string k, F v, across_ranks how = across_ranks::rank0)
      : key(std::move(k)), value(static_cast<double>(v)), reduce(how) {}
  template <std::integral I>
    requires(!std::same_as<I, bool>)
  metric_field(std::string k, I v, across_ranks how = across_ranks::rank0)
      : key(std::move(k)), value(static_cast<std::int64_t>(v)), reduce(how) {}
  metric_field(std::string k, bool v) : key(std::move(k)), value(v) {}
  metric_field(std::string k, std::string v) : key(std::move(k)), value(std::move(v)) {}
  metric_field(std::string k, const char* v) : key(std::move(k)), value(std::string(v)) {}

  std::string key;
  value_type value;
  across_ranks reduce = across_ranks::rank0;
};

namespace detail::metrics {

// Reduces the fields marked for it in place: one all_reduce(sum) for mean and sum fields, one
// all_reduce(max) for max and (negated) min fields. Every rank must pass the same keys in the
// same order (like any collective).
template <class C>
void reduce_fields(C& comm, std::vector<metric_field>& fields) {
  std::vector<double> sums, maxes;
  for (auto& f : fields) {
    if (f.reduce == across_ranks::rank0) continue;
    double v = 0;
    if (auto* d = std::get_if<double>(&f.value)) v = *d;
    else if (auto* i = std::get_if<std::int64_t>(&f.value)) v = static_cast<double>(*i);
    else throw invalid_argument_error("metrics: field '" + f.key + "' is reduced across ranks but is not a number");
    if (f.reduce == across_ranks::mean || f.reduce == across_ranks::sum) sums.push_back(v);
    else maxes.push_back(f.reduce == across_ranks::min ? -v : v);
  }
  // Host numbers; a backend that takes device memory only (nccl) reduces them on a device copy.
  auto run = [&](std::vector<double>& xs, reduce_op op, const char* what) {
    detail::host_collective(
        comm, std::span<double>(xs), [&](auto view) { return comm.all_reduce(view, op); },
        [&](auto w) {
          if constexpr (requires { comm.timeout(); }) {
            if (!w.wait_for(comm.timeout())) {
              throw timeout_error("rank " + std::to_string(comm.rank()) + " metrics " + what +
                                  " all_reduce: timed out after " + std::to_string(comm.timeout().count()) + " ms");
            }
          } else {
            w.wait();
          }
        });
  };
  run(sums, reduce_op::sum, "sum");
  run(maxes, reduce_op::max, "max");
  std::size_t is = 0, im = 0;
  const double n = static_cast<double>(comm.size());
  for (auto& f : fields) {
    switch (f.reduce) {
      case across_ranks::rank0: break;
      case across_ranks::mean: f.value = sums[is++] / n; break;
      case across_ranks::sum: {
        const double s = sums[is++];
        if (std::holds_alternative<std::int64_t>(f.value)) f.value = static_cast<std::int64_t>(s);
        else f.value = s;
        break;
      }
      case across_ranks::max: f.value = maxes[im++]; break;
      case across_ranks::min: f.value = -maxes[im++]; break;
    }
  }
}

inline void append_field(std::string& out, const metric_field& f) {
  out += ',';
  json::append_string(out, f.key);
  out += ':';
  std::visit(
      [&](const auto& v) {
        using V = std::decay_t<decltype(v)>;
        if constexpr (std::same_as<V, bool>) out += v ? "true" : "false";
        else if constexpr (std::same_as<V, std::string>) json::append_string(out, v);
        else json::append_number(out, v);
      },
      f.value);
}

// The record's counter when the line is a record of that kind as metrics_record writes it
// ({"kind":"step","step":N,...}), else -1.
[[nodiscard]] inline std::int64_t record_counter(std::string_view line, std::string_view kind) {
  const std::string head = "{\"kind\":\"" + std::string(kind) + "\",\"" + std::string(kind) + "\":";
  if (!line.starts_with(head)) return -1;
  std::int64_t n = 0;
  const char* first = line.data() + head.size();
  const auto [end, ec] = std::from_chars(first, line.data() + line.size(), n);
  return ec == std::errc{} && end != first ? n : -1;
}

}  // namespace detail::metrics

// A resumed run continues a metrics file: the records a killed attempt wrote past the checkpoint
// it resumes from (steps after `step`, epochs after `epoch`) are dropped, so no step is recorded
// twice. Other lines are kept as they are. The file is rewritten atomically.
inline void truncate_metrics_after(const std::filesystem::path& path, std::int64_t step, std::int64_t epoch) {
  if (!std::filesystem::exists(path)) return;
  const std::vector<std::byte> bytes = detail::read_regular_file<config_error>(path, "metrics file");
  const std::string_view text(reinterpret_cast<const char*>(bytes.data()), bytes.size());
  std::string kept;
  bool dropped = false;
  for (std::size_t at = 0; at < text.size();) {
    const std::size_t nl = text.find('\n', at);
    const std::size_t end = nl == std::string_view::npos ? text.size() : nl + 1;
    const std::string_view line = text.substr(at, end - at);
    if (detail::metrics::record_counter(line, "step") > step || detail::metrics::record_counter(line, "epoch") > epoch) {
      dropped = true;
    } else {
      kept += line;
    }
    at = end;
  }
  if (dropped) detail::ckpt::write_file_atomically(path, std::as_bytes(std::span(kept.data(), kept.size())));
}

// Builds one record's text: {"kind":..., "<counter>":n, "time":unix seconds, fields...}.
[[nodiscard]] inline std::string metrics_record(std::string_view kind, std::string_view counter, std::int64_t n,
                                                double unix_time, std::span<const metric_field> fields) {
  std::string out = "{\"kind\":";
  detail::json::append_string(out, kind);
  out += ',';
  detail::json::append_string(out, counter);
  out += ':';
  detail::json::append_number(out, n);
  out += ",\"time\":";
  detail::json::append_number(out, unix_time);
  for (const auto& f : fields) detail::metrics::append_field(out, f);
  out += "}\n";
  return out;
}

class metrics_writer {
 public:
  // Single process (or rank 0 of a job that reduces its values itself).
  explicit metrics_writer(std::filesystem::path path) : metrics_writer(std::move(path), 0) {}
  // rank: only rank 0 opens and writes the file.
  metrics_writer(std::filesystem::path path, int rank) : path_(std::move(path)), rank_(rank) {
    if (path_.empty()) throw invalid_argument_error("metrics_writer: the metrics path is empty (expected a file name)");
    if (rank_ != 0) return;
    fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (fd_ < 0) {
      throw config_error("metrics_writer: cannot open '" + path_.string() + "' for appending: " + std::strerror(errno));
    }
  }
  metrics_writer(const metrics_writer&) = delete;
  metrics_writer& operator=(const metrics_writer&) = delete;
  metrics_writer(metrics_writer&& o) noexcept : path_(std::move(o.path_)), rank_(o.rank_), fd_(std::exchange(o.fd_, -1)) {}
  metrics_writer& operator=(metrics_writer&& o) noexcept {
    if (this != &o) {
      close();
      path_ = std::move(o.path_);
      rank_ = o.rank_;
      fd_ = std::exchange(o.fd_, -1);
    }
    return *this;
  }
  ~metrics_writer() { close(); }

  [[nodiscard]] const std::filesystem::path& path() const noexcept { return path_; }
  [[nodiscard]] bool writes() const noexcept { return fd_ >= 0; }

  // Local values only (no communicator): rank 0 writes what it was given.
  void step(std::int64_t step, std::vector<metric_field> fields) { write("step", "step", step, fields); }
  void epoch(std::int64_t epoch, std::vector<metric_field> fields) { write("epoch", "epoch", epoch, fields); }
  // A record of another kind at a step ({"kind":kind,"step":n,...}, e.g. a replica's events),
  // local values only.
  void event(std::string_view kind, std::int64_t step, std::vector<metric_field> fields) {
    if (kind == "step" || kind == "epoch") {
      throw invalid_argument_error("metrics_writer::event: kind '" + std::string(kind) +
                                   "' is step()'s or epoch()'s (expected another name)");
    }
    write(kind, "step", step, fields);
  }

  // Collective: every rank calls it with the same keys; reduced fields are combined first.
  template <class C>
    requires communicator<C>
  void step(C& comm, std::int64_t step, std::vector<metric_field> fields) {
    detail::metrics::reduce_fields(comm, fields);
    write("step", "step", step, fields);
  }
  template <class C>
    requires communicator<C>
  void epoch(C& comm, std::int64_t epoch, std::vector<metric_field> fields) {
    detail::metrics::reduce_fields(comm, fields);
    write("epoch", "epoch", epoch, fields);
  }

 private:
  void write(std::string_view kind, std::string_view counter, std::int64_t n, const std::vector<metric_field>& fields) {
    if (fd_ < 0) return;
    const double now = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
    const std::string line = metrics_record(kind, counter, n, now, fields);
    // O_APPEND: each write lands at the current end; loop only on a short write (disk full).
    std::size_t done = 0;
    while (done < line.size()) {
      const ::ssize_t k = ::write(fd_, line.data() + done, line.size() - done);
      if (k < 0) {
        if (errno == EINTR) continue;
        throw config_error("metrics_writer: cannot write to '" + path_.string() + "': " + std::strerror(errno));
      }
      done += static_cast<std::size_t>(k);
    }
  }
  void close() noexcept {
    if (fd_ >= 0) ::close(std::exchange(fd_, -1));
  }

  std::filesystem::path path_;
  int rank_ = 0;
  int fd_ = -1;
};

}  // namespace partrain::inline v0
