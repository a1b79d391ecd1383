// models/vit_layers_device.hpp: the Vision Transformer of vit_layers.hpp as device layers (the
// base of mlp_layers_device.hpp), computing where a backend of mlp_device.hpp runs: on a CUDA
// device (mlp_cuda.cuh: cuBLAS, strided batched GEMMs for the attention's heads, the functors of
// vit_elements.hpp as kernels on the backend's stream) or on its host twin (mlp_host_twin.hpp:
// OpenBLAS, the same functors in host loops), so the CPU tier runs the CUDA ViT's code. Same
// layers, saved activations, dropout masks and initial weights (make_device_vit uploads
// make_vit's values for the same seed) as the host ViT; fully sharded data parallel trains them.
#pragma once

#include <cmath>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <partrain/core/device.hpp>
#include <partrain/core/error.hpp>
#include <partrain/core/tensor_view.hpp>
#include <partrain/model/layer.hpp>

#include "mlp_layers_device.hpp"
#include "vit_elements.hpp"
#include "vit_layers.hpp"

namespace models::layers {

namespace vit_device_detail {

namespace el = models::vit_elements;

// A layer's bfloat16 copies of a GEMM's operands (vit_config::compute bfloat16), grown on demand.
template <class Backend>
struct low_operands {
  typename Backend::template array<std::uint16_t> a, b;
};

// Row-major C [m, n] = alpha op(A) op(B) + beta C, for `batch` matrices at element strides sa, sb,
// sc, on a backend whose GEMMs are column-major (cuBLAS's): a row-major matrix read column-major
// is its transpose, so C^T = op(B)^T op(A)^T, which is the same call with A and B swapped.
// With `low` (bfloat16 matrix products): A and B rounded to bfloat16 into it first (every element
// the strided batches reach), then a 16-bit GEMM with fp32 accumulation, as the host ViT's gemm_as.
template <class Backend>
void gemm(const Backend& be, low_operands<Backend>* low, bool ta, bool tb, std::size_t m, std::size_t n, std::size_t k,
          float alpha, const float* a, std::size_t lda, const float* b, std::size_t ldb, float beta, float* c,
          std::size_t ldc, std::size_t batch = 1, std::size_t sa = 0, std::size_t sb = 0, std::size_t sc = 0) {
  const auto i = [](std::size_t v) { return static_cast<int>(v); };
  const auto l = [](std::size_t v) { return static_cast<long long>(v); };
  if (!low) {
    be.sgemm_strided(tb, ta, i(n), i(m), i(k), alpha, b, i(ldb), l(sb), a, i(lda), l(sa), beta, c, i(ldc), l(sc), i(batch));
    return;
  }
  // Row-major extents: A is [m, k] ([k, m] when ta) with leading dimension lda, batch times at sa.
  const auto extent = [&](std::size_t rows, std::size_t cols, std::size_t ld, std::size_t stride) {
    return rows == 0 || cols == 0 || batch == 0 ? std::size_t{0} : (batch - 1) * stride + (rows - 1) * ld + cols;
  };
  const std::size_t na = extent(ta ? k : m, ta ? m : k, lda, sa), nb = extent(tb ? n : k, tb ? k : n, ldb, sb);
  be.reserve(low->a, na);
  be.reserve(low->b, nb);
  be.launch(na, models::elements::to_16_fn{a, low->a.data(), true});
  be.launch(nb, models::elements::to_16_fn{b, low->b.data(), true});
  be.gemm16_strided(tb, ta, i(n), i(m), i(k), alpha, low->b.data(), i(ldb), l(sb), low->a.data(), i(lda), l(sa), beta, c,
                    i(ldc), l(sc), i(batch), true);
}

// vit_config::compute is bfloat16 (the host ViT's constructors have refused anything but it and float32).
inline bool bf16_products(const vit_config& c) { return c.compute == partrain::dtype::bfloat16; }

// A host layer's parameters in the backend's memory (same shapes and values).
template <class Backend>
std::vector<device_param<Backend>> upload_parameters(const Backend& be, std::vector<host_param>& host) {
  std::vector<device_param<Backend>> out;
  for (auto& p : host) {
    out.emplace_back(be, p.value().shape());
    be.upload(out.back().value().data(), p.value().data(), p.value().size_bytes());
  }
  be.synchronize();  // the host copies go when this returns
  return out;
}

// y [m, out] = x [m, in] W^T + b, and its parameter gradients: W += dy^T x, b += the rows of dy.
template <class Backend>
void linear_forward(const Backend& be, low_operands<Backend>* low, const float* x, std::size_t m, std::size_t in,
                    std::size_t out, device_param<Backend>& w, device_param<Backend>& b, float* y) {
  gemm(be, low, false, true, m, out, in, 1.0f, x, in, w.value().data(), in, 0.0f, y, out);
  be.launch(m * out, el::bias_fn{y, b.value().data(), out});
}
template <class Backend>
void linear_backward_params(const Backend& be, low_operands<Backend>* low, const float* dy, const float* x, std::size_t m,
                            std::size_t in, std::size_t out, device_param<Backend>& w, device_param<Backend>& b) {
  gemm(be, low, true, false, out, in, m, 1.0f, dy, out, x, in, 1.0f, w.grad().data(), in);
  be.launch(out, el::column_sums_fn{dy, m, out, b.grad().data()});
}

}  // namespace vit_device_detail

// patch_embed on the device: the patches gathered by a kernel, one GEMM, bias and positions.
template <class Backend>
class device_patch_embed final : public device_layer<Backend> {
  using base = device_layer<Backend>;

 public:
  using base::backward;
  using base::forward;
  device_patch_embed(std::shared_ptr<Backend> be, const vit_config& c, basic_patch_embed<float>& host)
      : base(std::move(be)), image_(c.image), patch_(c.patch), dim_(c.dim), tokens_(host.tokens()),
        bf16_(vit_device_detail::bf16_products(c)),
        params_(vit_device_detail::upload_parameters(*this->be_, host.parameters())) {}

  [[nodiscard]] shape output_shape(const shape& s) const override {
    return {cnn_detail::image_batch(s, 1, image_, image_, "patch_embed"), tokens_, dim_};
  }
  void forward(typename base::in_view x, typename base::out_view y) override {
    namespace el = vit_device_detail::el;
    const std::size_t rows = output_shape(x.shape())[0] * tokens_, pp = patch_ * patch_;
    cnn_detail::check_size("patch_embed::forward: the output", y.size(), rows * dim_);
    const float* patches = gather(x, rows);
    vit_device_detail::gemm(*this->be_, low(), false, true, rows, dim_, pp, 1.0f, patches, pp, params_[0].value().data(), pp, 0.0f,
                            y.data(), dim_);
    this->be_->launch(rows * dim_, el::bias_fn{y.data(), params_[1].value().data(), dim_, params_[2].value().data(), tokens_});
  }
  void backward(typename base::in_view x, typename base::in_view, typename base::in_view gy,
                typename base::out_view gx) override {
    namespace el = vit_device_detail::el;
    const std::size_t n = output_shape(x.shape())[0], rows = n * tokens_, pp = patch_ * patch_;
    cnn_detail::check_size("patch_embed::backward: the output gradient", gy.size(), rows * dim_);
    cnn_detail::check_size("patch_embed::backward: the input gradient", gx.size(), x.size());
    const float* patches = gather(x, rows);
    const auto& be = *this->be_;
    vit_device_detail::gemm(be, low(), true, false, dim_, pp, rows, 1.0f, gy.data(), dim_, patches, pp, 1.0f,
                            params_[0].grad().data(), pp);
    be.launch(dim_, el::column_sums_fn{gy.data(), rows, dim_, params_[1].grad().data()});
    be.launch(tokens_ * dim_, el::column_sums_fn{gy.data(), n, tokens_ * dim_, params_[2].grad().data()});
    be.reserve(gpatches_, rows * pp);
    vit_device_detail::gemm(be, low(), false, false, rows, pp, dim_, 1.0f, gy.data(), dim_, params_[0].value().data(), pp, 0.0f,
                            gpatches_.data(), pp);
    be.launch(rows * pp, el::patches_fn{gx.data(), gpatches_.data(), image_, patch_, false});
  }
  [[nodiscard]] std::vector<device_param<Backend>>& parameters() override { return params_; }

 private:
  const float* gather(typename base::in_view x, std::size_t rows) {
    const std::size_t pp = patch_ * patch_;
    this->be_->reserve(patches_, rows * pp);
    // patches_fn reads the image when to_patches (the one functor serves both directions).
    this->be_->launch(rows * pp,
                      vit_device_detail::el::patches_fn{const_cast<float*>(x.data()), patches_.data(), image_, patch_, true});
    return patches_.data();
  }

  [[nodiscard]] vit_device_detail::low_operands<Backend>* low() noexcept { return bf16_ ? &low_ : nullptr; }

  std::size_t image_, patch_, dim_, tokens_;
  bool bf16_;
  std::vector<device_param<Backend>> params_;
  typename Backend::template array<float> patches_, gpatches_;
  vit_device_detail::low_operands<Backend> low_;
};

// transformer_block on the device: the host block's math and saved layout
// (basic_transformer_block::layout), the attention as one strided batched GEMM per head over the
// images, every row and element loop a kernel. With a tp_shard, rank tp.rank's part of a
// tensor-parallel block, as the host block splits it (Megatron-LM's: its heads and hidden units,
// the output projection and fc2 row-parallel), built from the host shard's values: the group sums
// the two row-parallel outputs in forward and the two column-parallel input gradients in backward
// (4 all-reduces of batch x tokens x dim per block and step), on the tp_shard's wire. A group
// whose backend takes the device's memory (NCCL) sums it in place for a float32 wire; otherwise
// the values pass through host memory (the local and Gloo backends: several ranks as threads on
// one GPU). Sequence parallelism is the host block's only.
template <class Backend>
class device_transformer_block final : public device_saving_layer<Backend> {
  using base = device_layer<Backend>;
  using host_block = basic_transformer_block<float>;
  using space = typename Backend::space;

 public:
  using device_saving_layer<Backend>::backward;
  using device_saving_layer<Backend>::forward;
  // `host` is a whole block, or with tp.size > 1 rank tp.rank's shard of one (host_block(whole, tp)).
  device_transformer_block(std::shared_ptr<Backend> be, const vit_config& c, host_block& host, tp_shard tp = {})
      : device_saving_layer<Backend>(std::move(be)), dim_(c.dim), heads_(c.heads / tp.size),
        hidden_(c.mlp_ratio * c.dim / tp.size), width_(c.dim / tp.size),
        threshold_(vit_device_detail::el::dropout_threshold(c.dropout)), keep_scale_(1.0f / (1.0f - c.dropout)),
        bf16_(vit_device_detail::bf16_products(c)), tp_(tp),
        params_(vit_device_detail::upload_parameters(*this->be_, host.parameters())) {
    if (tp_.size > 1 && tp_.sequence_parallel) {
      throw invalid_argument_error("device transformer_block: sequence parallelism over " + std::to_string(tp_.size) +
                                   " ranks runs in the host layers only (expected tp_shard::sequence_parallel false)");
    }
    if (params_[qkv_w].value().size() != 3 * width_ * dim_ || params_[fc1_b].value().size() != hidden_) {
      throw invalid_argument_error("device transformer_block: the host block holds " +
                                   std::to_string(params_[fc1_b].value().size()) + " hidden units, expected " +
                                   std::to_string(hidden_) + " (the shard for rank " + std::to_string(tp_.rank) + " of " +
                                   std::to_string(tp_.size) + ")");
    }
    if (tp_.size > 1) {
      for (const auto i : {qkv_w, qkv_b, proj_w, fc1_w, fc1_b, fc2_w}) params_[i].set_shard_group(tp_.group);
    }
  }

  [[nodiscard]] shape output_shape(const shape& s) const override {
    (void)vit_detail::token_batch(s, dim_, "transformer_block");
    return s;
  }
  [[nodiscard]] std::size_t saved_size(const shape& s) const override { return layout_of(s).total; }
  void train(bool on) override { training_ = on; }

  void forward(typename base::in_view x, typename base::out_view y, const typename base::call& call) override {
    namespace el = vit_device_detail::el;
    const vit_detail::token_batch b(x.shape(), dim_, "transformer_block");
    const std::size_t m = b.n * b.t, d = dim_, w = width_, f = hidden_;
    const typename host_block::layout at = layout_of(x.shape());
    cnn_detail::check_size("transformer_block::forward: the output", y.size(), m * d);
    vit_detail::check_saved("transformer_block::forward", call.saved.size(), at.total);
    const auto& be = *this->be_;
    float* s = call.saved.data();
    float* out = y.data();
    be.reserve(a_, m * d);
    be.reserve(g_, m * f);
    const float eps = static_cast<float>(vit_detail::layernorm_eps);

    // x1 = x + drop(proj(attention(LN1(x))))
    be.launch(m, el::layernorm_forward_fn{x.data(), weight(ln1_g), weight(ln1_b), d, eps, s + at.mean1, s + at.rstd1, a_.data()});
    vit_device_detail::linear_forward(be, low(), a_.data(), m, d, 3 * w, params_[qkv_w], params_[qkv_b], s + at.qkv);
    attention_forward(b.n, b.t, s + at.qkv, s + at.probs, s + at.ctx, call.seed);
    row_parallel_forward(s + at.ctx, m, w, proj_w, out);
    if (dropping()) be.launch(m * d, el::dropout_fn{out, out, el::dropout_stream(call.seed, 1), threshold_, keep_scale_});
    be.launch(m * d, el::residual_fn{x.data(), out, s + at.x1});

    // out = x1 + drop(fc2(gelu(fc1(LN2(x1)))))
    be.launch(m, el::layernorm_forward_fn{s + at.x1, weight(ln2_g), weight(ln2_b), d, eps, s + at.mean2, s + at.rstd2, a_.data()});
    vit_device_detail::linear_forward(be, low(), a_.data(), m, d, f, params_[fc1_w], params_[fc1_b], s + at.hidden);
    be.launch(m * f, el::gelu_fn{s + at.hidden, g_.data()});
    row_parallel_forward(g_.data(), m, f, fc2_w, out);
    if (dropping()) be.launch(m * d, el::dropout_fn{out, out, el::dropout_stream(call.seed, 2), threshold_, keep_scale_});
    be.launch(m * d, el::residual_fn{s + at.x1, out, out});
  }

  void backward(typename base::in_view x, typename base::in_view, const typename base::call& call,
                typename base::in_view gy, typename base::out_view gx) override {
    namespace el = vit_device_detail::el;
    const vit_detail::token_batch b(x.shape(), dim_, "transformer_block");
    const std::size_t m = b.n * b.t, d = dim_, w = width_, f = hidden_;
    const typename host_block::layout at = layout_of(x.shape());
    cnn_detail::check_size("transformer_block::backward: the output gradient", gy.size(), m * d);
    cnn_detail::check_size("transformer_block::backward: the input gradient", gx.size(), m * d);
    vit_detail::check_saved("transformer_block::backward", call.saved.size(), at.total);
    const auto& be = *this->be_;
    const float* s = call.saved.data();
    be.reserve(a_, m * d);
    be.reserve(g_, m * f);
    be.reserve(slope_, m * f);
    be.reserve(dbranch_, m * d);
    be.reserve(dctx_, m * w);
    be.reserve(dqkv_, 3 * m * w);
    float* out_grad = gx.data();  // d loss / d x1 until LN1's part is added

    // The MLP branch.
    const float* dm = gy.data();
    if (dropping()) {
      be.launch(m * d, el::dropout_fn{gy.data(), dbranch_.data(), el::dropout_stream(call.seed, 2), threshold_, keep_scale_});
      dm = dbranch_.data();
    }
    be.launch(m * f, el::gelu_and_grad_fn{s + at.hidden, g_.data(), slope_.data()});
    vit_device_detail::linear_backward_params(be, low(), dm, g_.data(), m, f, d, params_[fc2_w], params_[fc2_b]);
    vit_device_detail::gemm(be, low(), false, false, m, f, d, 1.0f, dm, d, weight(fc2_w), f, 0.0f, g_.data(), f);
    be.launch(m * f, el::multiply_fn{g_.data(), slope_.data()});
    be.launch(m, el::layernorm_apply_fn{s + at.x1, weight(ln2_g), weight(ln2_b), d, s + at.mean2, s + at.rstd2, a_.data()});
    vit_device_detail::linear_backward_params(be, low(), g_.data(), a_.data(), m, d, f, params_[fc1_w], params_[fc1_b]);
    vit_device_detail::gemm(be, low(), false, false, m, d, f, 1.0f, g_.data(), f, weight(fc1_w), d, 0.0f, dbranch_.data(), d);
    tp_sum(dbranch_.data(), m * d);  // each rank's hidden units' part of LN2's output gradient
    be.launch(d, el::layernorm_param_grads_fn{s + at.x1, dbranch_.data(), m, d, s + at.mean2, s + at.rstd2,
                                              params_[ln2_g].grad().data(), params_[ln2_b].grad().data()});
    be.launch(m, el::layernorm_backward_fn{s + at.x1, dbranch_.data(), weight(ln2_g), d, s + at.mean2, s + at.rstd2, gy.data(),
                                           out_grad});

    // The attention branch.
    const float* dattn = out_grad;
    if (dropping()) {
      be.launch(m * d, el::dropout_fn{out_grad, dbranch_.data(), el::dropout_stream(call.seed, 1), threshold_, keep_scale_});
      dattn = dbranch_.data();
    }
    vit_device_detail::linear_backward_params(be, low(), dattn, s + at.ctx, m, w, d, params_[proj_w], params_[proj_b]);
    vit_device_detail::gemm(be, low(), false, false, m, w, d, 1.0f, dattn, d, weight(proj_w), w, 0.0f, dctx_.data(), w);
    attention_backward(b.n, b.t, s + at.qkv, s + at.probs, dctx_.data(), dqkv_.data(), call.seed);
    be.launch(m, el::layernorm_apply_fn{x.data(), weight(ln1_g), weight(ln1_b), d, s + at.mean1, s + at.rstd1, a_.data()});
    vit_device_detail::linear_backward_params(be, low(), dqkv_.data(), a_.data(), m, d, 3 * w, params_[qkv_w], params_[qkv_b]);
    vit_device_detail::gemm(be, low(), false, false, m, d, 3 * w, 1.0f, dqkv_.data(), 3 * w, weight(qkv_w), d, 0.0f,
                            dbranch_.data(), d);
    tp_sum(dbranch_.data(), m * d);  // each rank's heads' part of LN1's output gradient
    be.launch(d, el::layernorm_param_grads_fn{x.data(), dbranch_.data(), m, d, s + at.mean1, s + at.rstd1,
                                              params_[ln1_g].grad().data(), params_[ln1_b].grad().data()});
    be.launch(m, el::layernorm_backward_fn{x.data(), dbranch_.data(), weight(ln1_g), d, s + at.mean1, s + at.rstd1, out_grad,
                                           out_grad});
  }

  [[nodiscard]] std::vector<device_param<Backend>>& parameters() override { return params_; }

 private:
  enum param_index : std::size_t { ln1_g, ln1_b, qkv_w, qkv_b, proj_w, proj_b, ln2_g, ln2_b, fc1_w, fc1_b, fc2_w, fc2_b };
  [[nodiscard]] bool dropping() const noexcept { return training_ && threshold_ > 0; }
  [[nodiscard]] const float* weight(std::size_t i) { return params_[i].value().data(); }
  [[nodiscard]] vit_device_detail::low_operands<Backend>* low() noexcept { return bf16_ ? &low_ : nullptr; }
  [[nodiscard]] typename host_block::layout layout_of(const shape& s) const {
    const vit_detail::token_batch b(s, dim_, "transformer_block");
    return typename host_block::layout(b.n, b.t, dim_, heads_, hidden_, width_);
  }

  // y [m, dim] = the group's sum of x [m, in] W^T (this rank's columns of W, params_[wi]), + b.
  void row_parallel_forward(const float* x, std::size_t m, std::size_t in, std::size_t wi, float* y) {
    const auto& be = *this->be_;
    vit_device_detail::gemm(be, low(), false, true, m, dim_, in, 1.0f, x, in, weight(wi), in, 0.0f, y, dim_);
    tp_sum(y, m * dim_);
    be.launch(m * dim_, vit_device_detail::el::bias_fn{y, weight(wi + 1), dim_});
  }
  // The tensor-parallel group's sum of n values in the backend's memory, in place.
  void tp_sum(float* p, std::size_t n) {
    if (tp_.size == 1) return;
    const auto& be = *this->be_;
    be.synchronize();  // the kernels that wrote p have finished before any rank's collective reads it
    constexpr bool on_device = !std::same_as<space, partrain::host_space>;
    if constexpr (!on_device) {
      vit_detail::wire_all_reduce(tp_, p, n);
    } else {
      if (tp_.wire == partrain::dtype::float32 && tp_.group->accepts(partrain::device_kind::cuda)) {
        tp_.group->all_reduce(tensor_view<float, space>(p, shape{n})).wait();
        return;
      }
      host_sum_.resize(n);
      be.download(host_sum_.data(), p, n * sizeof(float));
      be.synchronize();
      vit_detail::wire_all_reduce(tp_, host_sum_.data(), n);
      be.upload(p, host_sum_.data(), n * sizeof(float));
    }
  }

  // Per head h, over the n images at once: S = q_h k_h^T, P = softmax(S / sqrt(dh)) (every row of
  // every head in one launch), ctx_h = drop(P) v_h. The heads are strided column blocks of qkv
  // [m, 3 width] and ctx [m, width]; probs is [n, H, t, t] (this rank's H heads).
  void attention_forward(std::size_t n, std::size_t t, const float* qkv, float* probs, float* ctx, std::uint64_t seed) {
    namespace el = vit_device_detail::el;
    const auto& be = *this->be_;
    const std::size_t w = width_, dh = width_ / heads_, tt = t * t, htt = heads_ * tt;
    for (std::size_t h = 0; h < heads_; ++h) {
      vit_device_detail::gemm(be, low(), false, true, t, t, dh, 1.0f, qkv + h * dh, 3 * w, qkv + w + h * dh, 3 * w, 0.0f,
                              probs + h * tt, t, n, t * 3 * w, t * 3 * w, htt);
    }
    be.launch(n * heads_ * t, el::softmax_fn{probs, t, 1.0f / std::sqrt(static_cast<float>(dh))});
    const float* pv = dropped(probs, n, tt, seed);
    for (std::size_t h = 0; h < heads_; ++h) {
      vit_device_detail::gemm(be, low(), false, false, t, dh, t, 1.0f, pv + h * tt, t, qkv + 2 * w + h * dh, 3 * w, 0.0f,
                              ctx + h * dh, w, n, htt, t * 3 * w, t * w);
    }
  }
  // dv_h = Pd^T dctx_h, dPd = dctx_h v_h^T, dP = drop(dPd), dS = softmax'(dP), dq_h = dS k_h /
  // sqrt(dh), dk_h = dS^T q_h / sqrt(dh): the host block's per-(image, head) steps, a head at a time.
  void attention_backward(std::size_t n, std::size_t t, const float* qkv, const float* probs, const float* dctx,
                          float* dqkv, std::uint64_t seed) {
    namespace el = vit_device_detail::el;
    const auto& be = *this->be_;
    const std::size_t w = width_, dh = width_ / heads_, tt = t * t, htt = heads_ * tt;
    const float scale = 1.0f / std::sqrt(static_cast<float>(dh));
    be.reserve(dp_, n * htt);
    const float* pv = dropped(probs, n, tt, seed);
    for (std::size_t h = 0; h < heads_; ++h) {
      vit_device_detail::gemm(be, low(), true, false, t, dh, t, 1.0f, pv + h * tt, t, dctx + h * dh, w, 0.0f,
                              dqkv + 2 * w + h * dh, 3 * w, n, htt, t * w, t * 3 * w);
      vit_device_detail::gemm(be, low(), false, true, t, t, dh, 1.0f, dctx + h * dh, w, qkv + 2 * w + h * dh, 3 * w, 0.0f,
                              dp_.data() + h * tt, t, n, t * w, t * 3 * w, htt);
    }
    if (dropping()) be.launch(n * htt, head_dropout(dp_.data(), dp_.data(), tt, seed));
    be.launch(n * heads_ * t, el::softmax_backward_fn{probs, dp_.data(), t});
    for (std::size_t h = 0; h < heads_; ++h) {
      vit_device_detail::gemm(be, low(), false, false, t, dh, t, scale, dp_.data() + h * tt, t, qkv + w + h * dh, 3 * w,
                              0.0f, dqkv + h * dh, 3 * w, n, htt, t * 3 * w, t * 3 * w);
      vit_device_detail::gemm(be, low(), true, false, t, dh, t, scale, dp_.data() + h * tt, t, qkv + h * dh, 3 * w, 0.0f,
                              dqkv + w + h * dh, 3 * w, n, htt, t * 3 * w, t * 3 * w);
    }
  }
  // The attention's dropout over this rank's heads of probabilities [n, heads, t, t], each element
  // masked by its place in the whole block's (so a shard drops what the whole block drops).
  [[nodiscard]] vit_device_detail::el::head_dropout_fn head_dropout(const float* in, float* out, std::size_t tt,
                                                                    std::uint64_t seed) const {
    return {in, out, vit_device_detail::el::dropout_stream(seed, 0), threshold_, keep_scale_, tt, heads_,
            heads_ * tp_.size, heads_ * tp_.rank};
  }
  // The probabilities with the attention's dropout applied, or probs itself when nothing drops.
  const float* dropped(const float* probs, std::size_t n, std::size_t tt, std::uint64_t seed) {
    if (!dropping()) return probs;
    const std::size_t count = n * heads_ * tt;
    this->be_->reserve(dropped_, count);
    this->be_->launch(count, head_dropout(probs, dropped_.data(), tt, seed));
    return dropped_.data();
  }

  std::size_t dim_, heads_, hidden_;  // heads and hidden units here (a shard's own)
  std::size_t width_;                 // heads_ * head width: dim_, or dim_ / p in a shard
  std::uint32_t threshold_;
  float keep_scale_;
  bool bf16_;
  tp_shard tp_;
  bool training_ = true;
  std::vector<device_param<Backend>> params_;
  typename Backend::template array<float> a_, g_, slope_, dbranch_, dctx_, dqkv_, dropped_, dp_;
  vit_device_detail::low_operands<Backend> low_;
  std::vector<float> host_sum_;  // tp_sum's staging through host memory
};

// vit_head on the device: token mean, LayerNorm, classifier; keeps nothing (backward recomputes
// the pooled rows and their LayerNorm).
template <class Backend>
class device_vit_head final : public device_layer<Backend> {
  using base = device_layer<Backend>;

 public:
  using base::backward;
  using base::forward;
  device_vit_head(std::shared_ptr<Backend> be, const vit_config& c, basic_vit_head<float>& host)
      : base(std::move(be)), dim_(c.dim), classes_(c.classes), bf16_(vit_device_detail::bf16_products(c)),
        params_(vit_device_detail::upload_parameters(*this->be_, host.parameters())) {}

  [[nodiscard]] shape output_shape(const shape& s) const override {
    return {vit_detail::token_batch(s, dim_, "vit_head").n, classes_};
  }
  void forward(typename base::in_view x, typename base::out_view y) override {
    const vit_detail::token_batch b(x.shape(), dim_, "vit_head");
    cnn_detail::check_size("vit_head::forward: the output", y.size(), b.n * classes_);
    normalize(x.data(), b.n, b.t);
    vit_device_detail::linear_forward(*this->be_, low(), normed_.data(), b.n, dim_, classes_, params_[2], params_[3], y.data());
  }
  void backward(typename base::in_view x, typename base::in_view, typename base::in_view gy,
                typename base::out_view gx) override {
    namespace el = vit_device_detail::el;
    const vit_detail::token_batch b(x.shape(), dim_, "vit_head");
    cnn_detail::check_size("vit_head::backward: the output gradient", gy.size(), b.n * classes_);
    cnn_detail::check_size("vit_head::backward: the input gradient", gx.size(), x.size());
    const auto& be = *this->be_;
    normalize(x.data(), b.n, b.t);
    vit_device_detail::linear_backward_params(be, low(), gy.data(), normed_.data(), b.n, dim_, classes_, params_[2], params_[3]);
    // dnormed = gy W, into normed_ (used up); the LayerNorm's backward then runs in place (a
    // row's gradient reads each element before writing it), after its parameters' share.
    float* dnormed = normed_.data();
    vit_device_detail::gemm(be, low(), false, false, b.n, dim_, classes_, 1.0f, gy.data(), classes_, params_[2].value().data(),
                            dim_, 0.0f, dnormed, dim_);
    be.launch(dim_, el::layernorm_param_grads_fn{pooled_.data(), dnormed, b.n, dim_, mean_.data(), rstd_.data(),
                                                 params_[0].grad().data(), params_[1].grad().data()});
    be.launch(b.n, el::layernorm_backward_fn{pooled_.data(), dnormed, params_[0].value().data(), dim_, mean_.data(),
                                             rstd_.data(), nullptr, dnormed});
    be.launch(x.size(), el::token_mean_backward_fn{dnormed, b.t, dim_, gx.data()});
  }
  [[nodiscard]] std::vector<device_param<Backend>>& parameters() override { return params_; }

 private:
  // The token mean (pooled_), its LayerNorm statistics (mean_, rstd_) and output (normed_).
  void normalize(const float* x, std::size_t n, std::size_t t) {
    namespace el = vit_device_detail::el;
    const auto& be = *this->be_;
    be.reserve(pooled_, n * dim_);
    be.reserve(normed_, n * dim_);
    be.reserve(mean_, n);
    be.reserve(rstd_, n);
    be.launch(n * dim_, el::token_mean_fn{x, t, dim_, pooled_.data()});
    be.launch(n, el::layernorm_forward_fn{pooled_.data(), params_[0].value().data(), params_[1].value().data(), dim_,
                                          static_cast<float>(vit_detail::layernorm_eps), mean_.data(), rstd_.data(),
                                          normed_.data()});
  }
  [[nodiscard]] vit_device_detail::low_operands<Backend>* low() noexcept { return bf16_ ? &low_ : nullptr; }

  std::size_t dim_, classes_;
  bool bf16_;
  std::vector<device_param<Backend>> params_;
  typename Backend::template array<float> pooled_, normed_, mean_, rstd_;
  vit_device_detail::low_operands<Backend> low_;
};

// make_vit's layers and weights (for the same config and seed) on the backend's device:
// device_patch_embed, c.depth device_transformer_blocks, device_vit_head. With a tp_shard: rank
// tp.rank's shard, the blocks split as make_vit splits them, the embedding and the head whole.
template <class Backend>
[[nodiscard]] device_model<Backend> make_device_vit(const vit_config& c, std::uint32_t seed, const partrain::device& where,
                                                    tp_shard tp = {}) {
  Backend::check_device(where);
  auto be = std::make_shared<Backend>(where);
  basic_vit<float> host(c, seed);
  device_model<Backend> m;
  m.push_back(std::make_unique<device_patch_embed<Backend>>(be, c, host.embed));
  for (auto& b : host.blocks) {
    if (tp.size == 1) {
      m.push_back(std::make_unique<device_transformer_block<Backend>>(be, c, b));
    } else {
      basic_transformer_block<float> shard(b, tp);  // checks the split and the group, as make_vit's shards do
      m.push_back(std::make_unique<device_transformer_block<Backend>>(be, c, shard, tp));
    }
  }
  m.push_back(std::make_unique<device_vit_head<Backend>>(be, c, host.head));
  return m;
}

}  // namespace models::layers
