// partrain/parallel/powersgd.hpp: PowerSGD gradient compression as a DDP comm hook (Vogels,
// Karimireddy, Jaggi, NeurIPS 2019; PyTorch's powerSGD_hook): every matrix gradient M (n x m,
// the parameter viewed as [dim0, -1]) travels as a rank-r product P Q^T (one power iteration,
// warm-started from last step's Q), with error feedback; vectors and matrices too small to gain
// are all-reduced as they are. Host buckets only. The state (error feedback, Q, step counters)
// saves and loads, so a resumed run compresses exactly as the uninterrupted one would.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <partrain/comm/process_group.hpp>
#include <partrain/core/error.hpp>
#include <partrain/core/tensor_view.hpp>
#include <partrain/core/work.hpp>
#include <partrain/optim/state_io.hpp>
#include <partrain/parallel/comm_hooks.hpp>

namespace partrain::inline v0 {

// PyTorch's PowerSGDState knobs, same names and defaults.
struct powersgd_options {
  std::size_t matrix_approximation_rank = 1;
  // Steps of plain all_reduce before compression starts (PyTorch's start_powerSGD_iter). Our
  // buckets are never rebuilt, so unlike PyTorch any value >= 0 is safe with error feedback.
  std::int64_t start_iter = 1000;
  // Compress an n x m matrix only if (n + m) r * min_compression_rate < n m; 0 compresses every
  // matrix (at full rank that reproduces the all_reduce: the tests use it).
  double min_compression_rate = 2;
  bool use_error_feedback = true;
  bool warm_start = true;
  // Added to each column's norm in Gram-Schmidt; a small value guards vanishing gradients.
  double orthogonalization_epsilon = 0;
  std::uint64_t random_seed = 0;
};

namespace detail::powersgd {

inline void validate(const powersgd_options& o) {
  auto bad = [](const std::string& what) { throw invalid_argument_error("powersgd_options: " + what); };
  if (o.matrix_approximation_rank < 1) bad("matrix_approximation_rank must be >= 1, got 0");
  if (o.start_iter < 0) bad("start_iter must be >= 0, got " + std::to_string(o.start_iter));
  if (!(o.min_compression_rate >= 0)) bad("min_compression_rate must be >= 0, got " + std::to_string(o.min_compression_rate));
  if (!(o.orthogonalization_epsilon >= 0)) {
    bad("orthogonalization_epsilon must be >= 0, got " + std::to_string(o.orthogonalization_epsilon));
  }
}

// One matrix of a bucket: where it lies, its n x m view and the rank used for it.
struct matrix {
  std::size_t offset, n, m, r;
};

// Splits a bucket into compressed matrices and the rest (offset, count) by PyTorch's rule. With
// no shapes (a bucket whose owner did not say), the whole bucket is one matrix n x m with n the
// largest divisor of its size not above its square root (PyTorch's batched hook pads to a
// square instead; a divisor keeps the buffer as it is, at some loss of shape for odd sizes).
struct layout {
  std::vector<matrix> matrices;
  std::vector<std::pair<std::size_t, std::size_t>> rest;
  std::size_t p_elements = 0, q_elements = 0, rest_elements = 0;
};

[[nodiscard]] inline layout plan(std::span<const shape> shapes, std::size_t bucket_elements, const powersgd_options& o) {
  layout l;
  auto add = [&](std::size_t off, std::size_t n, std::size_t m) {
    const std::size_t numel = n * m;
    const std::size_t r = std::min({n, m, o.matrix_approximation_rank});
    const bool worth = n > 1 && m > 1 &&
                       static_cast<double>((n + m) * r) * o.min_compression_rate < static_cast<double>(numel);
    if (worth) {
      l.matrices.push_back({off, n, m, r});
      l.p_elements += n * r;
      l.q_elements += m * r;
    } else if (numel) {
      l.rest.emplace_back(off, numel);
      l.rest_elements += numel;
    }
  };
  if (shapes.empty()) {
    std::size_t n = static_cast<std::size_t>(std::sqrt(static_cast<double>(bucket_elements)));
    while (n > 1 && bucket_elements % n) --n;
    if (n == 0) n = 1;
    add(0, n, bucket_elements / n);
    return l;
  }
  std::size_t off = 0;
  for (const auto& s : shapes) {
    const std::size_t numel = s.numel();
    if (s.rank() >= 2 && numel) {
      add(off, s[0], numel / s[0]);
    } else if (numel) {
      l.rest.emplace_back(off, numel);
      l.rest_elements += numel;
    }
    off += numel;
  }
  if (off != bucket_elements) {
    throw invalid_argument_error("powersgd hook: the bucket's parameter shapes hold " + std::to_string(off) +
                                 " elements but the bucket has " + std::to_string(bucket_elements) +
                                 " (expected the shapes of exactly the bucket's parameters)");
  }
  return l;
}

// A reproducible N(0, 1) stream (splitmix64 + Box-Muller): every rank draws the same Q for the
// same (seed, step, bucket), which the sum of the ranks' P = M Q needs.
class normal_stream {
 public:
  explicit normal_stream(std::uint64_t seed) noexcept : s_(seed) {}
  double next() noexcept {
    if (has_spare_) {
      has_spare_ = false;
      return spare_;
    }
    const double u1 = (static_cast<double>(bits() >> 11) + 1.0) * 0x1.0p-53;  // (0, 1]
    const double u2 = static_cast<double>(bits() >> 11) * 0x1.0p-53;
    const double rad = std::sqrt(-2.0 * std::log(u1));
    constexpr double two_pi = 6.283185307179586;
    spare_ = rad * std::sin(two_pi * u2);
    has_spare_ = true;
    return rad * std::cos(two_pi * u2);
  }

 private:
  std::uint64_t bits() noexcept {
    std::uint64_t z = (s_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  std::uint64_t s_;
  double spare_ = 0;
  bool has_spare_ = false;
};

// Gram-Schmidt on the r columns of a row-major rows x r matrix (PyTorch's _orthogonalize_gram_schmidt):
// each column loses its projections on the earlier ones, then is divided by its norm (+ eps).
template <class T>
void orthogonalize(T* a, std::size_t rows, std::size_t r, T eps) {
  for (std::size_t j = 0; j < r; ++j) {
    for (std::size_t k = 0; k < j; ++k) {
      T dot = 0;
      for (std::size_t i = 0; i < rows; ++i) dot += a[i * r + k] * a[i * r + j];
      for (std::size_t i = 0; i < rows; ++i) a[i * r + j] -= dot * a[i * r + k];
    }
    T norm = 0;
    for (std::size_t i = 0; i < rows; ++i) norm += a[i * r + j] * a[i * r + j];
    const T div = std::sqrt(norm) + eps;
    for (std::size_t i = 0; i < rows; ++i) a[i * r + j] /= div;
  }
}

// p (n x r) = m (n x k) q (k x r)
template <class T>
void matmul(const T* m, const T* q, T* p, std::size_t n, std::size_t k, std::size_t r) {
  std::fill(p, p + n * r, T(0));
  for (std::size_t i = 0; i < n; ++i) {
    for (std::size_t l = 0; l < k; ++l) {
      const T a = m[i * k + l];
      for (std::size_t j = 0; j < r; ++j) p[i * r + j] += a * q[l * r + j];
    }
  }
}
// q (m x r) = M^T (m x n) p (n x r)
template <class T>
void matmul_t(const T* m, const T* p, T* q, std::size_t n, std::size_t cols, std::size_t r) {
  std::fill(q, q + cols * r, T(0));
  for (std::size_t i = 0; i < n; ++i) {
    for (std::size_t l = 0; l < cols; ++l) {
      const T a = m[i * cols + l];
      for (std::size_t j = 0; j < r; ++j) q[l * r + j] += a * p[i * r + j];
    }
  }
}
// out (n x m) = p (n x r) q^T (r x m)
template <class T>
void outer(const T* p, const T* q, T* out, std::size_t n, std::size_t m, std::size_t r) {
  for (std::size_t i = 0; i < n; ++i) {
    for (std::size_t l = 0; l < m; ++l) {
      T s = 0;
      for (std::size_t j = 0; j < r; ++j) s += p[i * r + j] * q[l * r + j];
      out[i * m + l] = s;
    }
  }
}

}  // namespace detail::powersgd

// The hook's memory across steps, one per rank (make it with std::make_shared and hand it to
// comm_hooks::powersgd). Keyed by bucket index; DDP's buckets never change, so neither do the
// sizes it keeps.
class powersgd_state {
 public:
  explicit powersgd_state(powersgd_options o = {}) : opts_((detail::powersgd::validate(o), o)) {}

  [[nodiscard]] const powersgd_options& options() const noexcept { return opts_; }
  // Steps bucket `b` went through (PyTorch's iter; every bucket counts each step once).
  [[nodiscard]] std::int64_t iteration(std::size_t bucket) const {
    const auto it = buckets_.find(bucket);
    return it == buckets_.end() ? 0 : it->second.iter;
  }
  // The error feedback of bucket `b` (what the compression left out, added to the next step's
  // gradient); empty before its first compressed step.
  template <class T>
  [[nodiscard]] std::span<const T> error(std::size_t bucket) const {
    const auto it = buckets_.find(bucket);
    if (it == buckets_.end()) return {};
    return it->second.template error<T>();
  }
  // Elements a plain all_reduce would send over what this hook sent, all buckets' last step (1
  // before compression starts).
  [[nodiscard]] double compression_rate() const noexcept {
    std::size_t full = 0, sent = 0;
    for (const auto& [k, b] : buckets_) {
      full += b.full_elements;
      sent += b.sent_elements;
    }
    return sent ? static_cast<double>(full) / static_cast<double>(sent) : 1.0;
  }

  // State: options that shape it, then per bucket its counter, error feedback and Q.
  void save_state(state_writer& w) const {
    w.put_string("powersgd");
    w.put(static_cast<std::uint64_t>(opts_.matrix_approximation_rank));
    w.put(static_cast<std::uint64_t>(buckets_.size()));
    for (const auto& [k, b] : buckets_) {
      w.put(static_cast<std::uint64_t>(k));
      w.put(b.iter);
      w.put(static_cast<std::uint64_t>(b.full_elements));
      w.put(static_cast<std::uint64_t>(b.sent_elements));
      w.put(static_cast<std::uint8_t>(b.is_double));
      if (b.is_double) {
        put(w, b.error_d);
        put(w, b.q_d);
      } else {
        put(w, b.error_f);
        put(w, b.q_f);
      }
    }
  }
  void load_state(state_reader& r) {
    const auto kind = r.get_string("PowerSGD state kind");
    if (kind != "powersgd") throw checkpoint_error("PowerSGD state is for '" + kind + "', expected 'powersgd'");
    const auto rank = r.get<std::uint64_t>("PowerSGD matrix_approximation_rank");
    if (rank != opts_.matrix_approximation_rank) {
      throw checkpoint_error("PowerSGD state was saved with matrix_approximation_rank " + std::to_string(rank) +
                             ", this run has " + std::to_string(opts_.matrix_approximation_rank) + " (expected the same)");
    }
    const auto count = r.get<std::uint64_t>("PowerSGD bucket count");
    std::map<std::size_t, bucket_state> loaded;
    for (std::uint64_t i = 0; i < count; ++i) {
      const auto k = static_cast<std::size_t>(r.get<std::uint64_t>("PowerSGD bucket index"));
      auto& b = loaded[k];
      b.iter = r.get<std::int64_t>("PowerSGD bucket iteration");
      b.full_elements = static_cast<std::size_t>(r.get<std::uint64_t>("PowerSGD bucket elements"));
      b.sent_elements = static_cast<std::size_t>(r.get<std::uint64_t>("PowerSGD bucket elements sent"));
      b.is_double = r.get<std::uint8_t>("PowerSGD bucket dtype") != 0;
      if (b.is_double) {
        get(r, b.error_d, "PowerSGD error feedback of bucket " + std::to_string(k));
        get(r, b.q_d, "PowerSGD Q of bucket " + std::to_string(k));
      } else {
        get(r, b.error_f, "PowerSGD error feedback of bucket " + std::to_string(k));
        get(r, b.q_f, "PowerSGD Q of bucket " + std::to_string(k));
      }
    }
    buckets_ = std::move(loaded);
  }

  // One bucket through PowerSGD (what comm_hooks::powersgd calls). Waits for its collectives:
  // the two all_reduces of a bucket are sequential (Q needs the summed P), and issuing the second
  // from the first's completion callback would race with the next bucket's launch on the
  // training thread, while every rank must issue its collectives in one order.
  template <class T>
  void reduce(grad_bucket& gb, tensor_view<T> buf) {
    namespace ps = detail::powersgd;
    auto& st = buckets_[gb.index()];
    st.is_double = std::same_as<T, double>;
    const std::int64_t iter = st.iter++;
    const auto world = static_cast<T>(gb.world_size());
    // Our bucket holds the sum over micro-steps when divisor = world x micro; work in units of
    // one rank's mean gradient so that the algorithm below is PyTorch's.
    const T pre = world / static_cast<T>(gb.divisor());
    if (pre != T(1)) {
      for (auto& x : buf) x *= pre;
    }
    st.full_elements = buf.size();
    if (iter < opts_.start_iter) {
      st.sent_elements = buf.size();
      for (auto& x : buf) x /= world;
      gb.all_reduce(buf).wait();
      return;
    }
    const auto l = ps::plan(gb.param_shapes(), buf.size(), opts_);
    st.sent_elements = l.rest_elements + l.p_elements + l.q_elements;
    auto& err = st.template error<T>();
    if (opts_.use_error_feedback) {
      if (err.size() != buf.size()) err.assign(buf.size(), T(0));
      for (std::size_t i = 0; i < buf.size(); ++i) buf[i] += err[i];
    }
    // The rest: all-reduced (mean) as it is, while the matrices are compressed.
    std::vector<T> rest(l.rest_elements);
    {
      std::size_t o = 0;
      for (auto [off, cnt] : l.rest) {
        for (std::size_t i = 0; i < cnt; ++i) rest[o + i] = buf[off + i] / world;
        o += cnt;
      }
    }
    work rest_done = rest.empty() ? work::completed() : gb.all_reduce(tensor_view<T>(rest));
    if (!l.matrices.empty()) compress(gb, buf, l, st, iter);
    rest_done.wait();
    std::size_t o = 0;
    for (auto [off, cnt] : l.rest) {
      for (std::size_t i = 0; i < cnt; ++i) buf[off + i] = rest[o + i];
      o += cnt;
    }
  }

 private:
  struct bucket_state {
    std::int64_t iter = 0;
    std::size_t full_elements = 0, sent_elements = 0;
    bool is_double = false;
    std::vector<float> error_f, q_f;
    std::vector<double> error_d, q_d;
    template <class T>
    [[nodiscard]] std::vector<T>& error() noexcept {
      if constexpr (std::same_as<T, double>) return error_d; else return error_f;
    }
    template <class T>
    [[nodiscard]] const std::vector<T>& error() const noexcept {
      if constexpr (std::same_as<T, double>) return error_d; else return error_f;
    }
    template <class T>
    [[nodiscard]] std::vector<T>& q() noexcept {
      if constexpr (std::same_as<T, double>) return q_d; else return q_f;
    }
  };

  template <class T>
  static void put(state_writer& w, const std::vector<T>& v) {
    w.put(static_cast<std::uint64_t>(v.size()));
    w.put_array(std::span<const T>(v));
  }
  template <class T>
  static void get(state_reader& r, std::vector<T>& v, const std::string& what) {
    v.resize(static_cast<std::size_t>(r.get<std::uint64_t>(what)));
    r.get_array(std::span<T>(v), what);
  }

  // The matrices of a bucket: P = M Q summed, orthogonalized; Q = M^T P averaged; M ~ P Q^T.
  // Error feedback keeps M + e - P Q_local^T (this rank's own residual: the paper's rule, where
  // PyTorch keeps M + e - P Q^T with the averaged Q, which also carries each rank's distance to
  // the mean into its next step; the mean of the errors, and so the updates, are the same).
  template <class T>
  void compress(grad_bucket& gb, tensor_view<T> buf, const detail::powersgd::layout& l, bucket_state& st,
                std::int64_t iter) {
    namespace ps = detail::powersgd;
    const auto world = static_cast<T>(gb.world_size());
    const T eps = static_cast<T>(opts_.orthogonalization_epsilon);
    auto& q = st.template q<T>();
    const bool fresh = !opts_.warm_start || q.size() != l.q_elements;
    if (fresh) {
      q.resize(l.q_elements);
      ps::normal_stream rng(opts_.random_seed ^ (0x9E3779B97F4A7C15ull * static_cast<std::uint64_t>(iter + 1)) ^
                            (static_cast<std::uint64_t>(gb.index()) << 48));
      for (auto& x : q) x = static_cast<T>(rng.next());
    }
    {
      std::size_t qo = 0;
      for (const auto& mx : l.matrices) {
        ps::orthogonalize(q.data() + qo, mx.m, mx.r, eps);
        qo += mx.m * mx.r;
      }
    }
    std::vector<T> p(l.p_elements);
    {
      std::size_t po = 0, qo = 0;
      for (const auto& mx : l.matrices) {
        ps::matmul(buf.data() + mx.offset, q.data() + qo, p.data() + po, mx.n, mx.m, mx.r);
        po += mx.n * mx.r;
        qo += mx.m * mx.r;
      }
    }
    gb.all_reduce(tensor_view<T>(p)).wait();  // summed, not averaged: P is orthogonalized next
    {
      std::size_t po = 0, qo = 0;
      for (const auto& mx : l.matrices) {
        ps::orthogonalize(p.data() + po, mx.n, mx.r, eps);
        ps::matmul_t(buf.data() + mx.offset, p.data() + po, q.data() + qo, mx.n, mx.m, mx.r);
        po += mx.n * mx.r;
        qo += mx.m * mx.r;
      }
    }
    const bool feedback = opts_.use_error_feedback;
    std::vector<T> q_local;
    if (feedback) q_local = q;
    gb.all_reduce(tensor_view<T>(q)).wait();
    for (auto& x : q) x /= world;
    auto& err = st.template error<T>();
    std::vector<T> local;
    std::size_t po = 0, qo = 0;
    for (const auto& mx : l.matrices) {
      T* mm = buf.data() + mx.offset;
      if (feedback) {
        local.resize(mx.n * mx.m);
        ps::outer(p.data() + po, q_local.data() + qo, local.data(), mx.n, mx.m, mx.r);
        for (std::size_t i = 0; i < local.size(); ++i) err[mx.offset + i] = mm[i] - local[i];
      }
      ps::outer(p.data() + po, q.data() + qo, mm, mx.n, mx.m, mx.r);
      po += mx.n * mx.r;
      qo += mx.m * mx.r;
    }
    if (feedback) {
      // What is all-reduced exactly leaves no error.
      for (auto [off, cnt] : l.rest) std::fill(err.begin() + static_cast<std::ptrdiff_t>(off),
                                               err.begin() + static_cast<std::ptrdiff_t>(off + cnt), T(0));
    }
  }

  powersgd_options opts_;
  std::map<std::size_t, bucket_state> buckets_;
};

namespace comm_hooks {

// PowerSGD on each bucket (see powersgd_state); the state is this rank's, shared with the caller
// so it can be saved and loaded. Host float/double buckets.
[[nodiscard]] inline comm_hook powersgd(std::shared_ptr<powersgd_state> state) {
  if (!state) throw invalid_argument_error("comm_hooks::powersgd: the state is null (expected std::make_shared<powersgd_state>(options))");
  return [state = std::move(state)](grad_bucket& b) -> work {
    if (b.on_cuda()) {
      throw invalid_argument_error("comm hook powersgd: bucket " + std::to_string(b.index()) +
                                   " is in CUDA memory; PowerSGD runs on host buckets only for now");
    }
    detail::ddp::visit_float_bucket(b, [&](auto buf) {
      state->reduce(b, buf);
      return 0;
    });
    return work::completed();
  };
}

}  // namespace comm_hooks

}  // namespace partrain::inline v0
