// partrain/train/policies.hpp: one face for the three parallel modes, so one trainer drives any
// of them. A training policy takes a whole step (forward, backward, gradient reduction, optimizer
// step, mixed precision where set), evaluates over a range of batches, sets the learning rate,
// names its groups, and (DDP) saves and restores its state:
//
//   ddp_policy policy(ddp, opt);                        // optionally {.scaler = &s, .trace = &t}
//   data_parallel_policy policy(dp);                    // every replica steps its own optimizer
//   pipeline_policy policy(stage, opt, loss);           // the same partrain::batch as DDP
//   fit(policy, train_loader, test_loader, {...});      // train/trainer.hpp
#pragma once

#include <array>
#include <cmath>
#include <concepts>
#include <cstddef>
#include <filesystem>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <partrain/comm/local.hpp>
#include <partrain/comm/process_group.hpp>
#include <partrain/core/error.hpp>
#include <partrain/data/batch.hpp>
#include <partrain/model/concepts.hpp>
#include <partrain/optim/clip.hpp>
#include <partrain/optim/detail/state_buffer.hpp>
#include <partrain/optim/optimizer.hpp>
#include <partrain/parallel/ddp.hpp>
#include <partrain/parallel/mesh_clip.hpp>
#include <partrain/parallel/powersgd.hpp>
#include <partrain/precision/grad_scaler.hpp>
#include <partrain/precision/mixed_precision.hpp>
#include <partrain/train/checkpoint.hpp>
#include <partrain/train/detail/sharded_scaler.hpp>
#include <partrain/train/rank_checkpoint.hpp>
#include <partrain/train/trace.hpp>

namespace partrain::inline v0 {

// What the trainer needs from a parallel mode on batches of type B.
//   train_step(b)  one synchronised step, the optimizer's included; the mean loss of b
//   evaluate(bs)   summed over every rank's part of the test batches
//   set_lr(lr)     the optimizer hook the schedule uses
//   group()        every rank of the job (trace, checkpoint barrier); loss_group(): the ranks
//                  whose losses differ and are averaged (DDP's group; a group of one where
//                  every rank already sees the whole batch's loss)
//   replicas()     how many data-parallel copies consume distinct samples (samples/s of the job)
template <class P, class B>
concept training_policy = requires(P& p, const B& b, std::span<const B> batches, double lr) {
  { p.train_step(b) } -> std::convertible_to<double>;
  { p.evaluate(batches) } -> std::convertible_to<eval_result>;
  p.set_lr(lr);
  { p.group() } -> std::same_as<process_group&>;
  { p.loss_group() } -> std::same_as<process_group&>;
  { p.replicas() } -> std::convertible_to<int>;
};

// Optional: the policy can checkpoint (collectively) and resume.
template <class P>
concept checkpointable_policy = requires(P& p, const std::filesystem::path& f, const checkpoint_extra& e) {
  p.save_checkpoint(f, e);
  { p.load_checkpoint(f) } -> std::same_as<checkpoint_extra>;
};

struct ddp_policy_options {
  grad_scaler* scaler = nullptr;    // mixed precision (fp16/bf16): amp_step with it; null: plain fp32 steps
  trace_recorder* trace = nullptr;  // spans forward_backward / optimizer / amp_step
  double max_grad_norm = 0;         // > 0: clip the global gradient norm before the step
  // The state of DDP's comm_hooks::powersgd hook: checkpoints then carry it, and since its error
  // feedback differs across ranks they become rank checkpoints (train/rank_checkpoint.hpp).
  powersgd_state* powersgd = nullptr;
  // The ranks hold different parameters (tensor parallel on a device_mesh: each rank its slice of
  // the blocks): checkpoints are rank checkpoints over this group, the whole mesh, each rank's
  // section its own parameters and optimizer state, resumed on a mesh of the same shape. Null:
  // every rank holds the same model (rank 0 writes it).
  process_group* rank_sections = nullptr;
};

// distributed_data_parallel plus its optimizer (and grad scaler): a step is DDP's train_step
// (gradients averaged over the ranks) and opt.step(), or amp_step when a scaler is given.
template <class Ddp, class Opt>
class ddp_policy {
  using model_type = std::remove_cvref_t<decltype(std::declval<Ddp&>().module())>;
  static constexpr bool host_model = std::same_as<model_space_t<model_type>, host>;

 public:
  ddp_policy(Ddp& ddp, Opt& opt, ddp_policy_options o = {}) : ddp_(&ddp), opt_(&opt), o_(o) {
    detail::optim::check_max_grad_norm(o_.max_grad_norm, "ddp_policy: max_grad_norm");
    detail::amp::require_loss_scale<model_type>(o_.scaler, "ddp_policy");
  }

  template <class B>
  double train_step(const B& b) {
    if (o_.scaler) {  // amp_step also when the scaler is off (bf16): it refreshes the 16-bit copy
      auto span = o_.trace ? o_.trace->span("amp_step") : trace_span{};
      const amp_step_result r = amp_step(*ddp_, *opt_, *o_.scaler, b, {.max_grad_norm = o_.max_grad_norm});
      skipped_ += r.skipped ? 1 : 0;
      return r.loss;
    }
    auto fb = o_.trace ? o_.trace->span("forward_backward") : trace_span{};
    const double loss = ddp_->train_step(b);
    fb.end();
    auto os = o_.trace ? o_.trace->span("optimizer") : trace_span{};
    if (o_.max_grad_norm > 0) (void)ddp_->clip_grad_norm(o_.max_grad_norm);
    opt_->step();
    return loss;
  }
  template <class R>
  eval_result evaluate(R&& batches) {
    return ddp_->evaluate(std::forward<R>(batches));
  }
  void set_lr(double lr) { opt_->set_lr(lr); }
  // One micro-batch of a step fit accumulates (gradient_accumulation_steps): forward and backward
  // inside DDP's no_sync, the gradients kept on this rank; the step's last micro-batch is
  // train_step, which reduces them all (averaged over the micro-batches) and steps.
  template <class B>
  double accumulate_step(const B& b) {
    detail::refuse_scaled_accumulation(o_.scaler && o_.scaler->enabled(), "ddp_policy");
    auto fb = o_.trace ? o_.trace->span("forward_backward") : trace_span{};
    auto guard = ddp_->no_sync();
    return ddp_->train_step(b);
  }
  // Clipping of the global gradient norm from the next step on (fit's max_grad_norm).
  void set_max_grad_norm(double v) {
    detail::optim::check_max_grad_norm(v, "ddp_policy: max_grad_norm");
    o_.max_grad_norm = v;
  }
  process_group& group() { return ddp_->comm(); }
  process_group& loss_group() { return ddp_->comm(); }
  [[nodiscard]] int replicas() { return ddp_->comm().size(); }
  auto parameters() { return ddp_->module().parameters(); }
  [[nodiscard]] std::size_t skipped_steps() const noexcept { return skipped_; }

  // Rank 0 writes the file atomically while the others wait; the scaler's state goes with it
  // (with PowerSGD: a rank checkpoint, each rank's section with its error feedback).
  // Host parameters only (a checkpoint holds host memory): a CUDA model's policy cannot checkpoint.
  void save_checkpoint(const std::filesystem::path& file, checkpoint_extra extra)
    requires host_model
  {
    if (o_.scaler && o_.scaler->enabled()) extra.scaler_state = o_.scaler->state_bytes();
    if (o_.powersgd) {
      save_rank_checkpoint(sections(), file, ddp_->module(), with_hook_state{opt_, o_.powersgd}, extra);
      return;
    }
    if (o_.rank_sections) {
      save_rank_checkpoint(sections(), file, ddp_->module(), *opt_, extra);
      return;
    }
    if (group().rank() == 0 && file.has_parent_path()) std::filesystem::create_directories(file.parent_path());
    partrain::save_checkpoint(group(), file, ddp_->module(), *opt_, extra);
  }
  checkpoint_extra load_checkpoint(const std::filesystem::path& file)
    requires host_model
  {
    checkpoint_extra extra;
    if (o_.powersgd) {
      with_hook_state state{opt_, o_.powersgd};
      extra = load_rank_checkpoint(sections(), file, ddp_->module(), state);
    } else if (o_.rank_sections) {
      extra = load_rank_checkpoint(sections(), file, ddp_->module(), *opt_);
    } else {
      extra = partrain::load_checkpoint(file, ddp_->module(), *opt_);
    }
    if (o_.scaler && o_.scaler->enabled()) o_.scaler->load_state_bytes(extra.scaler_state);
    if constexpr (has_low_precision_copy<std::remove_cvref_t<decltype(ddp_->module())>>) {
      ddp_->module().refresh_low_precision();  // the 16-bit copy of the loaded masters
    }
    return extra;
  }

 private:
  [[nodiscard]] process_group& sections() { return o_.rank_sections ? *o_.rank_sections : group(); }
  // The optimizer's state, then the hook's, as one rank_state.
  struct with_hook_state {
    Opt* opt;
    powersgd_state* hook;
    void save_state(state_writer& w) const {
      opt->save_state(w);
      hook->save_state(w);
    }
    void load_state(state_reader& r) {
      opt->load_state(r);
      hook->load_state(r);
    }
  };

  Ddp* ddp_;
  Opt* opt_;
  ddp_policy_options o_;
  std::size_t skipped_ = 0;
};

// data_parallel: its train_step already steps every replica's optimizer and sees the whole
// batch, so its losses are summed over a group of one.
template <class Dp>
class data_parallel_policy {
 public:
  explicit data_parallel_policy(Dp& dp) : dp_(&dp), solo_(std::move(make_local_world(1).front())) {}

  template <class B>
  double train_step(const B& b) {
    return dp_->train_step(b);
  }
  template <class R>
  eval_result evaluate(R&& batches) {
    return dp_->evaluate(std::forward<R>(batches));
  }
  void set_lr(double lr) {
    dp_->for_each_optimizer([lr](auto& opt) { opt.set_lr(lr); });
  }
  process_group& group() { return *solo_; }
  process_group& loss_group() { return *solo_; }
  [[nodiscard]] int replicas() const noexcept { return 1; }  // one process: its samples are the job's
  auto parameters() { return dp_->module().parameters(); }

 private:
  Dp* dp_;
  std::unique_ptr<local_group> solo_;
};

struct pipeline_policy_options {
  // The pipeline is one of several on a device_mesh (each tensor-parallel coordinate's, each
  // data-parallel replica's): checkpoints are rank checkpoints over this group, the whole mesh,
  // each rank's section its own layers' slice and optimizer state, resumed on a mesh of the same
  // shape. Null: the pipeline group's ranks alone.
  process_group* rank_sections = nullptr;
};

// A pipeline stage with the optimizer of its own layers' parameters, on the same batch type as
// DDP (features and labels): every stage reads the same batches, the first uses the features,
// the last the labels; every stage returns the batch's loss.
template <class Stage, class Opt, class Loss>
class pipeline_policy {
 public:
  pipeline_policy(Stage& stage, process_group& pg, Opt& opt, Loss loss = {}, pipeline_policy_options o = {})
      : stage_(&stage), pg_(&pg), opt_(&opt), loss_(std::move(loss)), solo_(std::move(make_local_world(1).front())), o_(o) {}

  double train_step(const batch& b) {
    const double l = stage_->train_step(loss_, b.features, b.labels, /*accumulate=*/accumulated_ > 0);
    if (accumulated_ > 0) {  // the mean of the accumulated batches' gradients, as one larger batch's
      const float scale = 1.0f / static_cast<float>(accumulated_ + 1);
      stage_->for_each_parameter([scale](auto& prm) { detail::optim::scale_in_place(prm.grad(), scale); });
      accumulated_ = 0;
    }
    if (max_grad_norm_ > 0) clip_across_stages();
    opt_->step();
    return l;
  }
  // Clipping of the global gradient norm, over every stage's gradients, from the next step on
  // (fit's max_grad_norm): each stage's sum of squares, summed over the pipeline group.
  void set_max_grad_norm(double v) {
    detail::optim::check_max_grad_norm(v, "pipeline_policy: max_grad_norm");
    max_grad_norm_ = v;
  }
  // A batch of a step fit accumulates (gradient_accumulation_steps): the whole schedule runs and
  // the gradients add up on every stage; the step's last batch is train_step, which averages
  // them and steps.
  double accumulate_step(const batch& b) {
    const double l = stage_->train_step(loss_, b.features, b.labels, /*accumulate=*/accumulated_ > 0);
    ++accumulated_;
    return l;
  }
  template <class R>
  eval_result evaluate(R&& batches) {
    eval_result r;
    for (const batch& b : batches) r += stage_->eval_step(loss_, b.features, b.labels);  // forward only
    return r;
  }
  void set_lr(double lr) { opt_->set_lr(lr); }
  process_group& group() { return *pg_; }
  process_group& loss_group() { return *solo_; }  // every stage returns the whole batch's loss
  // Pipeline x data parallel: every replica of the pipeline its own samples.
  [[nodiscard]] int replicas() { return stage_->data_parallel_group() ? stage_->data_parallel_group()->size() : 1; }

  // Collective: a rank checkpoint (train/rank_checkpoint.hpp), each stage's section holding its
  // own layers' parameters and its optimizer's state (over rank_sections, each rank's); it
  // resumes with the same stages and layout.
  void save_checkpoint(const std::filesystem::path& file, const checkpoint_extra& extra)
    requires rank_state<Opt>
  {
    auto params = stage_->parameters();
    if (sections().rank() == 0 && file.has_parent_path()) std::filesystem::create_directories(file.parent_path());
    save_rank_checkpoint(sections(), file, params, *opt_, extra);
  }
  checkpoint_extra load_checkpoint(const std::filesystem::path& file)
    requires rank_state<Opt>
  {
    auto params = stage_->parameters();
    return load_rank_checkpoint(sections(), file, params, *opt_);
  }

 private:
  Stage* stage_;
  process_group* pg_;
  Opt* opt_;
  Loss loss_;
  std::unique_ptr<local_group> solo_;
  pipeline_policy_options o_;
  std::size_t accumulated_ = 0;  // batches accumulated into the step under way
  double max_grad_norm_ = 0;

  [[nodiscard]] process_group& sections() { return o_.rank_sections ? *o_.rank_sections : *pg_; }

  void clip_across_stages() {
    auto params = stage_->parameters();
    // Each parameter once: a tensor-parallel slice summed over its shard group, the stages over
    // the pipeline group. The replicas of a stage (pipeline x data parallel) hold the same
    // averaged gradients, so they are left out.
    const std::array<process_group*, 1> stages{&stage_->pipeline_group()};
    (void)clip_grad_norm(params, max_grad_norm_, stages);
  }
};

}  // namespace partrain::inline v0
