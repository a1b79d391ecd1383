// partrain/optim/any_optimizer.hpp: an optimizer chosen at run time (torch.optim.Optimizer's
// base-class role): holds any stateful optimizer with set_lr (sgd, adamw, a user's own) behind one
// type, so a program that takes --optimizer from its command line instantiates each policy and
// training loop once, not once per optimizer type.
//
//   any_optimizer opt = use_adamw ? any_optimizer(adamw(model, {.lr = 1e-3}))
//                                 : any_optimizer(sgd(model, {.lr = 0.05, .momentum = 0.9}));
//   ddp_policy policy(ddp, opt);
#pragma once

#include <concepts>
#include <cstdint>
#include <memory>
#include <type_traits>
#include <utility>

#include <partrain/optim/optimizer.hpp>
#include <partrain/optim/state_io.hpp>

namespace partrain::inline v0 {

// What any_optimizer holds: step, zero_grad, set_lr and a checkpointable state.
template <class O>
concept erasable_optimizer = stateful_optimizer<O> && std::move_constructible<O> && requires(O& o, double lr) {
  o.set_lr(lr);
};

class any_optimizer {
 public:
  template <class O>
    requires(!std::same_as<std::remove_cvref_t<O>, any_optimizer>) && erasable_optimizer<std::remove_cvref_t<O>>
  any_optimizer(O&& o)  // NOLINT(google-explicit-constructor): an optimizer is an any_optimizer
      : self_(std::make_unique<holder<std::remove_cvref_t<O>>>(std::forward<O>(o))) {}

  void step() { self_->step(); }
  void zero_grad() { self_->zero_grad(); }
  void set_lr(double lr) { self_->set_lr(lr); }
  void save_state(state_writer& w) const { self_->save_state(w); }
  void load_state(state_reader& r) { self_->load_state(r); }

 private:
  struct base {
    virtual ~base() = default;
    virtual void step() = 0;
    virtual void zero_grad() = 0;
    virtual void set_lr(double lr) = 0;
    virtual void save_state(state_writer& w) const = 0;
    virtual void load_state(state_reader& r) = 0;
  };
  template <class O>
  struct holder final : base {
    explicit holder(O o) : opt(std::move(o)) {}
    void step() override { opt.step(); }
    void zero_grad() override { opt.zero_grad(); }
    void set_lr(double lr) override { opt.set_lr(lr); }
    void save_state(state_writer& w) const override { opt.save_state(w); }
    void load_state(state_reader& r) override { opt.load_state(r); }
    O opt;
  };
  std::unique_ptr<base> self_;
};

static_assert(stateful_optimizer<any_optimizer>);

}  // namespace partrain::inline v0
