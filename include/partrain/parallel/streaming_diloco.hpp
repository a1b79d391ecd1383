// partrain/parallel/streaming_diloco.hpp: Streaming DiLoCo (Douillard et al., arXiv:2501.18512;
// torchft's DiLoCo over model fragments): the parameters are cut into F fragments (parameter k
// in fragment k % F, strided as in the paper), and each fragment has its own DiLoCo round of H
// inner steps, the rounds staggered by H / F steps, so only 1/F of the parameters travels at a
// time. A fragment's exchange starts `fragment_sync_delay` (tau) inner steps before its outer
// step and runs while those steps train: training does not wait for the network, at the price of
// the tau steps of local progress on that fragment, which the outer step replaces. Join (uneven
// inputs): a rank out of batches calls join() and takes part in the others' exchanges. CUDA
// parameters are mirrored on the host at each fragment's exchange and outer step; over NCCL the
// exchange runs at its start, through a device copy (no overlap).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include <partrain/comm/process_group.hpp>
#include <partrain/core/error.hpp>
#include <partrain/core/memory_space.hpp>
#include <partrain/core/tensor_view.hpp>
#include <partrain/model/concepts.hpp>
#include <partrain/optim/optimizer.hpp>
#include <partrain/optim/sgd.hpp>
#include <partrain/optim/state_io.hpp>
#include <partrain/parallel/detail/evaluate.hpp>
#include <partrain/parallel/diloco.hpp>

namespace partrain::inline v0 {

struct streaming_diloco_options {
  // H: inner steps between two outer steps of one fragment.
  std::int64_t inner_steps = 500;
  // F: fragments; H must be a multiple of F (fragment f's outer step is at step (f + 1) H / F of
  // each round).
  std::int64_t fragments = 2;
  // tau: inner steps a fragment's exchange overlaps, 0 <= tau < H / F (so at most one exchange
  // is in flight). 0: exchange and outer step in the same step, no overlap.
  std::int64_t fragment_sync_delay = 1;
  double outer_lr = 0.7;
  double outer_momentum = 0.9;
  bool nesterov = true;
  outer_compression compression = outer_compression::none;
  bool broadcast_parameters = true;
  // Uneven inputs: a rank that runs out of batches calls join() and takes part in the others'
  // fragment exchanges (with whatever progress it made on the fragment since its last outer
  // step, then zero) until every rank has joined. Costs one small all_reduce per exchange.
  bool join = false;
};

namespace detail::diloco {

inline void validate(const streaming_diloco_options& o, std::size_t params) {
  validate(diloco_options{.inner_steps = o.inner_steps, .outer_lr = o.outer_lr, .outer_momentum = o.outer_momentum,
                          .nesterov = o.nesterov});
  auto bad = [](const std::string& what) { throw invalid_argument_error("streaming_diloco_options: " + what); };
  if (o.fragments < 1) bad("fragments must be >= 1, got " + std::to_string(o.fragments));
  if (o.inner_steps % o.fragments != 0) {
    bad("inner_steps (" + std::to_string(o.inner_steps) + ") must be a multiple of fragments (" +
        std::to_string(o.fragments) + "): the fragments' outer steps are H / F steps apart");
  }
  if (static_cast<std::uint64_t>(o.fragments) > params) {
    bad("fragments (" + std::to_string(o.fragments) + ") must not exceed the model's " + std::to_string(params) +
        " parameters (a fragment holds whole parameters)");
  }
  const std::int64_t gap = o.inner_steps / o.fragments;
  if (o.fragment_sync_delay < 0 || o.fragment_sync_delay >= gap) {
    bad("fragment_sync_delay must be in [0, inner_steps / fragments) = [0, " + std::to_string(gap) + "), got " +
        std::to_string(o.fragment_sync_delay) + " (one exchange in flight at a time)");
  }
}

}  // namespace detail::diloco

template <class M, optimizer Inner, communicator C = process_group>
class streaming_diloco {
  static_assert(check_model<M>(), "partrain: streaming_diloco takes a model");
  using P = param_t<M>;
  using T = param_element_t<P>;
  static_assert(std::same_as<T, float> || std::same_as<T, double>,
                "partrain: streaming_diloco steps float or double parameters");

 public:
  streaming_diloco(M& m, Inner& inner, C& comm, streaming_diloco_options o = {})
      : opts_(o), model_(&m), inner_(&inner), comm_(&comm), values_(m), exchange_(o.compression) {
    detail::diloco::validate(opts_, values_.size());
    build_fragments();
    values_.pull("streaming_diloco");
    if (opts_.broadcast_parameters) {
      detail::diloco::broadcast_values(*comm_, values_.views(), "streaming_diloco");
      values_.push();
    }
    for (auto& f : fragments_) snapshot(*f);
  }
  streaming_diloco(const streaming_diloco&) = delete;
  streaming_diloco& operator=(const streaming_diloco&) = delete;

  // One inner step on this rank's batch; then, when due, a fragment's exchange starts or ends
  // with its outer step. Returns this rank's loss.
  template <class B>
  double train_step(const B& batch) {
    static_assert(check_trainable<M, B>());
    if (joined_) throw invalid_argument_error(where() + "train_step after join() on this rank");
    const double loss = model_->train_step(batch);
    inner_->step();
    ++steps_;
    for (std::int64_t f = 0; f < opts_.fragments; ++f) {
      // Start before end, so that tau = 0 exchanges and steps in one go.
      if (prepares(steps_, f)) {
        if (opts_.join) {  // tells the joined ranks, waiting in join(), that an exchange follows
          std::array<std::int64_t, 1> active{1};
          small_all_reduce(std::span<std::int64_t>(active), reduce_op::sum, "active-rank all_reduce");
        }
        prepare(static_cast<std::size_t>(f));
      }
      if (performs(steps_, f)) perform(static_cast<std::size_t>(f));
    }
    return loss;
  }

  // Uneven inputs (needs streaming_diloco_options::join): call once this rank has no more
  // batches. It takes part in the other ranks' fragment exchanges, in their order, until every
  // rank has joined; then every rank's step counter is set to the most steps any rank took, so
  // the next epoch's exchanges happen at the same steps everywhere, and an exchange the
  // schedule still has in flight at that step stays in flight on every rank. The result is that
  // of the ranks out of data stepping on at learning rate 0. Returns true when this rank took
  // part in at least one exchange of the others.
  bool join() {
    if (!opts_.join) {
      throw config_error(where() + "join() needs join enabled: construct with streaming_diloco_options{.join = true} "
                                   "(every fragment exchange then starts with a count of the ranks that still have "
                                   "data)");
    }
    joined_ = true;
    bool shadowed = false;
    std::int64_t next = next_prepared(steps_);
    for (;;) {
      std::array<std::int64_t, 1> active{0};
      small_all_reduce(std::span<std::int64_t>(active), reduce_op::sum, "join active-rank all_reduce");
      if (active[0] == 0) break;
      shadowed = true;
      // The others end the exchange in flight before they start the next (tau < H / F); this
      // rank makes no progress in between, so it can end it now.
      if (pending_ >= 0) perform(static_cast<std::size_t>(pending_));
      prepare(static_cast<std::size_t>(next));
      next = (next + 1) % opts_.fragments;
    }
    std::array<std::int64_t, 1> most{steps_};
    small_all_reduce(std::span<std::int64_t>(most), reduce_op::max, "join step-count all_reduce");
    steps_ = most[0];
    // Where the schedule stands at that step: the exchange it has in flight there (the last one
    // started, which every rank took part in) stays in flight; any other is ended now.
    if (pending_ >= 0 && pending_ != in_flight_at(steps_)) perform(static_cast<std::size_t>(pending_));
    joined_ = false;
    return shadowed;
  }

  [[nodiscard]] std::int64_t steps() const noexcept { return steps_; }
  [[nodiscard]] std::int64_t outer_steps() const noexcept { return outer_steps_; }
  // The fragment whose exchange is running (-1: none).
  [[nodiscard]] std::int64_t in_flight() const noexcept { return pending_; }
  // The parameter indices of fragment f.
  [[nodiscard]] std::span<const std::size_t> fragment(std::size_t f) const { return fragments_.at(f)->params; }
  [[nodiscard]] const streaming_diloco_options& options() const noexcept { return opts_; }
  [[nodiscard]] M& module() noexcept { return *model_; }
  [[nodiscard]] C& comm() noexcept { return *comm_; }
  [[nodiscard]] Inner& optimizer() noexcept { return *inner_; }

  template <class Range>
  [[nodiscard]] eval_result evaluate(Range&& batches) {
    return detail::ddp::evaluate_summed(*model_, *comm_, std::forward<Range>(batches));
  }

  // State: options, counters, the exchange in flight (its input: load_state starts it again, on
  // every rank at the same step, so the resumed run receives the same bytes), then per fragment
  // its round's start and outer momentum, then the inner optimizer's state.
  void save_state(state_writer& w) const {
    w.put_string("streaming_diloco");
    w.put(opts_.inner_steps);
    w.put(opts_.fragments);
    w.put(opts_.fragment_sync_delay);
    w.put(static_cast<std::uint8_t>(opts_.compression));
    w.put(steps_);
    w.put(outer_steps_);
    w.put(pending_);
    if (pending_ >= 0) w.put_array(std::span<const T>(pending_delta_));
    for (const auto& f : fragments_) {
      w.put_array(std::span<const T>(f->start));
      f->outer->save_state(w);
    }
    if constexpr (stateful_optimizer<Inner>) inner_->save_state(w);
  }
  void load_state(state_reader& r) {
    const auto kind = r.get_string("streaming DiLoCo state kind");
    if (kind != "streaming_diloco") {
      throw checkpoint_error("streaming DiLoCo state is for '" + kind + "', expected 'streaming_diloco'");
    }
    const auto h = r.get<std::int64_t>("streaming DiLoCo inner_steps");
    const auto nf = r.get<std::int64_t>("streaming DiLoCo fragments");
    const auto tau = r.get<std::int64_t>("streaming DiLoCo fragment_sync_delay");
    const auto comp = r.get<std::uint8_t>("streaming DiLoCo compression");
    if (h != opts_.inner_steps || nf != opts_.fragments || tau != opts_.fragment_sync_delay ||
        comp != static_cast<std::uint8_t>(opts_.compression)) {
      throw checkpoint_error("streaming DiLoCo state was saved with inner_steps " + std::to_string(h) + ", fragments " +
                             std::to_string(nf) + ", fragment_sync_delay " + std::to_string(tau) + ", compression " +
                             std::string(to_string(static_cast<outer_compression>(comp))) + "; this run has " +
                             std::to_string(opts_.inner_steps) + ", " + std::to_string(opts_.fragments) + ", " +
                             std::to_string(opts_.fragment_sync_delay) + ", " +
                             std::string(to_string(opts_.compression)) + " (expected the same)");
    }
    if (exchange_.in_flight()) {
      throw invalid_argument_error("streaming_diloco::load_state: an exchange of this run is still in flight (load "
                                   "into a freshly constructed streaming_diloco)");
    }
    steps_ = r.get<std::int64_t>("streaming DiLoCo step count");
    outer_steps_ = r.get<std::int64_t>("streaming DiLoCo outer step count");
    pending_ = r.get<std::int64_t>("streaming DiLoCo fragment in flight");
    if (pending_ >= opts_.fragments) {
      throw checkpoint_error("streaming DiLoCo state has fragment " + std::to_string(pending_) +
                             " in flight, but there are " + std::to_string(opts_.fragments));
    }
    if (pending_ >= 0) {
      pending_delta_.resize(fragments_[static_cast<std::size_t>(pending_)]->start.size());
      r.get_array(std::span<T>(pending_delta_), "streaming DiLoCo outer gradient in flight");
    }
    for (std::size_t i = 0; i < fragments_.size(); ++i) {
      r.get_array(std::span<T>(fragments_[i]->start), "streaming DiLoCo start of fragment " + std::to_string(i));
      fragments_[i]->outer->load_state(r);
    }
    if constexpr (stateful_optimizer<Inner>) inner_->load_state(r);
    if (pending_ >= 0) start_exchange(*fragments_[static_cast<std::size_t>(pending_)]);
  }

 private:
  // The schedule: fragment f's exchange starts after step s when prepares(s, f) and ends (its
  // outer step) when performs(s, f); steps count from 1.
  [[nodiscard]] bool prepares(std::int64_t s, std::int64_t f) const {
    const std::int64_t h = opts_.inner_steps, gap = h / opts_.fragments;
    return s % h == ((f + 1) * gap - opts_.fragment_sync_delay) % h;
  }
  [[nodiscard]] bool performs(std::int64_t s, std::int64_t f) const {
    const std::int64_t h = opts_.inner_steps, gap = h / opts_.fragments;
    return s % h == ((f + 1) * gap) % h;
  }
  // The fragment whose exchange the schedule starts next after step s.
  [[nodiscard]] std::int64_t next_prepared(std::int64_t s) const {
    for (std::int64_t t = s + 1; t <= s + opts_.inner_steps; ++t) {
      for (std::int64_t f = 0; f < opts_.fragments; ++f) {
        if (prepares(t, f)) return f;
      }
    }
    return 0;  // unreachable: every round starts every fragment's exchange
  }
  // The fragment whose exchange the schedule has in flight right after step s (-1: none).
  [[nodiscard]] std::int64_t in_flight_at(std::int64_t s) const {
    for (std::int64_t t = s; t >= 1 && t > s - opts_.inner_steps; --t) {
      for (std::int64_t f = 0; f < opts_.fragments; ++f) {
        if (performs(t, f)) return -1;  // the last event was an outer step (after its start, when tau = 0)
      }
      for (std::int64_t f = 0; f < opts_.fragments; ++f) {
        if (prepares(t, f)) return f;
      }
    }
    return -1;
  }
  [[nodiscard]] std::string where() const { return "rank " + std::to_string(comm_->rank()) + " streaming_diloco: "; }
  void small_all_reduce(std::span<std::int64_t> v, reduce_op op, const char* what) {
    detail::diloco::small_all_reduce(*comm_, v, op, where(), what, opts_.join, "streaming_diloco_options");
  }

  struct fragment_state {
    std::vector<std::size_t> params;           // indices into the model's parameters
    std::vector<std::size_t> offsets, sizes;   // within the fragment's flat buffers
    std::vector<T> start;                      // its round's start, the same on every rank
    std::vector<T> grad;                       // its outer gradient (the outer optimizer's grads)
    detail::diloco::outer_model<T> view;       // the model's values and `grad`, for the outer sgd
    std::unique_ptr<sgd<detail::diloco::outer_model<T>>> outer;
  };

  void build_fragments() {
    const auto nf = static_cast<std::size_t>(opts_.fragments);
    for (std::size_t f = 0; f < nf; ++f) fragments_.push_back(std::make_unique<fragment_state>());
    const auto values = values_.views();
    for (std::size_t k = 0; k < values.size(); ++k) {
      auto& f = *fragments_[k % nf];
      f.params.push_back(k);
      f.offsets.push_back(f.start.size());
      f.sizes.push_back(values[k].size());
      f.start.resize(f.start.size() + values[k].size());
    }
    const sgd_options so{.lr = opts_.outer_lr, .momentum = opts_.outer_momentum, .dampening = 0, .weight_decay = 0,
                         .nesterov = opts_.nesterov};
    for (auto& fp : fragments_) {
      auto& f = *fp;
      f.grad.resize(f.start.size());
      for (std::size_t i = 0; i < f.params.size(); ++i) {
        const auto& v = values[f.params[i]];
        f.view.params.push_back({v, tensor_view<T>(f.grad.data() + f.offsets[i], v.shape())});
      }
      f.outer = std::make_unique<sgd<detail::diloco::outer_model<T>>>(f.view, so);
    }
  }

  void snapshot(fragment_state& f) {
    const auto values = values_.views();
    for (std::size_t i = 0; i < f.params.size(); ++i) {
      const auto& v = values[f.params[i]];
      std::memcpy(f.start.data() + f.offsets[i], v.data(), v.size_bytes());
    }
  }

  // The fragment's outer gradient (start - current) goes out; training goes on meanwhile.
  void prepare(std::size_t fi) {
    auto& f = *fragments_[fi];
    values_.pull("streaming_diloco");
    const auto values = values_.views();
    pending_delta_.resize(f.start.size());
    for (std::size_t i = 0; i < f.params.size(); ++i) {
      const auto& v = values[f.params[i]];
      const T* s = f.start.data() + f.offsets[i];
      T* d = pending_delta_.data() + f.offsets[i];
      for (std::size_t j = 0; j < v.size(); ++j) d[j] = s[j] - v[j];
    }
    pending_ = static_cast<std::int64_t>(fi);
    start_exchange(f);
  }
  void start_exchange(fragment_state& f) {
    try {
      exchange_.start(*comm_, std::span<const T>(pending_delta_), f.offsets, f.sizes);
    } catch (const timeout_error& e) {  // NCCL: the exchange runs here, through a device copy
      throw timeout_error(where() + "fragment " + std::to_string(pending_) + " exchange failed: " + e.what() +
                          detail::diloco::join_hint(opts_.join, "streaming_diloco_options"));
    }
  }

  // The exchange's mean arrives; the fragment goes back to its start and takes the outer step
  // (the local steps it made meanwhile are replaced), and its next round starts there.
  void perform(std::size_t fi) {
    if (pending_ != static_cast<std::int64_t>(fi)) {
      throw invalid_argument_error("streaming_diloco: fragment " + std::to_string(fi) + " ends its round but fragment " +
                                   std::to_string(pending_) + " is in flight (internal schedule error)");
    }
    auto& f = *fragments_[fi];
    try {
      exchange_.finish(std::span<T>(f.grad));
    } catch (const timeout_error& e) {
      throw timeout_error(where() + "fragment " + std::to_string(fi) + " exchange failed: " + e.what() +
                          detail::diloco::join_hint(opts_.join, "streaming_diloco_options"));
    }
    // CUDA parameters: the mirror takes every parameter's current values first, so pushing it
    // back changes only this fragment's.
    values_.pull("streaming_diloco");
    const auto values = values_.views();
    for (std::size_t i = 0; i < f.params.size(); ++i) {
      const auto& v = values[f.params[i]];
      std::memcpy(v.data(), f.start.data() + f.offsets[i], v.size_bytes());
    }
    f.outer->step();
    values_.push();
    snapshot(f);
    pending_ = -1;
    ++outer_steps_;
  }

  streaming_diloco_options opts_;
  M* model_;
  Inner* inner_;
  C* comm_;
  detail::host_values<M> values_;  // host views of the parameters (a mirror of CUDA ones)
  std::vector<std::unique_ptr<fragment_state>> fragments_;
  std::vector<T> pending_delta_;  // the outer gradient in flight (kept for save_state)
  std::int64_t pending_ = -1;
  std::int64_t steps_ = 0, outer_steps_ = 0;
  bool joined_ = false;  // inside join(): train_step is refused
  detail::diloco::outer_exchange<T> exchange_;  // last: its destructor waits for what it sent
};

}  // namespace partrain::inline v0
