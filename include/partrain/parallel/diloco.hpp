// partrain/parallel/diloco.hpp: DiLoCo (Douillard et al., arXiv:2311.08105) over any inner
// optimizer and any communicator: every rank runs `inner_steps` (H) steps of its own optimizer
// on its own data, then the outer gradient (the parameters at the start of the round minus this
// rank's parameters now, averaged over ranks) drives an outer optimizer, Nesterov SGD with lr 0.7
// and momentum 0.9 by default. One parameter-sized exchange per H steps instead of one gradient
// all_reduce per step; optionally in 16 bits or in 8 bits (per-tensor scaled int8). The outer
// state lives on the host; CUDA parameters are mirrored there at each outer step (one copy each
// way per H steps), and a backend that takes device memory only (NCCL) exchanges through a
// device copy.
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include <partrain/comm/process_group.hpp>
#include <partrain/core/error.hpp>
#include <partrain/core/for_each_index.hpp>
#include <partrain/core/half.hpp>
#include <partrain/core/memory_space.hpp>
#include <partrain/core/tensor_view.hpp>
#include <partrain/core/work.hpp>
#include <partrain/model/concepts.hpp>
#include <partrain/optim/optimizer.hpp>
#include <partrain/optim/sgd.hpp>
#include <partrain/optim/state_io.hpp>
#include <partrain/parallel/detail/ddp_elements.hpp>
#include <partrain/parallel/detail/evaluate.hpp>
#include <partrain/parallel/detail/host_staging.hpp>

namespace partrain::inline v0 {

// How the outer gradients travel.
enum class outer_compression : std::uint8_t {
  none,  // the parameters' type (fp32 or fp64), one all_reduce
  fp16,  // IEEE half, one all_reduce (divided by the world size first, so sums stay in range)
  bf16,  // bfloat16, one all_reduce
  int8,  // per-tensor scaled int8: an all_gather of the codes and scales, summed locally
};

[[nodiscard]] constexpr std::string_view to_string(outer_compression c) noexcept {
  switch (c) {
    case outer_compression::none: return "none";
    case outer_compression::fp16: return "fp16";
    case outer_compression::bf16: return "bf16";
    case outer_compression::int8: return "int8";
  }
  return "unknown";
}

struct diloco_options {
  // H: inner steps between two outer steps.
  std::int64_t inner_steps = 500;
  // The outer optimizer: torch.optim.SGD(lr, momentum, nesterov) on the outer gradient.
  double outer_lr = 0.7;
  double outer_momentum = 0.9;
  bool nesterov = true;
  outer_compression compression = outer_compression::none;
  // Copy rank 0's parameters to every rank at construction (every rank must start a round from
  // the same point; false: the caller guarantees they are equal).
  bool broadcast_parameters = true;
  // Uneven inputs: a rank that runs out of batches calls join() and takes part in the others'
  // outer steps with a zero outer gradient (no progress; the mean stays over all ranks, as DDP
  // divides by the initial world size) until every rank has joined. Costs one small all_reduce
  // per outer step.
  bool join = false;
};

namespace detail::diloco {

inline void validate(const diloco_options& o) {
  auto bad = [](const std::string& what) { throw invalid_argument_error("diloco_options: " + what); };
  if (o.inner_steps < 1) bad("inner_steps must be >= 1 (local steps between outer steps), got " + std::to_string(o.inner_steps));
  if (!(o.outer_lr >= 0)) bad("outer_lr must be >= 0, got " + std::to_string(o.outer_lr));
  if (!(o.outer_momentum >= 0 && o.outer_momentum < 1)) {
    bad("outer_momentum must be in [0, 1), got " + std::to_string(o.outer_momentum));
  }
  if (o.nesterov && o.outer_momentum == 0) {
    bad("nesterov needs outer_momentum > 0 (set nesterov = false for plain outer SGD)");
  }
}

// The outer optimizer's view of the model: the model's own values, and the outer gradients as
// the gradients, so partrain::sgd (torch.optim.SGD's rule, its state save/load) does the step.
template <class T>
struct outer_param {
  tensor_view<T> v, g;
  [[nodiscard]] tensor_view<T> value() const noexcept { return v; }
  [[nodiscard]] tensor_view<T> grad() const noexcept { return g; }
};
template <class T>
struct outer_model {
  std::vector<outer_param<T>> params;
  [[nodiscard]] std::vector<outer_param<T>>& parameters() noexcept { return params; }
};

// The outer model over `values` (each parameter's values), its gradients views of `delta`,
// resized to hold them back to back in that order.
template <class T, class Views>
[[nodiscard]] outer_model<T> outer_model_over(const Views& values, std::vector<T>& delta) {
  std::size_t total = 0;
  for (const auto& v : values) total += v.size();
  delta.resize(total);
  outer_model<T> om;
  std::size_t at = 0;
  for (const auto& v : values) {
    om.params.push_back({v, tensor_view<T>(delta.data() + at, v.shape())});
    at += v.size();
  }
  return om;
}

// The int8 code of x with scale s = max|x| / 127: round to nearest even, clamp to +-127 (-128 is
// never used, so the code is symmetric), stored as the byte's bits.
template <class T>
[[nodiscard]] inline std::uint8_t quantize(T x, T inv_scale) noexcept {
  const T q = std::nearbyint(x * inv_scale);
  if (!(q == q)) return 0;  // NaN has no code (and casting it is undefined)
  const auto c = static_cast<std::int8_t>(std::clamp(q, T(-127), T(127)));
  return static_cast<std::uint8_t>(c);
}
[[nodiscard]] inline float code_value(std::uint8_t b) noexcept {
  return static_cast<float>(static_cast<std::int8_t>(b));
}

// The mean over ranks of an outer gradient, every rank getting the same bytes: start() issues
// the collectives on a copy (so the caller may go on training while they run), finish() waits and
// writes the mean. One exchange in flight at a time.
template <class T>
class outer_exchange {
 public:
  explicit outer_exchange(outer_compression c) noexcept : c_(c) {}
  outer_exchange(const outer_exchange&) = delete;
  outer_exchange& operator=(const outer_exchange&) = delete;
  // The collectives write into this object's buffers: they must be done before it goes.
  ~outer_exchange() {
    for (auto& w : works_) {
      try {
        w.wait();
      } catch (...) {
      }
    }
  }
  [[nodiscard]] bool in_flight() const noexcept { return !works_.empty(); }

  // `offsets`/`sizes`: the tensors within `delta` (int8 scales them one by one).
  template <class C>
  void start(C& comm, std::span<const T> delta, std::span<const std::size_t> offsets, std::span<const std::size_t> sizes) {
    world_ = comm.size();
    n_ = delta.size();
    works_.clear();
    if (world_ == 1) {
      plain_.assign(delta.begin(), delta.end());
      return;
    }
    switch (c_) {
      case outer_compression::none: {
        plain_.resize(n_);
        for (std::size_t i = 0; i < n_; ++i) plain_[i] = delta[i] / static_cast<T>(world_);
        launch(comm, std::span<T>(plain_), [&](auto v) { return comm.all_reduce(v, reduce_op::sum); });
        return;
      }
      case outer_compression::fp16: return start_16<half>(comm, delta, half_);
      case outer_compression::bf16: return start_16<bfloat16>(comm, delta, bf16_);
      case outer_compression::int8: return start_int8(comm, delta, offsets, sizes);
    }
  }

  void finish(std::span<T> out) {
    for (auto& w : works_) w.wait();
    works_.clear();
    if (world_ == 1 || c_ == outer_compression::none) {
      std::copy(plain_.begin(), plain_.end(), out.begin());
      return;
    }
    switch (c_) {
      case outer_compression::none: break;
      case outer_compression::fp16:
        for_each_index(host_exec{}, n_, ddp::decompress_16_fn<half, T>{half_.data(), out.data()});
        break;
      case outer_compression::bf16:
        for_each_index(host_exec{}, n_, ddp::decompress_16_fn<bfloat16, T>{bf16_.data(), out.data()});
        break;
      case outer_compression::int8: finish_int8(out); break;
    }
  }

 private:
  // A backend that takes host memory runs the collective while training goes on (finish() waits);
  // one that takes device memory only (NCCL) runs it now, through a device copy.
  template <class C, class... Spans>
  void launch(C& comm, Spans... spans) {
    auto keep = [&](work w) {
      if (takes_host_memory(comm)) {
        works_.push_back(std::move(w));
      } else {
        w.wait();
      }
    };
    host_collective(comm, spans..., keep);
  }

  // The fp16/bf16 hooks' casts (one home for them): H(x) / world in H, summed in H.
  template <class H, class C>
  void start_16(C& comm, std::span<const T> delta, std::vector<H>& h) {
    h.resize(n_);
    for_each_index(host_exec{}, n_, ddp::compress_16_fn<T, H>{delta.data(), h.data(), static_cast<float>(world_)});
    launch(comm, std::span<H>(h), [&](auto v) { return comm.all_reduce(v, reduce_op::sum); });
  }

  // int8 codes cannot be summed by the all_reduce itself: the sum of n codes leaves int8 at two
  // ranks, and each rank's code means something else under its own scale. So every rank's codes
  // and scales are all-gathered (world x (N bytes + one float per tensor)) and every rank
  // decodes and sums them itself, in rank order, in T: the same operations on the same bytes, so
  // the same result everywhere. What a rank sends, (n-1) * N bytes, beats the fp32 all_reduce's
  // 8 (n-1)/n * N while n < 8; beyond that use fp16/bf16.
  template <class C>
  void start_int8(C& comm, std::span<const T> delta, std::span<const std::size_t> offsets,
                  std::span<const std::size_t> sizes) {
    offsets_.assign(offsets.begin(), offsets.end());
    sizes_.assign(sizes.begin(), sizes.end());
    const std::size_t tensors = sizes_.size();
    const auto world = static_cast<std::size_t>(world_);
    codes_.resize(n_);
    scales_.resize(tensors);
    for (std::size_t k = 0; k < tensors; ++k) {
      const T* d = delta.data() + offsets_[k];
      T amax = 0;
      for (std::size_t i = 0; i < sizes_[k]; ++i) amax = std::max(amax, std::abs(d[i]));
      const float scale = static_cast<float>(amax / T(127));
      scales_[k] = scale;
      const T inv = scale > 0 ? T(1) / static_cast<T>(scale) : T(0);
      std::uint8_t* c = codes_.data() + offsets_[k];
      for (std::size_t i = 0; i < sizes_[k]; ++i) c[i] = quantize(d[i], inv);
    }
    all_codes_.resize(n_ * world);
    all_scales_.resize(tensors * world);
    launch(comm, std::span<const std::uint8_t>(codes_), std::span<std::uint8_t>(all_codes_),
           [&](auto in, auto out) { return comm.all_gather(in, out); });
    launch(comm, std::span<const float>(scales_), std::span<float>(all_scales_),
           [&](auto in, auto out) { return comm.all_gather(in, out); });
  }
  void finish_int8(std::span<T> out) {
    const std::size_t tensors = sizes_.size();
    const auto world = static_cast<std::size_t>(world_);
    std::fill(out.begin(), out.end(), T(0));
    for (std::size_t r = 0; r < world; ++r) {
      for (std::size_t k = 0; k < tensors; ++k) {
        const T s = static_cast<T>(all_scales_[r * tensors + k]);
        const std::uint8_t* c = all_codes_.data() + r * n_ + offsets_[k];
        T* d = out.data() + offsets_[k];
        for (std::size_t i = 0; i < sizes_[k]; ++i) d[i] += static_cast<T>(code_value(c[i])) * s;
      }
    }
    const T inv_world = T(1) / static_cast<T>(world);
    for (auto& x : out) x *= inv_world;
  }

  outer_compression c_;
  int world_ = 1;
  std::size_t n_ = 0;
  std::vector<work> works_;
  std::vector<T> plain_;
  std::vector<half> half_;
  std::vector<bfloat16> bf16_;
  std::vector<std::size_t> offsets_, sizes_;
  std::vector<std::uint8_t> codes_, all_codes_;
  std::vector<float> scales_, all_scales_;
};

// Rank 0's parameter values to every rank (host views: the parameters, or their host mirror),
// after checking that every rank has as many parameters and values (a rank with another model
// would otherwise receive garbage).
template <class C, class T>
void broadcast_values(C& comm, std::span<const tensor_view<T>> values, const char* who) {
  auto wait = [](auto&& w) { w.wait(); };
  std::vector<std::int64_t> mine{static_cast<std::int64_t>(values.size()), 0};
  for (const auto& v : values) mine[1] += static_cast<std::int64_t>(v.size());
  std::vector<std::int64_t> root = mine;
  host_collective(comm, std::span<std::int64_t>(root), [&](auto t) { return comm.broadcast(t, 0); }, wait);
  if (root != mine) {
    throw config_error("rank " + std::to_string(comm.rank()) + " " + who + ": this rank's model has " +
                       std::to_string(mine[0]) + " parameters with " + std::to_string(mine[1]) + " values, rank 0's has " +
                       std::to_string(root[0]) + " with " + std::to_string(root[1]) +
                       " (expected the same model on every rank)");
  }
  for (const auto& v : values) {
    host_collective(comm, std::span<T>(v.data(), v.size()), [&](auto t) { return comm.broadcast(t, 0); }, wait);
  }
}

// What a timeout says when join is off: uneven inputs are the usual cause.
[[nodiscard]] inline std::string join_hint(bool join, const char* options) {
  return join ? std::string()
              : std::string(". If ranks run out of batches at different steps, construct with ") + options +
                    "{.join = true} and call join() on a rank once its data ends";
}

// The join protocol's small all_reduce (active-rank counts, step counts), its timeout naming the
// rank and, when join is off, the fix (`options` names the options struct that has .join).
template <class C>
void small_all_reduce(C& comm, std::span<std::int64_t> v, reduce_op op, const std::string& where, const char* what,
                      bool join, const char* options) {
  try {
    host_collective(comm, v, [&](auto t) { return comm.all_reduce(t, op); }, [](auto&& w) { w.wait(); });
  } catch (const timeout_error& e) {
    throw timeout_error(where + what + " failed: " + e.what() + join_hint(join, options));
  }
}

}  // namespace detail::diloco

template <class M, optimizer Inner, communicator C = process_group>
class diloco {
  static_assert(check_model<M>(), "partrain: diloco takes a model");
  using P = param_t<M>;
  using T = param_element_t<P>;
  static_assert(std::same_as<T, float> || std::same_as<T, double>, "partrain: diloco steps float or double parameters");

 public:
  diloco(M& m, Inner& inner, C& comm, diloco_options o = {})
      : opts_((detail::diloco::validate(o), o)), model_(&m), inner_(&inner), comm_(&comm), values_(m),
        outer_model_(make_outer_model()), outer_(outer_model_, outer_sgd_options()) {
    values_.pull("diloco");
    if (opts_.broadcast_parameters) {
      detail::diloco::broadcast_values(*comm_, values_.views(), "diloco");
      values_.push();
    }
    snapshot();
  }
  diloco(const diloco&) = delete;
  diloco& operator=(const diloco&) = delete;

  // One inner step on this rank's batch (no communication), then the outer step when the round
  // of H inner steps is complete. Returns this rank's loss.
  template <class B>
  double train_step(const B& batch) {
    static_assert(check_trainable<M, B>());
    if (joined_) throw invalid_argument_error(where() + "train_step after join() on this rank");
    const double loss = model_->train_step(batch);
    inner_->step();
    ++steps_;
    if (++inner_step_ == opts_.inner_steps) sync();
    return loss;
  }

  // The outer step now (train_step calls it every H steps): outer gradient = start - current,
  // averaged over ranks; back to the start; the outer optimizer steps; a new round starts there.
  // Collective: every rank that has not joined calls it at the same step.
  void sync() {
    if (opts_.join) {  // tells the joined ranks, waiting in join(), that an outer step follows
      std::array<std::int64_t, 1> active{1};
      small_all_reduce(std::span<std::int64_t>(active), reduce_op::sum, "active-rank all_reduce");
    }
    outer_step();
  }

  // Uneven inputs (needs diloco_options::join): call once this rank has no more batches. It
  // takes part in the other ranks' outer steps (its outer gradient is whatever progress it made
  // since its last one, then zero) until every rank has joined; then every rank's counters are
  // set to the most steps any rank took, so the next epoch's rounds end at the same step
  // everywhere. Returns true when this rank took part in at least one outer step of the others.
  bool join() {
    if (!opts_.join) {
      throw config_error(where() + "join() needs join enabled: construct with diloco_options{.join = true} (every "
                                   "outer step then starts with a count of the ranks that still have data)");
    }
    joined_ = true;
    bool shadowed = false;
    for (;;) {
      std::array<std::int64_t, 1> active{0};
      small_all_reduce(std::span<std::int64_t>(active), reduce_op::sum, "join active-rank all_reduce");
      if (active[0] == 0) break;
      shadowed = true;
      outer_step();
    }
    std::array<std::int64_t, 2> counts{inner_step_, steps_};
    small_all_reduce(std::span<std::int64_t>(counts), reduce_op::max, "join step-count all_reduce");
    inner_step_ = counts[0];
    steps_ = counts[1];
    joined_ = false;
    return shadowed;
  }

 private:
  void outer_step() {
    values_.pull("diloco");
    const auto values = values_.views();
    for (std::size_t k = 0; k < values.size(); ++k) {
      const auto& v = values[k];
      const T* s = start_.data() + offsets_[k];
      T* d = delta_.data() + offsets_[k];
      for (std::size_t i = 0; i < v.size(); ++i) d[i] = s[i] - v[i];  // old minus new: the sign SGD expects
    }
    try {
      exchange_.start(*comm_, std::span<const T>(delta_), offsets_, sizes_);
      exchange_.finish(std::span<T>(delta_));
    } catch (const timeout_error& e) {
      throw timeout_error(where() + "outer gradient exchange failed: " + e.what() + join_hint());
    }
    for (std::size_t k = 0; k < values.size(); ++k) {
      std::memcpy(values[k].data(), start_.data() + offsets_[k], values[k].size_bytes());
    }
    outer_.step();
    values_.push();
    snapshot();
    inner_step_ = 0;
    ++outer_steps_;
  }

 public:

  [[nodiscard]] std::int64_t steps() const noexcept { return steps_; }
  [[nodiscard]] std::int64_t outer_steps() const noexcept { return outer_steps_; }
  // Inner steps taken in the current round (0 right after an outer step).
  [[nodiscard]] std::int64_t inner_step() const noexcept { return inner_step_; }
  // The parameters every rank agrees on: where the current round started.
  [[nodiscard]] std::span<const T> global_parameters() const noexcept { return start_; }
  [[nodiscard]] const diloco_options& options() const noexcept { return opts_; }
  [[nodiscard]] M& module() noexcept { return *model_; }
  [[nodiscard]] C& comm() noexcept { return *comm_; }
  [[nodiscard]] Inner& optimizer() noexcept { return *inner_; }
  [[nodiscard]] sgd<detail::diloco::outer_model<T>>& outer_optimizer() noexcept { return outer_; }

  // Each rank evaluates its own current parameters on its batches; the sums over all ranks (as
  // DDP's evaluate). Inside a round the ranks' models differ: call sync() first for the one model.
  template <class Range>
  [[nodiscard]] eval_result evaluate(Range&& batches) {
    return detail::ddp::evaluate_summed(*model_, *comm_, std::forward<Range>(batches));
  }

  // State: kind tag, options, counters, the round's start parameters, the outer optimizer's
  // momentum, then the inner optimizer's state when it has one. The model's parameters are the
  // caller's to save (they differ across ranks inside a round).
  void save_state(state_writer& w) const {
    w.put_string("diloco");
    w.put(opts_.inner_steps);
    w.put(static_cast<std::uint8_t>(opts_.compression));
    w.put(steps_);
    w.put(inner_step_);
    w.put(outer_steps_);
    w.put_array(std::span<const T>(start_));
    outer_.save_state(w);
    if constexpr (stateful_optimizer<Inner>) inner_->save_state(w);
  }
  void load_state(state_reader& r) {
    const auto kind = r.get_string("DiLoCo state kind");
    if (kind != "diloco") throw checkpoint_error("DiLoCo state is for '" + kind + "', expected 'diloco'");
    const auto h = r.get<std::int64_t>("DiLoCo inner_steps");
    const auto comp = r.get<std::uint8_t>("DiLoCo compression");
    if (h != opts_.inner_steps || comp != static_cast<std::uint8_t>(opts_.compression)) {
      throw checkpoint_error("DiLoCo state was saved with inner_steps " + std::to_string(h) + " and compression " +
                             std::string(to_string(static_cast<outer_compression>(comp))) + ", this run has " +
                             std::to_string(opts_.inner_steps) + " and " + std::string(to_string(opts_.compression)) +
                             " (expected the same)");
    }
    const auto steps = r.get<std::int64_t>("DiLoCo step count");
    const auto inner_step = r.get<std::int64_t>("DiLoCo position in the round");
    const auto outer_steps = r.get<std::int64_t>("DiLoCo outer step count");
    std::vector<T> start(start_.size());
    r.get_array(std::span<T>(start), "DiLoCo start parameters");
    outer_.load_state(r);
    if constexpr (stateful_optimizer<Inner>) inner_->load_state(r);
    start_ = std::move(start);
    steps_ = steps;
    inner_step_ = inner_step;
    outer_steps_ = outer_steps;
  }

 private:
  [[nodiscard]] std::string where() const { return "rank " + std::to_string(comm_->rank()) + " diloco: "; }
  void small_all_reduce(std::span<std::int64_t> v, reduce_op op, const char* what) {
    detail::diloco::small_all_reduce(*comm_, v, op, where(), what, opts_.join, "diloco_options");
  }
  [[nodiscard]] std::string join_hint() const { return detail::diloco::join_hint(opts_.join, "diloco_options"); }

  [[nodiscard]] sgd_options outer_sgd_options() const {
    return {.lr = opts_.outer_lr, .momentum = opts_.outer_momentum, .dampening = 0, .weight_decay = 0,
            .nesterov = opts_.nesterov};
  }

  // Offsets of every parameter in the flat buffers; the outer model's views into delta_ (its
  // values are the host views: the parameters, or their mirror).
  detail::diloco::outer_model<T> make_outer_model() {
    std::size_t total = 0;
    for (const auto& v : values_.views()) {
      offsets_.push_back(total);
      sizes_.push_back(v.size());
      total += v.size();
    }
    start_.resize(total);
    return detail::diloco::outer_model_over(values_.views(), delta_);
  }

  // The round's start: the host values as they are now (pulled).
  void snapshot() {
    const auto values = values_.views();
    for (std::size_t k = 0; k < values.size(); ++k) {
      std::memcpy(start_.data() + offsets_[k], values[k].data(), values[k].size_bytes());
    }
  }

  diloco_options opts_;
  M* model_;
  Inner* inner_;
  C* comm_;
  detail::host_values<M> values_;  // host views of the parameters (a mirror of CUDA ones)
  std::vector<std::size_t> offsets_, sizes_;
  std::vector<T> start_;  // the round's start: the parameters every rank agrees on
  std::vector<T> delta_;  // the outer gradient (the outer optimizer's grads view it)
  detail::diloco::outer_model<T> outer_model_;
  sgd<detail::diloco::outer_model<T>> outer_;
  detail::diloco::outer_exchange<T> exchange_{opts_.compression};
  std::int64_t steps_ = 0, inner_step_ = 0, outer_steps_ = 0;
  bool joined_ = false;  // inside join(): train_step is refused
};

}  // namespace partrain::inline v0
