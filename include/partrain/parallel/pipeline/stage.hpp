// partrain/parallel/pipeline/stage.hpp: the executor of one pipeline rank. It owns no layers:
// it runs its chunks of the user's layer sequence through the schedule's order, receiving
// activations from the previous stage and gradients from the next over the process group's
// send/recv, and keeps every in-flight micro-batch's activations until its backward (so the
// peak it reports is the memory the schedule really needs). With a data-parallel group, each
// chunk's gradients are all-reduced (averaged) over the stage's replicas as soon as the chunk's
// last backward is done, overlapping the rest of the schedule.
#pragma once

#include <algorithm>
#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <list>
#include <optional>
#include <ranges>
#include <string>
#include <utility>
#include <vector>

#include <partrain/comm/process_group.hpp>
#include <partrain/core/buffer.hpp>
#include <partrain/core/error.hpp>
#include <partrain/core/tensor_view.hpp>
#include <partrain/core/work.hpp>
#include <partrain/model/concepts.hpp>
#include <partrain/model/layer.hpp>
#include <partrain/model/sequential.hpp>
#include <partrain/parallel/pipeline/partition.hpp>
#include <partrain/parallel/pipeline/schedule.hpp>

namespace partrain::inline v0 {

enum class pipeline_schedule_kind { gpipe, one_f_one_b, interleaved_1f1b };

struct pipeline_options {
  pipeline_schedule_kind kind = pipeline_schedule_kind::one_f_one_b;
  int micro_batches = 1;
  int virtual_stages = 1;  // chunks per rank; more than 1 only with interleaved_1f1b
  // A user's own order (overrides kind, micro_batches and virtual_stages when set).
  std::optional<pipeline_schedule> schedule{};
  // Layers per global stage (stages x virtual stages parts). Unset: balanced by cost, the costs
  // being each layer's forward + backward seconds on `probe` measured by rank 0 (every rank takes
  // its partition), or, without a probe, each layer's parameter count (DeepSpeed's default).
  // partition_uniform(layers, parts) is still there for a split by layer count.
  std::optional<partition> layout{};
  // A batch of the first stage's input (e.g. one micro-batch of features), for the timed default
  // layout above. Rank 0 runs every layer on it, so its layers must all be real.
  tensor_view<const float> probe{};
  // The replicas of this stage, for pipeline x data parallel; gradients are averaged over it.
  process_group* data_parallel = nullptr;
};

// What the last train_step measured on this rank.
struct pipeline_step_stats {
  int peak_in_flight = 0;                 // (micro-batch, chunk) activations alive at once
  std::size_t peak_activation_bytes = 0;  // stage inputs and layer outputs kept for backward
  std::size_t bytes_sent = 0;
  double seconds = 0;
};

[[nodiscard]] inline pipeline_schedule make_schedule(const pipeline_options& o, int stages) {
  if (o.schedule) {
    if (o.schedule->stages() != stages) {
      throw invalid_argument_error("pipeline: the supplied schedule '" + o.schedule->name() + "' is for " +
                                   std::to_string(o.schedule->stages()) + " stages, the pipeline group has " +
                                   std::to_string(stages) + " ranks");
    }
    return *o.schedule;
  }
  if (o.virtual_stages != 1 && o.kind != pipeline_schedule_kind::interleaved_1f1b) {
    throw invalid_argument_error("pipeline: virtual_stages = " + std::to_string(o.virtual_stages) +
                                 " needs the interleaved_1f1b schedule (expected 1 for gpipe and 1f1b)");
  }
  switch (o.kind) {
    case pipeline_schedule_kind::gpipe: return make_gpipe_schedule(stages, o.micro_batches);
    case pipeline_schedule_kind::one_f_one_b: return make_1f1b_schedule(stages, o.micro_batches);
    case pipeline_schedule_kind::interleaved_1f1b:
      return make_interleaved_1f1b_schedule(stages, o.micro_batches, o.virtual_stages);
  }
  throw invalid_argument_error("pipeline: unknown schedule kind");
}

template <class Layers>
class pipeline_stage {
  static_assert(check_layer_sequence<Layers>(), "partrain: pipeline_stage cuts a layer sequence into stages");

 public:
  // layers: the whole model, the same sequence on every rank (only this rank's chunks are
  // touched, so other ranks' layers may be cheap placeholders of the same shape behaviour).
  pipeline_stage(Layers& layers, process_group& pp, pipeline_options opts = {})
      : layers_(layers),
        pp_(pp),
        dp_(opts.data_parallel),
        schedule_(make_schedule(opts, pp.size())),
        layout_(opts.layout ? *opts.layout : default_layout(layers, pp, opts.probe, schedule_.global_stages())) {
    if (layout_.stages() != schedule_.global_stages()) {
      throw invalid_argument_error("pipeline: the layout has " + std::to_string(layout_.stages()) +
                                   " parts, expected stages x virtual stages = " +
                                   std::to_string(schedule_.global_stages()));
    }
    if (layout_.bounds.back() != std::ranges::size(layers) || layout_.bounds.front() != 0) {
      throw invalid_argument_error("pipeline: the layout covers layers [" + std::to_string(layout_.bounds.front()) +
                                   ", " + std::to_string(layout_.bounds.back()) + "), the model has " +
                                   std::to_string(std::ranges::size(layers)) + " layers");
    }
    for (int g = 0; g < layout_.stages(); ++g) {
      if (layout_.first(g) >= layout_.last(g)) {
        throw invalid_argument_error("pipeline: global stage " + std::to_string(g) + " of the layout has no layers");
      }
    }
  }

  // A sequential model: its layers cut into stages (its loss goes to train_step or pipeline_policy).
  template <class Loss>
  pipeline_stage(sequential<Layers, Loss>& model, process_group& pp, pipeline_options opts = {})
      : pipeline_stage(model.layers(), pp, std::move(opts)) {
    recompute_ = model.recompute();
    seed_ = model.seed();
  }

  pipeline_stage(const pipeline_stage&) = delete;
  pipeline_stage& operator=(const pipeline_stage&) = delete;
  // A step that failed half-way may leave sends queued in the backend, which still reads their
  // buffers: wait for them (each wait is bounded by the group's timeout) before freeing.
  ~pipeline_stage() {
    for (auto& q : sends_) {
      try {
        q.header_work.wait();
        q.payload_work.wait();
      } catch (...) {  // the step already reported its failure
      }
    }
  }

  // The pipeline's group: one rank per stage (a stage's data-parallel replicas are not in it).
  [[nodiscard]] process_group& pipeline_group() noexcept { return pp_; }
  // The stage's data-parallel replicas (pipeline_options::data_parallel), or null.
  [[nodiscard]] process_group* data_parallel_group() noexcept { return dp_; }
  [[nodiscard]] int stage() const noexcept { return pp_.rank(); }
  [[nodiscard]] int stages() const noexcept { return pp_.size(); }
  [[nodiscard]] bool is_first() const noexcept { return stage() == 0; }
  // The rank that computes the loss (holds the last global stage).
  [[nodiscard]] bool is_last() const noexcept { return stage() == stages() - 1; }
  [[nodiscard]] const pipeline_schedule& schedule() const noexcept { return schedule_; }
  [[nodiscard]] const partition& layout() const noexcept { return layout_; }
  [[nodiscard]] const pipeline_step_stats& last_stats() const noexcept { return stats_; }

  // Indices of the layers this rank runs, chunk by chunk.
  [[nodiscard]] std::vector<std::size_t> owned_layers() const {
    std::vector<std::size_t> v;
    for (int c = 0; c < schedule_.virtual_stages(); ++c) {
      const int g = schedule_.global_stage(stage(), c);
      for (std::size_t i = layout_.first(g); i < layout_.last(g); ++i) v.push_back(i);
    }
    return v;
  }
  // Calls f(parameter&) for every parameter of this rank's layers (what its optimizer steps).
  template <class F>
  void for_each_parameter(F&& f) {
    for (auto i : owned_layers()) {
      for (auto&& prm : layer(i).parameters()) f(prm);
    }
  }

  // This rank's layers' parameters as a model (what partrain::sgd or adamw takes): references
  // into the layers, valid as long as the stage and its layers.
  [[nodiscard]] auto parameters() {
    using prm = detail::layers::layer_param_t<Layers>;
    struct stage_parameters {
      std::vector<parameter_ref<prm>> refs;
      std::vector<parameter_ref<prm>>& parameters() { return refs; }
    } out;
    for_each_parameter([&](prm& x) { out.refs.push_back({&x}); });
    return out;
  }

  // One training step on a batch: split into m micro-batches along the first dimension, run
  // the schedule, leave this rank's gradients = d(mean loss over the batch)/d(parameters)
  // (written, not accumulated across steps), averaged over the data-parallel group if any.
  // input is read on the first stage and target on the last; other ranks may pass empty views.
  // Returns the batch's mean loss on every rank (averaged over the data-parallel replicas).
  // accumulate: add this batch's gradients to those already there instead of writing them
  // (gradient accumulation over several batches; the caller averages them before its step).
  template <class Loss, class Target>
  double train_step(Loss& loss, tensor_view<const float> input, tensor_view<const Target> target, bool accumulate = false) {
    static_assert(check_layer_loss<Loss, Target>());
    const auto t0 = std::chrono::steady_clock::now();
    stats_ = {};
    in_flight_ = 0;
    live_bytes_ = 0;
    const int m = schedule_.micro_batches();
    const int v = schedule_.virtual_stages();
    const auto rows = batch_rows(input, target, "train_step");
    if (!accumulate) for_each_parameter([](auto& prm) { std::ranges::fill(prm.grad(), 0.0f); });

    states_.clear();
    states_.resize(static_cast<std::size_t>(m * v));  // never copies: a default host_buffer claims one element
    std::vector<int> backwards_left(static_cast<std::size_t>(v), m);
    std::vector<work> dp_works;
    double loss_sum = 0;
    // Middle stages do not see the batch size; they neither compute nor report the loss.
    const float scale = rows.total ? 1.0f / static_cast<float>(rows.total) : 0.0f;

    for (const auto& a : schedule_.order(stage())) {
      const int g = schedule_.global_stage(stage(), a.chunk);
      auto& st = state(a);
      if (a.op == pipeline_op::forward) {
        receive_input(st, input, rows, g, a.micro_batch);
        run_forward(st, g, a.micro_batch, /*keep=*/true);
        if (g == last_global()) {
          const auto& out = st.outputs.back();
          st.loss_grad = host_buffer<float>(out.shape());
          loss_sum += loss.forward_backward(tensor_view<const float>(out.view()),
                                            target_rows(target, rows, a.micro_batch), st.loss_grad.view(), scale);
          add_live(st.loss_grad.size_bytes());
        } else {
          send(st.outputs.back(), next_rank(g), tag(0, g, a.micro_batch));
        }
        stats_.peak_in_flight = std::max(stats_.peak_in_flight, ++in_flight_);
      } else {
        run_backward(st, g, a.micro_batch);
        --in_flight_;
        if (--backwards_left[static_cast<std::size_t>(a.chunk)] == 0 && dp_) start_dp_reduce(g, dp_works);
      }
      prune_sends();
    }
    finish_sends();
    wait_all(dp_works);
    states_.clear();
    const double mean = share_from_last(rows.total ? loss_sum / static_cast<double>(rows.total) : 0.0);
    ++steps_;
    stats_.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return mean;
  }

  // Forward only, micro-batch by micro-batch; activations are dropped as soon as they are sent.
  // Returns the batch's summed loss, correct count and examples on every rank of the pipeline.
  template <class Loss, class Target>
  [[nodiscard]] eval_result eval_step(Loss& loss, tensor_view<const float> input, tensor_view<const Target> target) {
    static_assert(check_layer_loss<Loss, Target>());
    const int m = schedule_.micro_batches();
    const int v = schedule_.virtual_stages();
    const auto rows = batch_rows(input, target, "eval_step");
    const auto train_stats = stats_;  // last_stats() describes the last train_step
    eval_result res;
    for (int i = 0; i < m; ++i) {
      for (int c = 0; c < v; ++c) {
        const int g = schedule_.global_stage(stage(), c);
        mb_state st;
        receive_input(st, input, rows, g, i);
        run_forward(st, g, i, /*keep=*/false);
        if (g == last_global()) {
          res += loss.evaluate(tensor_view<const float>(st.outputs.back().view()), target_rows(target, rows, i));
        } else {
          send(st.outputs.back(), next_rank(g), tag(0, g, i));
        }
        prune_sends();
      }
    }
    finish_sends();
    stats_ = train_stats;
    std::array<double, 3> r{res.loss_sum, static_cast<double>(res.correct), static_cast<double>(res.count)};
    if (stages() > 1) pp_.broadcast(tensor_view<double>(r.data(), r.size()), stages() - 1).wait();
    return {r[0], static_cast<std::size_t>(r[1]), static_cast<std::size_t>(r[2])};
  }

 private:
  struct mb_state {
    tensor_view<const float> input;   // the stage's input (user memory on stage 0)
    host_buffer<float> received;      // owns input when it came from the previous stage
    std::vector<host_buffer<float>> outputs;  // one per layer of the chunk
    std::vector<host_buffer<float>> saved;    // per layer of the chunk: kept activations (empty: recomputed)
    host_buffer<float> loss_grad;     // last stage: d loss / d output
    std::size_t bytes = 0;
  };
  struct batch_split {
    std::size_t total = 0;                // rows in the batch (0 where this rank does not know)
    std::vector<std::size_t> first;       // m + 1 row offsets
  };
  struct pending_send {
    work header_work = work::completed();
    work payload_work = work::completed();
    host_buffer<float> payload;
    std::array<std::int64_t, 8> header{};
    int dst = -1;
  };

  // The layout when none is given: by the layers' measured time on the probe (rank 0 measures and
  // broadcasts, so every rank cuts alike), else by their parameter counts (uniform when no layer
  // has parameters).
  static partition default_layout(Layers& layers, process_group& pp, tensor_view<const float> probe, int parts) {
    const std::size_t n = std::ranges::size(layers);
    if (n == 0) return partition_uniform(n, parts);  // refused there, with the reason
    std::vector<double> costs;
    if (probe.size() > 0) {
      costs = pp.rank() == 0 ? measure_layer_costs(layers, probe) : std::vector<double>(n, 0.0);
      if (pp.size() > 1) pp.broadcast(tensor_view<double>(costs.data(), costs.size()), 0).wait();
    } else {
      costs = parameter_costs(layers);
    }
    double total = 0;
    for (const double c : costs) total += c;
    return total > 0 ? partition_balanced(costs, parts) : partition_uniform(n, parts);
  }

  [[nodiscard]] decltype(auto) layer(std::size_t i) { return detail::layers::layer_of(std::ranges::begin(layers_)[static_cast<std::ptrdiff_t>(i)]); }
  [[nodiscard]] int last_global() const noexcept { return schedule_.global_stages() - 1; }
  [[nodiscard]] int next_rank(int g) const noexcept { return (g + 1) % stages(); }
  [[nodiscard]] int prev_rank(int g) const noexcept { return (g - 1 + stages()) % stages(); }
  [[nodiscard]] mb_state& state(const pipeline_action& a) {
    return states_[static_cast<std::size_t>(a.chunk * schedule_.micro_batches() + a.micro_batch)];
  }
  // Messages of one step never mix: each (direction, sending global stage, micro-batch) is unique;
  // the header and the payload of a message use two consecutive tags.
  [[nodiscard]] int tag(int dir, int g_from, int mb) const noexcept {
    return ((dir * schedule_.global_stages() + g_from) * schedule_.micro_batches() + mb) * 2;
  }
  [[nodiscard]] std::string where(const char* what) const {
    return "pipeline stage " + std::to_string(stage()) + " of " + std::to_string(stages()) + " " + what;
  }
  // A transfer's place in the error fields: this stage's rank in the pipeline group, the peer.
  [[nodiscard]] error_site site(const char* operation, int peer, std::chrono::milliseconds timeout = {}) const {
    return {.rank = stage(), .operation = operation, .peer = peer, .timeout = timeout};
  }

  // Micro-batch row offsets as torch.tensor_split: the first (rows % m) get one more row.
  template <class Target>
  batch_split batch_rows(tensor_view<const float> input, tensor_view<const Target> target, const char* what) const {
    const auto m = static_cast<std::size_t>(schedule_.micro_batches());
    batch_split s;
    const bool holds_first = is_first(), holds_last = is_last();
    const std::size_t in_rows = input.rank() ? input.extent(0) : 0;
    const std::size_t tg_rows = target.rank() ? target.extent(0) : 0;
    if (holds_first && in_rows == 0) throw invalid_argument_error(where(what) + ": the first stage needs the input batch, got an empty view");
    if (holds_last && tg_rows == 0) throw invalid_argument_error(where(what) + ": the last stage needs the targets, got an empty view");
    if (holds_first && holds_last && in_rows != tg_rows) {
      throw invalid_argument_error(where(what) + ": input has " + std::to_string(in_rows) + " rows, target " +
                                   std::to_string(tg_rows) + " (expected the same batch size)");
    }
    s.total = holds_last ? tg_rows : in_rows;
    if (s.total == 0) return s;
    if (s.total < m) {
      throw invalid_argument_error(where(what) + ": a batch of " + std::to_string(s.total) + " rows cannot be split into " +
                                   std::to_string(m) + " micro-batches (expected batch size >= micro-batches)");
    }
    s.first.push_back(0);
    for (std::size_t i = 0; i < m; ++i) s.first.push_back(s.first.back() + s.total / m + (i < s.total % m ? 1 : 0));
    return s;
  }
  template <class Target>
  tensor_view<const Target> target_rows(tensor_view<const Target> target, const batch_split& s, int mb) const {
    return target.slice(s.first[static_cast<std::size_t>(mb)], s.first[static_cast<std::size_t>(mb) + 1]);
  }

  void add_live(std::size_t bytes) {
    live_bytes_ += bytes;
    stats_.peak_activation_bytes = std::max(stats_.peak_activation_bytes, live_bytes_);
  }

  void receive_input(mb_state& st, tensor_view<const float> input, const batch_split& rows, int g, int mb) {
    if (g == 0) {
      st.input = input.slice(rows.first[static_cast<std::size_t>(mb)], rows.first[static_cast<std::size_t>(mb) + 1]);
      return;
    }
    st.received = recv_tensor(prev_rank(g), tag(0, g - 1, mb), "activation", g, mb);
    st.input = tensor_view<const float>(st.received.view());
    st.bytes += st.received.size_bytes();
    add_live(st.received.size_bytes());
  }

  // Layer i's call for micro-batch mb: its saved memory and its seed (the same when recomputed).
  [[nodiscard]] layer_call<> call(host_buffer<float>& saved, std::size_t i, int mb) const {
    return {saved.view(), detail::layers::call_seed(seed_, steps_, static_cast<std::uint64_t>(mb), i)};
  }

  // keep (training): the outputs and the saved activations of layers not recomputed stay until
  // the backward; eval drops each as soon as the next layer has read it.
  void run_forward(mb_state& st, int g, int mb, bool keep) {
    tensor_view<const float> x = st.input;
    for (std::size_t i = layout_.first(g); i < layout_.last(g); ++i) {
      auto& l = layer(i);
      host_buffer<float> y(l.output_shape(x.shape()));
      host_buffer<float> saved(shape{detail::layers::saved_size<host>(l, x.shape())});
      detail::layers::forward<host>(l, x, y.view(), call(saved, i, mb));
      add_live(saved.size_bytes());  // held during the call at least
      live_bytes_ -= saved.size_bytes();
      st.outputs.push_back(std::move(y));
      x = tensor_view<const float>(st.outputs.back().view());
      if (keep) {
        const bool drop = recompute_.selects(i);
        st.bytes += st.outputs.back().size_bytes() + (drop ? 0 : saved.size_bytes());
        add_live(st.outputs.back().size_bytes() + (drop ? 0 : saved.size_bytes()));
        st.saved.push_back(drop ? host_buffer<float>() : std::move(saved));
      } else if (st.outputs.size() > 1) {
        st.outputs.erase(st.outputs.begin());  // eval: only the newest output is needed
      }
    }
  }

  void run_backward(mb_state& st, int g, int mb) {
    host_buffer<float> grad;
    if (g == last_global()) {
      grad = std::move(st.loss_grad);
      st.bytes += grad.size_bytes();
    } else {
      grad = recv_tensor(next_rank(g), tag(1, g + 1, mb), "gradient", g, mb);
      if (!(grad.shape() == st.outputs.back().shape())) {
        throw communication_error(where("backward") + ": the gradient for micro-batch " + std::to_string(mb) +
                                  " has shape " + grad.shape().to_string() + ", the activation " +
                                  st.outputs.back().shape().to_string());
      }
    }
    const std::size_t n = layout_.last(g) - layout_.first(g);
    for (std::size_t j = n; j-- > 0;) {
      auto& l = layer(layout_.first(g) + j);
      const tensor_view<const float> in = j == 0 ? st.input : tensor_view<const float>(st.outputs[j - 1].view());
      const std::size_t i = layout_.first(g) + j;
      const std::size_t floats = detail::layers::saved_size<host>(l, in.shape());
      host_buffer<float>& saved = st.saved[j];
      const bool again = floats > 0 && recompute_.selects(i);
      if (again) {
        // The forward again with the original call's seed: the same activations, no communication.
        saved = host_buffer<float>(shape{floats});
        host_buffer<float> y(st.outputs[j].shape());
        add_live(saved.size_bytes() + y.size_bytes());
        detail::layers::forward<host>(l, in, y.view(), call(saved, i, mb));
        live_bytes_ -= y.size_bytes();
      }
      host_buffer<float> gin(in.shape());
      detail::layers::backward<host>(l, in, tensor_view<const float>(st.outputs[j].view()), call(saved, i, mb),
                                     tensor_view<const float>(grad.view()), gin.view());
      if (again) {
        live_bytes_ -= saved.size_bytes();
        saved = host_buffer<float>();
      }
      grad = std::move(gin);
    }
    if (g > 0) send(grad, prev_rank(g), tag(1, g, mb));
    live_bytes_ -= st.bytes;
    st = {};
  }

  void send(const host_buffer<float>& t, int dst, int tg) {
    // A list: the backend holds raw pointers to header and payload until the send completes.
    auto& q = sends_.emplace_back();
    q.payload = t;  // the activation may be freed (backward) before the send completes
    q.dst = dst;
    const auto& s = t.shape();
    q.header[0] = static_cast<std::int64_t>(s.rank());
    for (std::size_t i = 0; i < s.rank(); ++i) q.header[i + 1] = static_cast<std::int64_t>(s[i]);
    q.header_work = pp_.send(tensor_view<std::int64_t>(q.header.data(), q.header.size()), dst, tg);
    q.payload_work = pp_.send(q.payload.view(), dst, tg + 1);
    stats_.bytes_sent += q.payload.size_bytes() + sizeof q.header;
  }
  host_buffer<float> recv_tensor(int src, int tg, const char* what, int g, int mb) {
    std::array<std::int64_t, 8> h{};
    try {
      pp_.recv(tensor_view<std::int64_t>(h.data(), h.size()), src, tg).wait();
      if (h[0] < 1 || h[0] > static_cast<std::int64_t>(max_rank)) {
        throw communication_error("a malformed header (rank " + std::to_string(h[0]) + ")");
      }
      std::vector<std::size_t> dims;
      for (std::int64_t i = 0; i < h[0]; ++i) dims.push_back(static_cast<std::size_t>(h[static_cast<std::size_t>(i) + 1]));
      host_buffer<float> b{shape{std::span<const std::size_t>(dims)}};
      pp_.recv(b.view(), src, tg + 1).wait();
      return b;
    } catch (const aborted_error& e) {
      // An echo of another rank's failure stays one (run_local_grid reports the root cause).
      throw aborted_error(where("recv") + ": " + what + " of micro-batch " + std::to_string(mb) + " for global stage " +
                              std::to_string(g) + " from rank " + std::to_string(src) + " failed",
                          e, site("recv", src));
    } catch (const timeout_error& e) {
      throw timeout_error(where("recv") + ": " + what + " of micro-batch " + std::to_string(mb) + " for global stage " +
                              std::to_string(g) + " from rank " + std::to_string(src) + ": " + detail::unprefixed(e.what()),
                          site("recv", src, e.timeout()));
    } catch (const error& e) {
      throw communication_error(where("recv") + ": " + what + " of micro-batch " + std::to_string(mb) +
                                    " for global stage " + std::to_string(g) + " from rank " + std::to_string(src) +
                                    " failed: " + detail::unprefixed(e.what()),
                                site("recv", src));
    }
  }
  // Completed sends release their buffers; keeps memory bounded without blocking.
  void prune_sends() {
    std::erase_if(sends_, [](const pending_send& p) {
      return p.header_work.is_completed() && p.payload_work.is_completed() && !p.header_work.error() &&
             !p.payload_work.error();
    });
  }
  void finish_sends() {
    // Every send is waited for (the backend reads its buffers until then); the first failure,
    // and the peer it was sent to, is reported.
    std::exception_ptr first;
    int peer = -1;
    for (auto& q : sends_) {
      for (work* w : {&q.header_work, &q.payload_work}) {
        try {
          w->wait();
        } catch (...) {
          if (!first) {
            first = std::current_exception();
            peer = q.dst;
          }
        }
      }
    }
    sends_.clear();
    if (!first) return;
    try {
      std::rethrow_exception(first);
    } catch (const aborted_error& e) {
      throw aborted_error(where("send") + " failed", e, site("send", peer));
    } catch (const timeout_error& e) {
      throw timeout_error(where("send") + " timed out: " + detail::unprefixed(e.what()), site("send", peer, e.timeout()));
    } catch (const error& e) {
      throw communication_error(where("send") + " failed: " + detail::unprefixed(e.what()), site("send", peer));
    }
  }

  void start_dp_reduce(int g, std::vector<work>& works) {
    for (std::size_t i = layout_.first(g); i < layout_.last(g); ++i) {
      for (auto&& prm : layer(i).parameters()) works.push_back(dp_->all_reduce(prm.grad(), reduce_op::avg));
    }
  }

  // The loss lives on the last stage: average it over that stage's replicas, then give it to
  // every stage (so each rank's train_step returns the same number).
  double share_from_last(double mean) {
    std::array<double, 1> v{mean};
    if (dp_ && is_last()) dp_->all_reduce(tensor_view<double>(v.data(), 1), reduce_op::avg).wait();
    if (stages() > 1) pp_.broadcast(tensor_view<double>(v.data(), 1), stages() - 1).wait();
    return v[0];
  }

  Layers& layers_;
  process_group& pp_;
  process_group* dp_;
  pipeline_schedule schedule_;
  partition layout_;
  std::vector<mb_state> states_;
  std::list<pending_send> sends_;
  int in_flight_ = 0;
  std::size_t live_bytes_ = 0;
  recompute_options recompute_;  // the sequential model's, when the stage was made from one
  std::uint64_t seed_ = 0;
  std::uint64_t steps_ = 0;
  pipeline_step_stats stats_;
};

}  // namespace partrain::inline v0
