// models/vit_layers.hpp: a small Vision Transformer as stage-able host layers, beside the CNN's in
// cnn_layers.hpp (same base, parameters and loss): patch_embed (patches, a linear projection,
// learned positions), transformer_block (pre-norm multi-head self-attention and a GELU MLP; it
// keeps activations for its backward), vit_head (mean pool, LayerNorm, classifier) and make_vit.
// Every layer is a template on its scalar, basic_*<T>: float is the model (the host layers below
// wrap it), double is its finite-difference gradient check. The element math is vit_elements.hpp;
// the GEMMs go through OpenBLAS (cblas_sgemm or cblas_dgemm, as T says).
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <cblas.h>

#include <partrain/comm/process_group.hpp>
#include <partrain/core/buffer.hpp>
#include <partrain/core/dtype.hpp>
#include <partrain/core/error.hpp>
#include <partrain/core/half.hpp>
#include <partrain/core/tensor_view.hpp>
#include <partrain/precision/cast.hpp>

#include "cnn_layers.hpp"
#include "mlp_layers.hpp"
#include "vit_elements.hpp"

namespace models::layers {

// The defaults (139k parameters) reach 0.883 Fashion-MNIST test accuracy after 9 epochs, 2.5
// minutes on one thread of a busy 2-core machine (AdamW lr 1e-3, weight decay 0.01, batch 64, no
// schedule; 0.864 after 4 epochs, 0.878 to 0.883 over epochs 9 to 12). A forward and backward of a
// batch of 64 takes 15 to 18 ms there (OpenBLAS, one thread).
struct vit_config {
  // 7x7 patches: 16 tokens of 49 pixels. 4x4 patches (49 tokens) took 3.8x as long per batch
  // (attention is quadratic in the tokens, the rest linear) and trained no better in the same
  // number of epochs (0.850 against 0.864 after 4): on 2 cores, the minutes decide.
  std::size_t patch = 7;
  std::size_t dim = 64;
  std::size_t depth = 4;
  std::size_t heads = 4;
  // The MLP's hidden width is mlp_ratio * dim: 2, not the original ViT's 4, which took 1.5x as
  // long per batch (24 ms against 16).
  std::size_t mlp_ratio = 2;
  float dropout = 0.0f;       // on the attention probabilities and both residual branches
  std::size_t image = 28;     // square grey images, given as [batch, image * image]
  std::size_t classes = 10;
  // The matrix products' operands: float32, or bfloat16 (each operand rounded to bfloat16, the
  // products summed in float32: tensor cores' arithmetic, and what PyTorch's autocast gives
  // linear layers and attention's batched products). Parameters, gradients, LayerNorms, softmax,
  // GELU and residuals stay float32 either way. A double layer (the gradient check's) rounds the
  // same way.
  partrain::dtype compute = partrain::dtype::float32;
};

namespace vit_detail {

namespace el = models::vit_elements;

inline constexpr double layernorm_eps = 1e-5;  // PyTorch's LayerNorm default

// A parameter of a double layer (the gradient check's twin): host_param's value() and grad().
template <class T>
struct basic_param {
  host_buffer<T> v, g;
  explicit basic_param(shape s) : v(s), g(s) {}
  [[nodiscard]] tensor_view<T> value() { return v.view(); }
  [[nodiscard]] tensor_view<T> grad() { return g.view(); }
  [[nodiscard]] partrain::process_group* shard_group() const noexcept { return shard_group_; }
  void set_shard_group(partrain::process_group* g) noexcept { shard_group_ = g; }

 private:
  partrain::process_group* shard_group_ = nullptr;
};
// float layers hold host_param, what host_layer::parameters() returns (and what FSDP binds).
template <class T>
using param_t = std::conditional_t<std::is_same_v<T, float>, host_param, basic_param<T>>;

// Row-major C = alpha * op(A) op(B) + beta * C, through OpenBLAS in T's precision.
template <class T>
void gemm(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, std::size_t m, std::size_t n, std::size_t k, T alpha, const T* a,
          std::size_t lda, const T* b, std::size_t ldb, T beta, T* c, std::size_t ldc) {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, double>, "vit layers compute in float or double");
  const auto i = [](std::size_t v) { return static_cast<blasint>(v); };
  if constexpr (std::is_same_v<T, float>) {
    cblas_sgemm(CblasRowMajor, ta, tb, i(m), i(n), i(k), alpha, a, i(lda), b, i(ldb), beta, c, i(ldc));
  } else {
    cblas_dgemm(CblasRowMajor, ta, tb, i(m), i(n), i(k), alpha, a, i(lda), b, i(ldb), beta, c, i(ldc));
  }
}

// Per-thread scratch for temporaries that do not outlive one layer call (as cnn_detail::scratch,
// with more slots and any T): grown on demand, reused by every later call on this thread.
template <class T>
T* scratch(std::size_t slot, std::size_t n) {
  thread_local std::array<std::vector<T>, 16> buffers;
  auto& b = buffers[slot];
  if (b.size() < n) b.resize(n);
  return b.data();
}

// The elements of a row-major matrix [rows, cols] with leading dimension ld (all of them up to its
// last element), rounded to bfloat16 and kept in T, in scratch slot `slot`.
template <class T>
const T* bf16_rounded(std::size_t slot, const T* p, std::size_t rows, std::size_t cols, std::size_t ld) {
  const std::size_t n = rows == 0 || cols == 0 ? 0 : (rows - 1) * ld + cols;
  T* out = scratch<T>(slot, n);
  for (std::size_t i = 0; i < n; ++i) out[i] = static_cast<T>(static_cast<float>(partrain::bfloat16(static_cast<float>(p[i]))));
  return out;
}
// gemm in vit_config::compute's arithmetic: float32 as gemm; bfloat16 with A and B rounded first
// (scratch slots 14 and 15). A product of two bfloat16 values is exact in float, so this is the
// device's bfloat16 GEMM (fp32 accumulation) up to the order of the sums.
template <class T>
void gemm_as(partrain::dtype compute, CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, std::size_t m, std::size_t n,
             std::size_t k, T alpha, const T* a, std::size_t lda, const T* b, std::size_t ldb, T beta, T* c,
             std::size_t ldc) {
  if (compute == partrain::dtype::bfloat16) {
    a = bf16_rounded(14, a, ta == CblasNoTrans ? m : k, ta == CblasNoTrans ? k : m, lda);
    b = bf16_rounded(15, b, tb == CblasNoTrans ? k : n, tb == CblasNoTrans ? n : k, ldb);
  }
  gemm<T>(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

// Initial values are drawn in float whatever T is, so a double layer built from a seed holds
// exactly the float layer's values (what the gradient checks compare).
// Uniform in +-1/sqrt(fan_in), as init_linear (PyTorch's nn.Linear default).
template <class T>
void fill_uniform(std::mt19937& gen, std::size_t fan_in, tensor_view<T> v) {
  const float bound = 1.0f / std::sqrt(static_cast<float>(fan_in));
  std::uniform_real_distribution<float> d(-bound, bound);
  for (auto& x : v) x = static_cast<T>(d(gen));
}
// Normal(0, 0.02): the original ViT's embedding initialization.
template <class T>
void fill_normal(std::mt19937& gen, tensor_view<T> v) {
  std::normal_distribution<float> d(0.0f, 0.02f);
  for (auto& x : v) x = static_cast<T>(d(gen));
}
template <class T>
void fill(tensor_view<T> v, T value) {
  for (auto& x : v) x = value;
}

// Adds double sums to a gradient (bias and LayerNorm gradients are summed over rows in double).
template <class T>
void add_sums(tensor_view<T> grad, std::span<const double> sums) {
  for (std::size_t i = 0; i < sums.size(); ++i) grad[i] += static_cast<T>(sums[i]);
}

// Checks that s is [batch, tokens, dim] (tokens >= 1); returns batch and tokens.
struct token_batch {
  std::size_t n, t;
  token_batch(const shape& s, std::size_t dim, const char* layer) {
    if (s.rank() != 3 || s[1] == 0 || s[2] != dim) {
      throw invalid_argument_error(std::string(layer) + ": input shape " + s.to_string() +
                                   ", expected [batch, tokens, " + std::to_string(dim) + "] with tokens >= 1");
    }
    n = s[0];
    t = s[1];
  }
};

// vit_config::compute: float32 or bfloat16.
inline void check_compute(const char* layer, partrain::dtype compute) {
  if (compute != partrain::dtype::float32 && compute != partrain::dtype::bfloat16) {
    throw invalid_argument_error(std::string(layer) + ": matrix products in " + std::string(partrain::to_string(compute)) +
                                 " (expected float32 or bfloat16)");
  }
}
inline void check_saved(const char* what, std::size_t got, std::size_t expected) {
  if (got < expected) {
    throw invalid_argument_error(std::string(what) + ": the saved buffer has " + std::to_string(got) +
                                 " elements, expected at least " + std::to_string(expected) + " (saved_size)");
  }
}

inline void check_dropout(const char* layer, float p) {
  if (!(p >= 0.0f && p < 1.0f)) {
    throw invalid_argument_error(std::string(layer) + ": dropout " + std::to_string(p) + " (expected 0 <= dropout < 1)");
  }
}

}  // namespace vit_detail

// Non-overlapping patch x patch patches of an image x image grey image, each projected to dim
// (PyTorch's Conv2d(1, dim, patch, stride=patch) as a GEMM over the gathered patches), plus a
// learned position embedding per patch: [n, image^2] or [n, 1, image, image] -> [n, tokens, dim].
// No class token: vit_head mean-pools the tokens instead, which trains as well or better on small
// ViTs (Beyer et al. 2022, "Better plain ViT baselines") and keeps 16 tokens, not 17. Parameters:
// projection [dim, patch^2] (a patch's pixels row-major), bias [dim], positions [tokens, dim].
template <class T>
class basic_patch_embed {
 public:
  basic_patch_embed(std::size_t image, std::size_t patch, std::size_t dim, std::uint32_t seed,
                    partrain::dtype compute = partrain::dtype::float32)
      : image_(image), patch_(patch), dim_(dim), grid_(patch ? image / patch : 0), compute_(compute) {
    vit_detail::check_compute("patch_embed", compute_);
    if (image_ == 0 || patch_ == 0 || image_ % patch_ != 0 || dim_ == 0) {
      throw invalid_argument_error("patch_embed: " + std::to_string(patch_) + "x" + std::to_string(patch_) +
                                   " patches of a " + std::to_string(image_) + "x" + std::to_string(image_) +
                                   " image to dim " + std::to_string(dim_) +
                                   " (expected a patch size > 0 that divides the image side, and dim > 0)");
    }
    params_.emplace_back(shape{dim_, patch_ * patch_});
    params_.emplace_back(shape{dim_});
    params_.emplace_back(shape{tokens(), dim_});
    std::mt19937 gen(seed);
    vit_detail::fill_uniform(gen, patch_ * patch_, params_[0].value());
    vit_detail::fill_uniform(gen, patch_ * patch_, params_[1].value());
    vit_detail::fill_normal(gen, params_[2].value());
  }

  [[nodiscard]] std::size_t tokens() const noexcept { return grid_ * grid_; }
  [[nodiscard]] shape output_shape(const shape& s) const {
    return {cnn_detail::image_batch(s, 1, image_, image_, "patch_embed"), tokens(), dim_};
  }

  void forward(tensor_view<const T> x, tensor_view<T> y) {
    const std::size_t n = output_shape(x.shape())[0], pp = patch_ * patch_, rows = n * tokens();
    cnn_detail::check_size("patch_embed::forward: the output", y.size(), rows * dim_);
    T* patches = vit_detail::scratch<T>(0, rows * pp);
    move_patches<true>(x.data(), patches, n);
    const T* w = params_[0].value().data();  // value(), not v: the storage may be bound elsewhere
    const T* b = params_[1].value().data();
    const T* pos = params_[2].value().data();
    vit_detail::gemm_as<T>(compute_, CblasNoTrans, CblasTrans, rows, dim_, pp, T(1), patches, pp, w, pp, T(0), y.data(), dim_);
    for (std::size_t r = 0; r < rows; ++r) {
      vit_detail::el::add_bias_row(y.data() + r * dim_, b, dim_);
      vit_detail::el::add_bias_row(y.data() + r * dim_, pos + (r % tokens()) * dim_, dim_);
    }
  }

  void backward(tensor_view<const T> x, tensor_view<const T>, tensor_view<const T> gy, tensor_view<T> gx) {
    const std::size_t n = output_shape(x.shape())[0], pp = patch_ * patch_, rows = n * tokens();
    cnn_detail::check_size("patch_embed::backward: the output gradient", gy.size(), rows * dim_);
    cnn_detail::check_size("patch_embed::backward: the input gradient", gx.size(), x.size());
    T* patches = vit_detail::scratch<T>(0, rows * pp);
    T* gpatches = vit_detail::scratch<T>(1, rows * pp);
    move_patches<true>(x.data(), patches, n);
    const T* w = params_[0].value().data();
    // grad W [dim, pp] += gy^T [dim, rows] x patches [rows, pp]
    vit_detail::gemm_as<T>(compute_, CblasTrans, CblasNoTrans, dim_, pp, rows, T(1), gy.data(), dim_, patches, pp, T(1),
                        params_[0].grad().data(), pp);
    std::vector<double> sb(dim_, 0.0), spos(tokens() * dim_, 0.0);
    for (std::size_t r = 0; r < rows; ++r) {
      vit_detail::el::add_row_to_sums(gy.data() + r * dim_, dim_, sb.data());
      vit_detail::el::add_row_to_sums(gy.data() + r * dim_, dim_, spos.data() + (r % tokens()) * dim_);
    }
    vit_detail::add_sums(params_[1].grad(), sb);
    vit_detail::add_sums(params_[2].grad(), spos);
    // gpatches [rows, pp] = gy [rows, dim] x W [dim, pp]; the patches tile the image, so every
    // pixel of gx is written once.
    vit_detail::gemm_as<T>(compute_, CblasNoTrans, CblasNoTrans, rows, pp, dim_, T(1), gy.data(), dim_, w, pp, T(0), gpatches, pp);
    move_patches<false>(gx.data(), gpatches, n);
  }

  [[nodiscard]] std::vector<vit_detail::param_t<T>>& parameters() noexcept { return params_; }

 private:
  // patches[(e * tokens + py * grid + px) * patch^2 + r * patch + c] is pixel (py * patch + r,
  // px * patch + c) of image e; copied that way (ToPatches) or back.
  template <bool ToPatches>
  void move_patches(std::conditional_t<ToPatches, const T*, T*> img, std::conditional_t<ToPatches, T*, const T*> patches,
                    std::size_t n) const {
    const std::size_t pp = patch_ * patch_;
    for (std::size_t e = 0; e < n; ++e) {
      for (std::size_t py = 0; py < grid_; ++py) {
        for (std::size_t px = 0; px < grid_; ++px) {
          for (std::size_t r = 0; r < patch_; ++r) {
            const std::size_t pixel = e * image_ * image_ + (py * patch_ + r) * image_ + px * patch_;
            const std::size_t at = ((e * tokens() + py * grid_ + px) * pp) + r * patch_;
            for (std::size_t c = 0; c < patch_; ++c) {
              if constexpr (ToPatches) {
                patches[at + c] = img[pixel + c];
              } else {
                img[pixel + c] = patches[at + c];
              }
            }
          }
        }
      }
    }
  }

  std::size_t image_, patch_, dim_, grid_;
  partrain::dtype compute_;
  std::vector<vit_detail::param_t<T>> params_;
};

// A layer's place in a tensor-parallel group: rank `rank` of `size`, whose partial sums `group`
// adds up (group may be null when size is 1). With sequence_parallel, the blocks' inputs and
// outputs are this rank's slice of the tokens (see basic_transformer_block).
struct tp_shard {
  partrain::process_group* group = nullptr;
  std::size_t rank = 0;
  std::size_t size = 1;
  bool sequence_parallel = false;
  // The activations' collectives (and their gradients'): float32, or bfloat16 (each rank's values
  // rounded before they move, the result widened back: half the bytes, as Megatron's bf16
  // training moves them). The LayerNorm gradients' sums and the weights' gathers stay float32.
  partrain::dtype wire = partrain::dtype::float32;
};

namespace vit_detail {

// The collectives of tensor parallelism move floats (the double twin is for gradient checks).
inline void check_float_tp(bool is_float) {
  if (!is_float) throw invalid_argument_error("transformer_block: tensor parallelism computes in float");
}
// Gathering a shard into the whole model: parameter k of a layer holds `got` values where its
// slice of the whole one holds `want`.
inline void check_gathered_size(std::size_t got, std::size_t want, std::size_t k) {
  if (got != want) {
    throw invalid_argument_error("gather_vit: parameter " + std::to_string(k) + " of a layer holds " + std::to_string(got) +
                                 " values, its slice of the whole model " + std::to_string(want) +
                                 " (a shard of another configuration? An FSDP model's layers hold their values only "
                                 "inside summon_full_params)");
  }
}
// The activation collectives over the tensor-parallel group, on tp.wire. With bfloat16 each
// rank's values are rounded into scratch slot `slot` before they move (rounded) and the result
// widened back (widen).
inline partrain::bfloat16* rounded(const float* x, std::size_t n, std::size_t slot) {
  partrain::bfloat16* b = scratch<partrain::bfloat16>(slot, n);
  partrain::cast(tensor_view<const float>(x, shape{n}), tensor_view<partrain::bfloat16>(b, shape{n}));
  return b;
}
inline void widen(const partrain::bfloat16* b, float* x, std::size_t n) {
  partrain::cast(tensor_view<const partrain::bfloat16>(b, shape{n}), tensor_view<float>(x, shape{n}));
}
inline void wire_all_reduce(const tp_shard& tp, float* p, std::size_t n) {
  if (tp.wire != partrain::dtype::bfloat16) {
    tp.group->all_reduce(tensor_view<float>(p, shape{n})).wait();
    return;
  }
  partrain::bfloat16* b = rounded(p, n, 0);
  tp.group->all_reduce(tensor_view<partrain::bfloat16>(b, shape{n})).wait();
  widen(b, p, n);
}
// c(in, out) over the group on tp.wire, with in (in_n values) and out (out_n) in float32 or
// bfloat16: float32 as they are; bfloat16 with `in` rounded into scratch slot 1 and c's result
// (slot 0) widened into `out`.
template <class Collective>
void on_wire(const tp_shard& tp, const float* in, std::size_t in_n, float* out, std::size_t out_n, Collective c) {
  if (tp.wire != partrain::dtype::bfloat16) {
    c(in, out);
    return;
  }
  partrain::bfloat16* result = scratch<partrain::bfloat16>(0, out_n);
  c(static_cast<const partrain::bfloat16*>(rounded(in, in_n, 1)), result);
  widen(result, out, out_n);
}
// Every rank's chunk of floats into all [p chunk], in rank order.
inline void wire_all_gather(const tp_shard& tp, const float* part, float* all, std::size_t chunk) {
  const std::size_t n = tp.size * chunk;
  on_wire(tp, part, chunk, all, n, [&]<class E>(const E* in, E* out) {
    tp.group->all_gather(tensor_view<const E>(in, shape{chunk}), tensor_view<E>(out, shape{n})).wait();
  });
}
// The group's sum of all [p chunk], chunk r of it into rank r's part.
inline void wire_reduce_scatter(const tp_shard& tp, const float* all, float* part, std::size_t chunk) {
  const std::size_t n = tp.size * chunk;
  on_wire(tp, all, n, part, chunk, [&]<class E>(const E* in, E* out) {
    tp.group->reduce_scatter(tensor_view<const E>(in, shape{n}), tensor_view<E>(out, shape{chunk})).wait();
  });
}
// Sequence parallelism's two exchanges of tokens over a tensor-parallel group of p ranks, rank r
// holding tokens r ts .. (r + 1) ts of each of n examples ([n, ts, dim] slices of [n, p ts, dim]):
// the collectives move rank-major blocks, so the rows are staged through scratch slot 13.
// Every rank's slice into the whole sequence (an all-gather).
template <class T>
void all_gather_tokens(const tp_shard& tp, const T* part, T* whole, std::size_t n, std::size_t ts, std::size_t dim) {
  check_float_tp(std::is_same_v<T, float>);
  const std::size_t p = tp.size, run = ts * dim, chunk = n * run;
  T* staged = scratch<T>(13, p * chunk);
  if constexpr (std::is_same_v<T, float>) wire_all_gather(tp, part, staged, chunk);
  for (std::size_t q = 0; q < p; ++q) {
    for (std::size_t e = 0; e < n; ++e) std::copy_n(staged + q * chunk + e * run, run, whole + (e * p + q) * run);
  }
}
// The group's sum of whole-sequence partial sums, this rank's slice of it (a reduce-scatter).
template <class T>
void reduce_scatter_tokens(const tp_shard& tp, const T* whole, T* part, std::size_t n, std::size_t ts, std::size_t dim) {
  check_float_tp(std::is_same_v<T, float>);
  const std::size_t p = tp.size, run = ts * dim, chunk = n * run;
  T* staged = scratch<T>(13, p * chunk);
  for (std::size_t q = 0; q < p; ++q) {
    for (std::size_t e = 0; e < n; ++e) std::copy_n(whole + (e * p + q) * run, run, staged + q * chunk + e * run);
  }
  if constexpr (std::is_same_v<T, float>) wire_reduce_scatter(tp, staged, part, chunk);
}
inline void check_sequence_group(const tp_shard& tp) {
  if (tp.size < 2 || !tp.group || static_cast<std::size_t>(tp.group->size()) != tp.size) {
    throw invalid_argument_error("sequence parallel: needs a tensor-parallel group of 2 or more ranks (got size " +
                                 std::to_string(tp.size) + (tp.group ? "" : ", no group") + ")");
  }
}
inline void check_sequence_split(std::size_t tokens, std::size_t p) {
  if (tokens % p != 0) {
    throw invalid_argument_error("sequence parallel: " + std::to_string(tokens) + " tokens over " + std::to_string(p) +
                                 " tensor-parallel ranks (expected the tokens to divide evenly: each rank holds an "
                                 "equal slice of the sequence)");
  }
}
// Rank r's slice of the whole sequence (no communication).
template <class T>
void slice_tokens(const tp_shard& tp, const T* whole, T* part, std::size_t n, std::size_t ts, std::size_t dim) {
  const std::size_t run = ts * dim;
  for (std::size_t e = 0; e < n; ++e) std::copy_n(whole + (e * tp.size + tp.rank) * run, run, part + e * run);
}

}  // namespace vit_detail

// A pre-norm transformer encoder block on [n, tokens, dim]:
//   x1  = x  + drop(proj(attention(LN1(x))))
//   out = x1 + drop(fc2(gelu(fc1(LN2(x1)))))
// attention: heads of dim / heads, one QKV projection [3 dim, dim], softmax(q k^T / sqrt(dh)) with
// dropout on its probabilities, then v. GELU is the tanh form (vit_elements.hpp says why). Dropout
// masks are a pure function of (call seed, site, element index), so a recomputed forward and the
// backward redraw the same masks; train(false) turns dropout off.
// Parameters, in order: LN1 gamma, beta [dim]; qkv W [3 dim, dim], b [3 dim]; proj W [dim, dim],
// b [dim]; LN2 gamma, beta [dim]; fc1 W [hidden, dim], b [hidden]; fc2 W [dim, hidden], b [dim].
//
// Tensor parallel (Megatron-LM's split; the constructor from a whole block and a tp_shard): rank r
// of a group of size p holds heads r H/p .. (r + 1) H/p (their rows of the qkv projection and
// columns of the output projection: [3 dim/p, dim] and [dim, dim/p]) and hidden units r F/p ..
// (fc1's rows, fc2's columns). The block's input and output are whole on every rank; the group
// sums the two row-parallel outputs in forward and the two partial input gradients of the
// column-parallel projections in backward (4 all-reduces of batch x tokens x dim per block and
// step). LayerNorms and the row-parallel biases are replicated; their gradients are the same on
// every rank without a reduction, as the inputs they see are. Dropout masks are drawn by global
// head, so a sharded run drops what the whole block drops.
//
// Sequence parallel (tp_shard::sequence_parallel, Megatron-LM's): the block's input and output are
// [n, t / p, dim], rank r's tokens r t/p .. (r + 1) t/p of each example, and the LayerNorms,
// residuals, biases and dropout run on that slice alone. An all-gather of the tokens feeds each
// column-parallel projection, and a reduce-scatter replaces each all-reduce after a row-parallel
// one (forward: 2 all-gathers and 2 reduce-scatters; backward: the 2 output gradients gathered,
// the 2 LayerNorm outputs gathered again (recomputed from the saved slices, as the input's), 2
// reduce-scatters, and one all-reduce of the LayerNorms' gradients, which each rank has for its
// tokens only). The block's input and output, its LayerNorm statistics and the residual sum x1
// are kept for 1/p of the tokens; the attention's and the MLP's activations are already split by
// heads and hidden units.
template <class T>
class basic_transformer_block {
 public:
  enum param_index : std::size_t { ln1_g, ln1_b, qkv_w, qkv_b, proj_w, proj_b, ln2_g, ln2_b, fc1_w, fc1_b, fc2_w, fc2_b };
  static constexpr std::size_t param_count = 12;

  basic_transformer_block(std::size_t dim, std::size_t heads, std::size_t hidden, float dropout, std::uint32_t seed,
                          partrain::dtype compute = partrain::dtype::float32)
      : dim_(dim), heads_(heads), hidden_(hidden), width_(dim), dropout_(dropout), compute_(compute) {
    vit_detail::check_compute("transformer_block", compute_);
    if (dim_ == 0 || heads_ == 0 || dim_ % heads_ != 0 || hidden_ == 0) {
      throw invalid_argument_error("transformer_block: dim " + std::to_string(dim_) + ", " + std::to_string(heads_) +
                                   " heads, hidden " + std::to_string(hidden_) +
                                   " (expected heads > 0 dividing dim > 0, and hidden > 0)");
    }
    vit_detail::check_dropout("transformer_block", dropout_);
    threshold_ = vit_detail::el::dropout_threshold(dropout_);
    keep_scale_ = T(1) / (T(1) - static_cast<T>(dropout_));
    const std::size_t d = dim_, f = hidden_;
    for (const auto& s : {shape{d}, shape{d}, shape{3 * d, d}, shape{3 * d}, shape{d, d}, shape{d}, shape{d}, shape{d},
                         shape{f, d}, shape{f}, shape{d, f}, shape{d}}) {
      params_.emplace_back(s);
    }
    std::mt19937 gen(seed);
    for (const auto g : {ln1_g, ln2_g}) vit_detail::fill(params_[g].value(), T(1));  // betas stay 0
    for (const auto& [w, fan_in] : {std::pair{qkv_w, d}, std::pair{proj_w, d}, std::pair{fc1_w, d}, std::pair{fc2_w, f}}) {
      vit_detail::fill_uniform(gen, fan_in, params_[w].value());
      vit_detail::fill_uniform(gen, fan_in, params_[w + 1].value());
    }
  }

  // Rank tp.rank's shard of `full`, a whole block: a tensor-parallel run starts where a
  // one-process run starts. The heads and the hidden width must divide by the group's size.
  basic_transformer_block(const basic_transformer_block& full, tp_shard tp)
      : dim_(full.dim_), heads_(full.heads_), hidden_(full.hidden_), width_(full.dim_), dropout_(full.dropout_),
        compute_(full.compute_), threshold_(full.threshold_), keep_scale_(full.keep_scale_), training_(full.training_),
        tp_(tp) {
    const auto sizes = [&] {
      return std::to_string(full.heads_) + " heads and hidden width " + std::to_string(full.hidden_) + " over " +
             std::to_string(tp.size) + " tensor-parallel ranks";
    };
    if (full.tp_.size != 1) throw invalid_argument_error("transformer_block: shards are made from a whole block, not a shard");
    if (tp.size == 0 || tp.rank >= tp.size) {
      throw invalid_argument_error("transformer_block: tensor-parallel rank " + std::to_string(tp.rank) + " of " +
                                   std::to_string(tp.size) + " (expected 0 <= rank < size)");
    }
    if (full.heads_ % tp.size != 0 || full.hidden_ % tp.size != 0) {
      throw invalid_argument_error("transformer_block: " + sizes() +
                                   ": each rank must hold whole heads and an equal share of the hidden units (expected "
                                   "both divisible by the tensor-parallel size)");
    }
    if (tp.size > 1 && (!tp.group || static_cast<std::size_t>(tp.group->size()) != tp.size)) {
      throw invalid_argument_error("transformer_block: " + sizes() + " need their group of that size (got " +
                                   (tp.group ? std::to_string(tp.group->size()) + " ranks" : std::string("none")) + ")");
    }
    if (tp.wire != partrain::dtype::float32 && tp.wire != partrain::dtype::bfloat16) {
      throw invalid_argument_error("transformer_block: tensor-parallel collectives in " + std::string(partrain::to_string(tp.wire)) +
                                   " (expected float32 or bfloat16)");
    }
    heads_ = full.heads_ / tp.size;
    hidden_ = full.hidden_ / tp.size;
    width_ = full.dim_ / tp.size;
    const std::size_t d = dim_, w = width_, f = hidden_;
    for (const auto& sh : {shape{d}, shape{d}, shape{3 * w, d}, shape{3 * w}, shape{d, w}, shape{d}, shape{d}, shape{d},
                          shape{f, d}, shape{f}, shape{d, f}, shape{d}}) {
      params_.emplace_back(sh);
    }
    auto& src = const_cast<basic_transformer_block&>(full).params_;
    for (std::size_t i = 0; i < param_count; ++i) {
      const T* from = src[i].value().data();
      T* to = params_[i].value().data();
      for_each_run(i, tp.rank, [&](std::size_t at_whole, std::size_t at_part, std::size_t n) {
        std::copy_n(from + at_whole, n, to + at_part);
      });
    }
    if (tp.size > 1) {
      for (const auto i : {qkv_w, qkv_b, proj_w, fc1_w, fc1_b, fc2_w}) params_[i].set_shard_group(tp.group);
    }
  }

  // Collective over the tensor-parallel group: every rank's slices put together into `whole`, a
  // whole block of the same sizes (what an export of a tensor-parallel run writes).
  void gather_into(basic_transformer_block& whole) {
    if (whole.tp_.size != 1 || whole.dim_ != dim_ || whole.heads_ != heads_ * tp_.size || whole.hidden_ != hidden_ * tp_.size) {
      throw invalid_argument_error("transformer_block::gather_into: a whole block of dim " + std::to_string(dim_) + ", " +
                                   std::to_string(heads_ * tp_.size) + " heads and hidden width " +
                                   std::to_string(hidden_ * tp_.size) + " (got another)");
    }
    for (std::size_t i = 0; i < param_count; ++i) {
      const auto mine = params_[i].value();
      T* to = whole.params_[i].value().data();
      const std::size_t whole_size = whole.params_[i].value().size();
      vit_detail::check_gathered_size(mine.size(), is_split(i) ? whole_size / tp_.size : whole_size, i);
      if (!is_split(i) || tp_.size == 1) {
        std::copy_n(mine.data(), mine.size(), to);  // replicated: every rank's copy is the same
        continue;
      }
      std::vector<T> all(mine.size() * tp_.size);
      vit_detail::check_float_tp(std::is_same_v<T, float>);
      if constexpr (std::is_same_v<T, float>) {
        tp_.group->all_gather(tensor_view<const float>(mine.data(), shape{mine.size()}), tensor_view<float>(all.data(), shape{all.size()})).wait();
      }
      for (std::size_t q = 0; q < tp_.size; ++q) {
        for_each_run(i, q, [&](std::size_t at_whole, std::size_t at_part, std::size_t n) {
          std::copy_n(all.data() + q * mine.size() + at_part, n, to + at_whole);
        });
      }
    }
  }

  [[nodiscard]] shape output_shape(const shape& s) const {
    (void)vit_detail::token_batch(s, dim_, "transformer_block");
    return s;
  }

  // What forward keeps for backward (T elements at these offsets), n examples of t tokens, M = n t
  // rows, D = dim, H = heads, F = hidden:
  //   mean1, rstd1 [M]    LN1's statistics (its output is recomputed from the input)
  //   qkv [M, 3D]         queries | keys | values per row; head h at columns h dh .. (h + 1) dh
  //   probs [n, H, t, t]  attention probabilities before dropout (the mask is redrawn)
  //   ctx [M, D]          the heads' outputs side by side (the output projection's input)
  //   x1 [M, D]           input + attention branch (LN2's input)
  //   mean2, rstd2 [M]    LN2's statistics
  //   hidden [M, F]       fc1's output before GELU (GELU is recomputed)
  // 4M + 5MD + MF + nHt^2 in all: 528,384 floats (2.1 MB) at n 64, t 16, D 64, H 4, F 128.
  // A tensor-parallel shard keeps its own heads' part: qkv [M, 3W], ctx [M, W] with W = D/p, and
  // H and F its own heads and hidden units (w: W, or D when 0).
  // Under sequence parallelism mean1, rstd1, x1, mean2 and rstd2 hold this rank's ms = M/p rows
  // (ms = 0: all M).
  struct layout {
    std::size_t mean1, rstd1, qkv, probs, ctx, x1, mean2, rstd2, hidden, total;
    layout(std::size_t n, std::size_t t, std::size_t d, std::size_t h, std::size_t f, std::size_t w = 0,
           std::size_t ms = 0) {
      const std::size_t m = n * t;
      if (w == 0) w = d;
      if (ms == 0) ms = m;
      mean1 = 0;
      rstd1 = mean1 + ms;
      qkv = rstd1 + ms;
      probs = qkv + 3 * m * w;
      ctx = probs + n * h * t * t;
      x1 = ctx + m * w;
      mean2 = x1 + ms * d;
      rstd2 = mean2 + ms;
      hidden = rstd2 + ms;
      total = hidden + m * f;
    }
  };
  // An input's tokens: n examples, ts of them here, t in the whole sequence (t = ts p under
  // sequence parallelism).
  struct tokens {
    std::size_t n, ts, t;
  };
  [[nodiscard]] tokens tokens_of(const shape& s, const char* where) const {
    const vit_detail::token_batch b(s, dim_, where);
    return {b.n, b.t, sp() ? b.t * tp_.size : b.t};
  }
  [[nodiscard]] layout layout_of(const tokens& k) const {
    return layout(k.n, k.t, dim_, heads_, hidden_, width_, k.n * k.ts);
  }
  [[nodiscard]] std::size_t saved_size(const shape& s) const { return layout_of(tokens_of(s, "transformer_block")).total; }

  void forward(tensor_view<const T> x, tensor_view<T> y, tensor_view<T> saved, std::uint64_t seed) {
    namespace el = vit_detail::el;
    const tokens k = tokens_of(x.shape(), "transformer_block");
    const std::size_t m = k.n * k.t, ms = k.n * k.ts, d = dim_, f = hidden_;  // ms: this rank's rows
    const layout at = layout_of(k);
    cnn_detail::check_size("transformer_block::forward: the output", y.size(), ms * d);
    vit_detail::check_saved("transformer_block::forward", saved.size(), at.total);
    T* s = saved.data();
    T *mean1 = s + at.mean1, *rstd1 = s + at.rstd1, *qkv = s + at.qkv, *x1 = s + at.x1, *mean2 = s + at.mean2,
      *rstd2 = s + at.rstd2, *hid = s + at.hidden;
    T* a = vit_detail::scratch<T>(0, ms * d);               // LN outputs of this rank's rows
    T* whole = sp() ? vit_detail::scratch<T>(8, m * d) : a;  // ... of every row (gathered)
    T* g = vit_detail::scratch<T>(1, m * f);                // GELU outputs
    const T eps = static_cast<T>(vit_detail::layernorm_eps);
    T* out = y.data();

    // x1 = x + drop(proj(attention(LN1(x))))
    el::layernorm_stats_rows(x.data(), ms, d, eps, mean1, rstd1);
    el::layernorm_apply_rows(x.data(), ms, d, mean1, rstd1, w(ln1_g), w(ln1_b), a);
    gather_tokens(a, whole, k);
    linear_forward(whole, m, d, 3 * width_, qkv_w, qkv);
    attention_forward(k.n, k.t, qkv, s + at.probs, s + at.ctx, seed);
    row_parallel_forward(s + at.ctx, k, width_, proj_w, out);
    drop(out, out, k, 1, seed);
    el::residual_add(x.data(), out, x1, ms * d);

    // out = x1 + drop(fc2(gelu(fc1(LN2(x1)))))
    el::layernorm_stats_rows(x1, ms, d, eps, mean2, rstd2);
    el::layernorm_apply_rows(x1, ms, d, mean2, rstd2, w(ln2_g), w(ln2_b), a);
    gather_tokens(a, whole, k);
    linear_forward(whole, m, d, f, fc1_w, hid);
    el::gelu_n(hid, g, m * f);
    row_parallel_forward(g, k, f, fc2_w, out);
    drop(out, out, k, 2, seed);
    el::residual_add(x1, out, out, ms * d);
  }

  // Reads what forward saved (with the same seed); leaves it unchanged.
  void backward(tensor_view<const T> x, tensor_view<const T>, tensor_view<T> saved, std::uint64_t seed,
                tensor_view<const T> gy, tensor_view<T> gx) {
    namespace el = vit_detail::el;
    const tokens k = tokens_of(x.shape(), "transformer_block");
    const std::size_t m = k.n * k.t, ms = k.n * k.ts, d = dim_, f = hidden_;
    const layout at = layout_of(k);
    cnn_detail::check_size("transformer_block::backward: the output gradient", gy.size(), ms * d);
    cnn_detail::check_size("transformer_block::backward: the input gradient", gx.size(), ms * d);
    vit_detail::check_saved("transformer_block::backward", saved.size(), at.total);
    const T* s = saved.data();
    const T *mean1 = s + at.mean1, *rstd1 = s + at.rstd1, *x1 = s + at.x1, *mean2 = s + at.mean2,
            *rstd2 = s + at.rstd2, *hid = s + at.hidden;
    T* a = vit_detail::scratch<T>(0, ms * d);               // LN outputs of this rank's rows, recomputed
    T* whole = sp() ? vit_detail::scratch<T>(8, m * d) : a;  // ... of every row (gathered)
    T* g = vit_detail::scratch<T>(1, m * f);                // GELU outputs, then the gradient of fc1's output
    T* slope = vit_detail::scratch<T>(2, m * f);            // GELU's derivative
    T* dbranch = vit_detail::scratch<T>(3, m * d);          // a branch's input gradient, every row (partial over tp)
    T* dctx = vit_detail::scratch<T>(4, m * d);
    T* dqkv = vit_detail::scratch<T>(5, 3 * m * d);
    T* dropped = vit_detail::scratch<T>(9, ms * d);          // an output gradient through dropout
    T* dout = sp() ? vit_detail::scratch<T>(10, m * d) : nullptr;  // ... gathered
    T* dln = sp() ? vit_detail::scratch<T>(11, ms * d) : dbranch;  // an LN's output gradient, this rank's rows
    T* out_grad = gx.data();  // gx holds d loss / d x1 until LN1's part is added
    std::vector<double> sums(4 * d, 0.0);  // LN2 gamma, beta, LN1 gamma, beta
    double *sg2 = sums.data(), *sb2 = sg2 + d, *sg1 = sb2 + d, *sb1 = sg1 + d;

    // The MLP branch: out = x1 + drop(fc2(gelu(fc1(LN2(x1))))).
    const T* dm = gy.data();
    if (dropping()) dm = drop(gy.data(), dropped, k, 2, seed);
    dm = gather_tokens(dm, dout, k);
    el::gelu_and_grad_n(hid, g, slope, m * f);
    linear_backward_params(dm, g, m, f, d, fc2_w);
    vit_detail::gemm_as<T>(compute_, CblasNoTrans, CblasNoTrans, m, f, d, T(1), dm, d, w(fc2_w), f, T(0), g, f);
    el::multiply_n(g, slope, m * f);
    el::layernorm_apply_rows(x1, ms, d, mean2, rstd2, w(ln2_g), w(ln2_b), a);
    linear_backward_params(g, gather_tokens(a, whole, k), m, d, f, fc1_w);
    vit_detail::gemm_as<T>(compute_, CblasNoTrans, CblasNoTrans, m, d, f, T(1), g, f, w(fc1_w), d, T(0), dbranch, d);
    sum_tokens(dbranch, dln, k);  // each rank's hidden units' part of LN2's output gradient
    for (std::size_t r = 0; r < ms; ++r) el::layernorm_param_grads(x1 + r * d, dln + r * d, d, mean2[r], rstd2[r], sg2, sb2);
    std::copy_n(gy.data(), ms * d, out_grad);
    el::layernorm_backward_rows(x1, dln, ms, d, mean2, rstd2, w(ln2_g), out_grad, true);

    // The attention branch: x1 = x + drop(proj(attention(LN1(x)))).
    const T* dattn = out_grad;
    if (dropping()) dattn = drop(out_grad, dropped, k, 1, seed);
    dattn = gather_tokens(dattn, dout, k);
    linear_backward_params(dattn, s + at.ctx, m, width_, d, proj_w);
    vit_detail::gemm_as<T>(compute_, CblasNoTrans, CblasNoTrans, m, width_, d, T(1), dattn, d, w(proj_w), width_, T(0), dctx, width_);
    attention_backward(k.n, k.t, s + at.qkv, s + at.probs, dctx, dqkv, seed);
    el::layernorm_apply_rows(x.data(), ms, d, mean1, rstd1, w(ln1_g), w(ln1_b), a);
    linear_backward_params(dqkv, gather_tokens(a, whole, k), m, d, 3 * width_, qkv_w);
    vit_detail::gemm_as<T>(compute_, CblasNoTrans, CblasNoTrans, m, d, 3 * width_, T(1), dqkv, 3 * width_, w(qkv_w), d, T(0), dbranch, d);
    sum_tokens(dbranch, dln, k);  // each rank's heads' part of LN1's output gradient
    for (std::size_t r = 0; r < ms; ++r) {
      el::layernorm_param_grads(x.data() + r * d, dln + r * d, d, mean1[r], rstd1[r], sg1, sb1);
    }
    el::layernorm_backward_rows(x.data(), dln, ms, d, mean1, rstd1, w(ln1_g), out_grad, true);
    // Under sequence parallelism each rank's LN gradients cover its tokens only: one sum of all four.
    if (sp()) tp_sum_doubles(sums);
    vit_detail::add_sums(params_[ln2_g].grad(), std::span<const double>(sg2, d));
    vit_detail::add_sums(params_[ln2_b].grad(), std::span<const double>(sb2, d));
    vit_detail::add_sums(params_[ln1_g].grad(), std::span<const double>(sg1, d));
    vit_detail::add_sums(params_[ln1_b].grad(), std::span<const double>(sb1, d));
  }

  [[nodiscard]] std::vector<vit_detail::param_t<T>>& parameters() noexcept { return params_; }
  void train(bool on) noexcept { training_ = on; }
  [[nodiscard]] bool training() const noexcept { return training_; }

 private:
  [[nodiscard]] bool dropping() const noexcept { return training_ && threshold_ > 0; }
  // A parameter's values, read at each call: the storage may be bound elsewhere (FSDP).
  [[nodiscard]] const T* w(std::size_t i) { return params_[i].value().data(); }

  // Image e's head h here as the whole block numbers it (its dropout mask's place).
  [[nodiscard]] std::size_t global_head(std::size_t e, std::size_t h) const noexcept {
    return e * heads_ * tp_.size + tp_.rank * heads_ + h;
  }
  // The tensor-parallel group's sum of n activations (or their gradients), in place, on the
  // group's wire (nothing to do without a group).
  void tp_sum(T* p, std::size_t n) {
    if (tp_.size == 1) return;
    vit_detail::check_float_tp(std::is_same_v<T, float>);
    if constexpr (std::is_same_v<T, float>) vit_detail::wire_all_reduce(tp_, p, n);
  }
  [[nodiscard]] bool sp() const noexcept { return tp_.size > 1 && tp_.sequence_parallel; }

  // Parameter i is split over the tensor-parallel group (else replicated).
  [[nodiscard]] static bool is_split(std::size_t i) noexcept {
    return i == qkv_w || i == qkv_b || i == proj_w || i == fc1_w || i == fc1_b || i == fc2_w;
  }
  // Where rank r's slice of parameter i lies in the whole parameter, as runs f(at in the whole,
  // at in the slice, count): its heads' rows of each of the query, key and value parts of qkv,
  // its heads' columns of proj, its hidden units' rows of fc1 and columns of fc2; a replicated
  // parameter is one run. The one map the shard constructor and gather_into both read.
  template <class F>
  void for_each_run(std::size_t i, std::size_t r, F&& f) {
    const std::size_t d = dim_, w = width_, fl = hidden_, full_f = hidden_ * tp_size(), n = params_[i].value().size();
    switch (i) {
      case qkv_w:
      case qkv_b: {
        const std::size_t cols = i == qkv_w ? d : 1;
        for (std::size_t part = 0; part < 3; ++part) f((part * d + r * w) * cols, part * w * cols, w * cols);
        return;
      }
      case proj_w:
        for (std::size_t k = 0; k < d; ++k) f(k * d + r * w, k * w, w);
        return;
      case fc1_w: f(r * fl * d, 0, fl * d); return;
      case fc1_b: f(r * fl, 0, fl); return;
      case fc2_w:
        for (std::size_t k = 0; k < d; ++k) f(k * full_f + r * fl, k * fl, fl);
        return;
      default: f(0, 0, n); return;  // replicated
    }
  }
  [[nodiscard]] std::size_t tp_size() const noexcept { return dim_ / width_; }

  // y [ms, dim] = this rank's rows of the group's sum of x [m, in] W^T (this rank's columns of
  // W), then + b: an all-reduce, or under sequence parallelism a reduce-scatter of the tokens.
  void row_parallel_forward(const T* x, const tokens& k, std::size_t in, std::size_t wi, T* y) {
    const std::size_t m = k.n * k.t, ms = k.n * k.ts, out = dim_;
    T* partial = sp() ? vit_detail::scratch<T>(12, m * out) : y;
    vit_detail::gemm_as<T>(compute_, CblasNoTrans, CblasTrans, m, out, in, T(1), x, in, w(wi), in, T(0), partial, out);
    sum_tokens(partial, y, k);
    vit_detail::el::add_bias_rows(y, ms, out, w(wi + 1));
  }
  // Dropout at `site` on this rank's rows [ms, dim], in to out; each element keeps its place in
  // the whole sequence, so the masks are the whole block's. Returns out.
  T* drop(const T* in, T* out, const tokens& k, std::uint64_t site, std::uint64_t seed) {
    if (!dropping()) return out;
    const std::size_t d = dim_, first = sp() ? tp_.rank * k.ts : 0;
    for (std::size_t e = 0; e < k.n; ++e) {
      vit_detail::el::dropout_row(in + e * k.ts * d, out + e * k.ts * d, k.ts * d, vit_detail::el::dropout_stream(seed, site),
                                  (e * k.t + first) * d, threshold_, keep_scale_);
    }
    return out;
  }
  // Every rank's tokens [n, ts, dim] into the whole sequence [n, t, dim]; returns whole. Without
  // sequence parallelism the rows are already whole: returns part.
  const T* gather_tokens(const T* part, T* whole, const tokens& k) {
    if (!sp()) return part;
    vit_detail::all_gather_tokens(tp_, part, whole, k.n, k.ts, dim_);
    return whole;
  }
  // The group's sum of whole [m, dim] partial sums into this rank's rows: a reduce-scatter of the
  // tokens under sequence parallelism (into part), else an all-reduce in place (part is whole).
  void sum_tokens(T* whole, T* part, const tokens& k) {
    if (sp()) {
      vit_detail::reduce_scatter_tokens(tp_, whole, part, k.n, k.ts, dim_);
    } else {
      tp_sum(whole, k.n * k.t * dim_);
    }
  }
  // The group's sum of a few gradient sums (in float on the wire, whatever tp_.wire says).
  void tp_sum_doubles(std::vector<double>& v) {
    if (tp_.size == 1) return;
    std::vector<float> f(v.begin(), v.end());
    tp_.group->all_reduce(tensor_view<float>(f)).wait();
    std::ranges::copy(f, v.begin());
  }

  // y [m, out] = x [m, in] W^T + b, W = params_[wi] [out, in], b = params_[wi + 1].
  void linear_forward(const T* x, std::size_t m, std::size_t in, std::size_t out, std::size_t wi, T* y) {
    vit_detail::gemm_as<T>(compute_, CblasNoTrans, CblasTrans, m, out, in, T(1), x, in, w(wi), in, T(0), y, out);
    vit_detail::el::add_bias_rows(y, m, out, w(wi + 1));
  }
  // grad W [out, in] += dy^T x, grad b += the rows of dy [m, out] (in double).
  void linear_backward_params(const T* dy, const T* x, std::size_t m, std::size_t in, std::size_t out, std::size_t wi) {
    vit_detail::gemm_as<T>(compute_, CblasTrans, CblasNoTrans, out, in, m, T(1), dy, out, x, in, T(1), params_[wi].grad().data(), in);
    std::vector<double> sums(out, 0.0);
    vit_detail::el::column_sums(dy, m, out, sums.data());
    vit_detail::add_sums(params_[wi + 1].grad(), sums);
  }

  // One small GEMM per (example, head): the heads are strided column blocks of qkv and ctx, which
  // the BLAS reads in place through its leading dimensions.
  void attention_forward(std::size_t n, std::size_t t, const T* qkv, T* probs, T* ctx, std::uint64_t seed) {
    namespace el = vit_detail::el;
    const std::size_t d = width_, dh = width_ / heads_;
    const T scale = T(1) / std::sqrt(static_cast<T>(dh));
    const std::uint64_t stream = el::dropout_stream(seed, 0);
    T* dropped = vit_detail::scratch<T>(6, t * t);
    for (std::size_t e = 0; e < n; ++e) {
      for (std::size_t h = 0; h < heads_; ++h) {
        const T* q = qkv + e * t * 3 * d + h * dh;
        T* p = probs + (e * heads_ + h) * t * t;
        vit_detail::gemm_as<T>(compute_, CblasNoTrans, CblasTrans, t, t, dh, T(1), q, 3 * d, q + d, 3 * d, T(0), p, t);
        el::softmax_rows(p, t, t, scale);
        const T* pv = p;
        if (dropping()) {
          el::dropout_row(p, dropped, t * t, stream, global_head(e, h) * t * t, threshold_, keep_scale_);
          pv = dropped;
        }
        vit_detail::gemm_as<T>(compute_, CblasNoTrans, CblasNoTrans, t, dh, t, T(1), pv, t, q + 2 * d, 3 * d, T(0),
                            ctx + e * t * d + h * dh, d);
      }
    }
  }

  // dqkv from dctx: with P the probabilities and Pd = drop(P), ctx_h = Pd v_h gives dv_h = Pd^T dctx_h
  // and dPd = dctx_h v_h^T; then dP = drop(dPd), dS = softmax'(dP), dq_h = dS k_h / sqrt(dh),
  // dk_h = dS^T q_h / sqrt(dh).
  void attention_backward(std::size_t n, std::size_t t, const T* qkv, const T* probs, const T* dctx, T* dqkv,
                          std::uint64_t seed) {
    namespace el = vit_detail::el;
    const std::size_t d = width_, dh = width_ / heads_;
    const T scale = T(1) / std::sqrt(static_cast<T>(dh));
    const std::uint64_t stream = el::dropout_stream(seed, 0);
    T* dropped = vit_detail::scratch<T>(6, t * t);
    T* dp = vit_detail::scratch<T>(7, t * t);
    for (std::size_t e = 0; e < n; ++e) {
      for (std::size_t h = 0; h < heads_; ++h) {
        const T* q = qkv + e * t * 3 * d + h * dh;
        const T* p = probs + (e * heads_ + h) * t * t;
        const T* dc = dctx + e * t * d + h * dh;
        T* dq = dqkv + e * t * 3 * d + h * dh;
        const std::size_t first = global_head(e, h) * t * t;
        const T* pv = p;
        if (dropping()) {
          el::dropout_row(p, dropped, t * t, stream, first, threshold_, keep_scale_);
          pv = dropped;
        }
        vit_detail::gemm_as<T>(compute_, CblasTrans, CblasNoTrans, t, dh, t, T(1), pv, t, dc, d, T(0), dq + 2 * d, 3 * d);
        vit_detail::gemm_as<T>(compute_, CblasNoTrans, CblasTrans, t, t, dh, T(1), dc, d, q + 2 * d, 3 * d, T(0), dp, t);
        if (dropping()) el::dropout_row(dp, dp, t * t, stream, first, threshold_, keep_scale_);
        el::softmax_backward_rows(p, dp, t, t);
        vit_detail::gemm_as<T>(compute_, CblasNoTrans, CblasNoTrans, t, dh, t, scale, dp, t, q + d, 3 * d, T(0), dq, 3 * d);
        vit_detail::gemm_as<T>(compute_, CblasTrans, CblasNoTrans, t, dh, t, scale, dp, t, q, 3 * d, T(0), dq + d, 3 * d);
      }
    }
  }

  std::size_t dim_, heads_, hidden_;  // heads and hidden units here (a shard's own)
  std::size_t width_;                 // heads_ * head width: dim_, or dim_ / p in a shard
  float dropout_;
  partrain::dtype compute_;
  std::uint32_t threshold_ = 0;
  T keep_scale_ = T(1);
  bool training_ = true;
  tp_shard tp_{};
  std::vector<vit_detail::param_t<T>> params_;
};

// Sequence parallelism's ends (tp_shard::sequence_parallel), each wrapping a replicated layer
// (not a layer of its own, which would move every later layer's index and so its dropout seed):
// - sequence_split<Embed>: the embedding's whole sequence [n, t, dim] (computed on every rank)
//   becomes this rank's tokens [n, t/p, dim]; backward all-gathers the slices' gradients, as
//   the embedding needs all of them;
// - sequence_gather<Head>: every rank's tokens become the whole sequence for the head; backward
//   takes this rank's slice of the head's input gradient (which every rank computed whole), after
//   gathering the input again (kept nowhere between the calls).
template <class Inner>
class sequence_split {
 public:
  sequence_split(Inner inner, std::size_t dim, tp_shard tp) : inner_(std::move(inner)), dim_(dim), tp_(tp) {
    vit_detail::check_sequence_group(tp_);
  }
  [[nodiscard]] shape output_shape(const shape& s) const {
    const shape whole = inner_.output_shape(s);
    vit_detail::check_sequence_split(whole[1], tp_.size);
    return {whole[0], whole[1] / tp_.size, dim_};
  }
  void forward(tensor_view<const float> x, tensor_view<float> y) {
    const shape out = output_shape(x.shape());
    cnn_detail::check_size("sequence_split::forward: the output", y.size(), out.numel());
    whole_.resize(out.numel() * tp_.size);
    inner_.forward(x, tensor_view<float>(whole_.data(), shape{out[0], out[1] * tp_.size, dim_}));
    vit_detail::slice_tokens(tp_, whole_.data(), y.data(), out[0], out[1], dim_);
  }
  void backward(tensor_view<const float> x, tensor_view<const float>, tensor_view<const float> gy, tensor_view<float> gx) {
    const shape out = output_shape(x.shape());
    cnn_detail::check_size("sequence_split::backward: the output gradient", gy.size(), out.numel());
    whole_.resize(out.numel() * tp_.size);
    vit_detail::all_gather_tokens(tp_, gy.data(), whole_.data(), out[0], out[1], dim_);
    const tensor_view<const float> g(whole_.data(), shape{out[0], out[1] * tp_.size, dim_});
    inner_.backward(x, g, g, gx);  // the embedding reads no output
  }
  [[nodiscard]] auto& parameters() noexcept { return inner_.parameters(); }

 private:
  Inner inner_;
  std::size_t dim_;
  tp_shard tp_;
  std::vector<float> whole_;
};

template <class Inner>
class sequence_gather {
 public:
  sequence_gather(Inner inner, std::size_t dim, tp_shard tp) : inner_(std::move(inner)), dim_(dim), tp_(tp) {
    vit_detail::check_sequence_group(tp_);
  }
  [[nodiscard]] shape output_shape(const shape& s) const {
    const vit_detail::token_batch b(s, dim_, "sequence_gather");
    return inner_.output_shape(shape{b.n, b.t * tp_.size, dim_});
  }
  void forward(tensor_view<const float> x, tensor_view<float> y) { inner_.forward(gather(x), y); }
  void backward(tensor_view<const float> x, tensor_view<const float> y, tensor_view<const float> gy, tensor_view<float> gx) {
    const tensor_view<const float> whole = gather(x);
    grad_.resize(whole.size());
    inner_.backward(whole, y, gy, tensor_view<float>(grad_.data(), whole.shape()));
    vit_detail::slice_tokens(tp_, grad_.data(), gx.data(), x.shape()[0], x.shape()[1], dim_);
  }
  [[nodiscard]] auto& parameters() noexcept { return inner_.parameters(); }

 private:
  tensor_view<const float> gather(tensor_view<const float> x) {
    const vit_detail::token_batch b(x.shape(), dim_, "sequence_gather");
    whole_.resize(x.size() * tp_.size);
    vit_detail::all_gather_tokens(tp_, x.data(), whole_.data(), b.n, b.t, dim_);
    return tensor_view<const float>(whole_.data(), shape{b.n, b.t * tp_.size, dim_});
  }
  Inner inner_;
  std::size_t dim_;
  tp_shard tp_;
  std::vector<float> whole_, grad_;
};

// The classifier on [n, tokens, dim]: the mean over tokens, a LayerNorm, a linear map to the
// classes: [n, classes] logits for softmax_cross_entropy. Keeps nothing: backward recomputes the
// pooled rows and their LayerNorm ([n, dim], cheap). Parameters: LN gamma, beta [dim]; W
// [classes, dim], b [classes].
template <class T>
class basic_vit_head {
 public:
  basic_vit_head(std::size_t dim, std::size_t classes, std::uint32_t seed,
                 partrain::dtype compute = partrain::dtype::float32)
      : dim_(dim), classes_(classes), compute_(compute) {
    vit_detail::check_compute("vit_head", compute_);
    if (dim_ == 0 || classes_ == 0) {
      throw invalid_argument_error("vit_head: dim " + std::to_string(dim_) + " to " + std::to_string(classes_) +
                                   " classes (expected both > 0)");
    }
    params_.emplace_back(shape{dim_});
    params_.emplace_back(shape{dim_});
    params_.emplace_back(shape{classes_, dim_});
    params_.emplace_back(shape{classes_});
    vit_detail::fill(params_[0].value(), T(1));
    std::mt19937 gen(seed);
    vit_detail::fill_uniform(gen, dim_, params_[2].value());
    vit_detail::fill_uniform(gen, dim_, params_[3].value());
  }

  [[nodiscard]] shape output_shape(const shape& s) const {
    return {vit_detail::token_batch(s, dim_, "vit_head").n, classes_};
  }

  void forward(tensor_view<const T> x, tensor_view<T> y) {
    const vit_detail::token_batch b(x.shape(), dim_, "vit_head");
    cnn_detail::check_size("vit_head::forward: the output", y.size(), b.n * classes_);
    T* normed = normalize(x.data(), b.n, b.t);
    vit_detail::gemm_as<T>(compute_, CblasNoTrans, CblasTrans, b.n, classes_, dim_, T(1), normed, dim_, params_[2].value().data(),
                        dim_, T(0), y.data(), classes_);
    for (std::size_t e = 0; e < b.n; ++e) vit_detail::el::add_bias_row(y.data() + e * classes_, params_[3].value().data(), classes_);
  }

  void backward(tensor_view<const T> x, tensor_view<const T>, tensor_view<const T> gy, tensor_view<T> gx) {
    namespace el = vit_detail::el;
    const vit_detail::token_batch b(x.shape(), dim_, "vit_head");
    cnn_detail::check_size("vit_head::backward: the output gradient", gy.size(), b.n * classes_);
    cnn_detail::check_size("vit_head::backward: the input gradient", gx.size(), x.size());
    T* normed = normalize(x.data(), b.n, b.t);
    const T* pooled = vit_detail::scratch<T>(0, b.n * dim_);
    const T* stats = vit_detail::scratch<T>(2, 2 * b.n);
    T* dnormed = vit_detail::scratch<T>(3, b.n * dim_);
    // grad W [classes, dim] += gy^T normed; dnormed = gy W
    vit_detail::gemm_as<T>(compute_, CblasTrans, CblasNoTrans, classes_, dim_, b.n, T(1), gy.data(), classes_, normed, dim_, T(1),
                        params_[2].grad().data(), dim_);
    vit_detail::gemm_as<T>(compute_, CblasNoTrans, CblasNoTrans, b.n, dim_, classes_, T(1), gy.data(), classes_,
                        params_[2].value().data(), dim_, T(0), dnormed, dim_);
    std::vector<double> sg(dim_, 0.0), sb(dim_, 0.0), sc(classes_, 0.0);
    T* dpooled = normed;  // normed is used up
    for (std::size_t e = 0; e < b.n; ++e) {
      el::add_row_to_sums(gy.data() + e * classes_, classes_, sc.data());
      const T* row = pooled + e * dim_;
      el::layernorm_param_grads(row, dnormed + e * dim_, dim_, stats[2 * e], stats[2 * e + 1], sg.data(), sb.data());
      el::layernorm_backward(row, dnormed + e * dim_, dim_, stats[2 * e], stats[2 * e + 1], params_[0].value().data(),
                             dpooled + e * dim_, false);
      // Each token had weight 1 / tokens in the mean.
      for (std::size_t t = 0; t < b.t; ++t) {
        for (std::size_t j = 0; j < dim_; ++j) gx[(e * b.t + t) * dim_ + j] = dpooled[e * dim_ + j] / static_cast<T>(b.t);
      }
    }
    vit_detail::add_sums(params_[0].grad(), sg);
    vit_detail::add_sums(params_[1].grad(), sb);
    vit_detail::add_sums(params_[3].grad(), sc);
  }

  [[nodiscard]] std::vector<vit_detail::param_t<T>>& parameters() noexcept { return params_; }

 private:
  // The mean over tokens (scratch 0), its LayerNorm statistics (scratch 2, mean and rstd per
  // example) and output (scratch 1, returned).
  T* normalize(const T* x, std::size_t n, std::size_t t) {
    T* pooled = vit_detail::scratch<T>(0, n * dim_);
    T* normed = vit_detail::scratch<T>(1, n * dim_);
    T* stats = vit_detail::scratch<T>(2, 2 * n);
    std::vector<double> sum(dim_);
    for (std::size_t e = 0; e < n; ++e) {
      std::ranges::fill(sum, 0.0);
      for (std::size_t k = 0; k < t; ++k) vit_detail::el::add_row_to_sums(x + (e * t + k) * dim_, dim_, sum.data());
      for (std::size_t j = 0; j < dim_; ++j) pooled[e * dim_ + j] = static_cast<T>(sum[j] / static_cast<double>(t));
      vit_detail::el::layernorm_stats(pooled + e * dim_, dim_, static_cast<T>(vit_detail::layernorm_eps), stats[2 * e],
                                      stats[2 * e + 1]);
      vit_detail::el::layernorm_apply(pooled + e * dim_, dim_, stats[2 * e], stats[2 * e + 1], params_[0].value().data(),
                                      params_[1].value().data(), normed + e * dim_);
    }
    return normed;
  }

  std::size_t dim_, classes_;
  partrain::dtype compute_;
  std::vector<vit_detail::param_t<T>> params_;
};

namespace vit_detail {

// A float layer of this file as a host layer that keeps nothing (the plain forward and backward).
template <class Impl>
class plain_layer final : public host_layer {
 public:
  using host_layer::backward;  // the saved-activation forms stay visible
  using host_layer::forward;
  template <class... A>
    requires std::constructible_from<Impl, A...>
  explicit plain_layer(A&&... a) : impl_(std::forward<A>(a)...) {}

  [[nodiscard]] shape output_shape(const shape& s) const override { return impl_.output_shape(s); }
  void forward(tensor_view<const float> in, tensor_view<float> out) override { impl_.forward(in, out); }
  void backward(tensor_view<const float> in, tensor_view<const float> out, tensor_view<const float> gout,
                tensor_view<float> gin) override {
    impl_.backward(in, out, gout, gin);
  }
  [[nodiscard]] std::vector<host_param>& parameters() override { return impl_.parameters(); }
  [[nodiscard]] std::unique_ptr<host_layer> clone() const override { return std::make_unique<plain_layer>(*this); }
  [[nodiscard]] Impl& impl() noexcept { return impl_; }

 private:
  Impl impl_;
};

// A float layer of this file that keeps activations, as a host_saving_layer (which supplies the
// plain forms: a backward through them recomputes the forward with seed 0).
template <class Impl>
class saving_layer final : public host_saving_layer {
 public:
  using host_saving_layer::backward;
  using host_saving_layer::forward;
  template <class... A>
    requires std::constructible_from<Impl, A...>
  explicit saving_layer(A&&... a) : impl_(std::forward<A>(a)...) {}

  [[nodiscard]] shape output_shape(const shape& s) const override { return impl_.output_shape(s); }
  [[nodiscard]] std::size_t saved_size(const shape& s) const override { return impl_.saved_size(s); }
  void forward(tensor_view<const float> in, tensor_view<float> out, const layer_call<>& call) override {
    impl_.forward(in, out, call.saved, call.seed);
  }
  void backward(tensor_view<const float> in, tensor_view<const float> out, const layer_call<>& call,
                tensor_view<const float> gout, tensor_view<float> gin) override {
    impl_.backward(in, out, call.saved, call.seed, gout, gin);
  }
  [[nodiscard]] std::vector<host_param>& parameters() override { return impl_.parameters(); }
  [[nodiscard]] std::unique_ptr<host_layer> clone() const override { return std::make_unique<saving_layer>(*this); }
  // Dropout on (training) or off: sequential's train(bool) and eval_step reach it through host_layer.
  void train(bool on) override { impl_.train(on); }
  [[nodiscard]] Impl& impl() noexcept { return impl_; }

 private:
  Impl impl_;
};

inline const vit_config& checked(const vit_config& c) {
  auto bad = [](const std::string& what) { throw invalid_argument_error("vit_config: " + what); };
  if (c.image == 0 || c.patch == 0 || c.image % c.patch != 0) {
    bad("patch " + std::to_string(c.patch) + " on a " + std::to_string(c.image) + "x" + std::to_string(c.image) +
        " image (expected a patch size > 0 that divides the image side)");
  }
  if (c.dim == 0 || c.heads == 0 || c.dim % c.heads != 0) {
    bad("dim " + std::to_string(c.dim) + " with " + std::to_string(c.heads) +
        " heads (expected heads > 0 dividing dim > 0)");
  }
  if (c.mlp_ratio == 0) bad("mlp_ratio 0 (expected >= 1)");
  if (c.classes == 0) bad("classes 0 (expected >= 1)");
  if (!(c.dropout >= 0.0f && c.dropout < 1.0f)) {
    bad("dropout " + std::to_string(c.dropout) + " (expected 0 <= dropout < 1)");
  }
  if (c.compute != partrain::dtype::float32 && c.compute != partrain::dtype::bfloat16) {
    bad("compute " + std::string(partrain::to_string(c.compute)) + " (expected float32 or bfloat16)");
  }
  return c;
}

}  // namespace vit_detail

using patch_embed = vit_detail::plain_layer<basic_patch_embed<float>>;
using transformer_block = vit_detail::saving_layer<basic_transformer_block<float>>;
using vit_head = vit_detail::plain_layer<basic_vit_head<float>>;
using split_patch_embed = vit_detail::plain_layer<sequence_split<basic_patch_embed<float>>>;
using gathered_vit_head = vit_detail::plain_layer<sequence_gather<basic_vit_head<float>>>;

// The ViT's layers in T: patch embedding (seed), depth blocks (seed + 1 + i), head (seed + 1 +
// depth). make_vit builds the float model from these; the gradient check builds the double one
// from the same seed and gets the same values.
template <class T>
struct basic_vit {
  basic_patch_embed<T> embed;
  std::vector<basic_transformer_block<T>> blocks;
  basic_vit_head<T> head;

  basic_vit(const vit_config& c, std::uint32_t seed)
      : embed(vit_detail::checked(c).image, c.patch, c.dim, seed, c.compute),
        head(c.dim, c.classes, seed + 1 + static_cast<std::uint32_t>(c.depth), c.compute) {
    for (std::size_t i = 0; i < c.depth; ++i) {
      blocks.emplace_back(c.dim, c.heads, c.mlp_ratio * c.dim, c.dropout, seed + 1 + static_cast<std::uint32_t>(i),
                          c.compute);
    }
  }
};

namespace vit_detail {

// make_vit's whole model, its layers as they are: the embedding, the blocks, the head.
struct vit_parts {
  patch_embed* embed;
  std::vector<transformer_block*> blocks;
  vit_head* head;
};
inline vit_parts parts_of(host_model& m, const vit_config& c, const char* where) {
  vit_parts out{m.empty() ? nullptr : dynamic_cast<patch_embed*>(m.front().get()), {},
                m.empty() ? nullptr : dynamic_cast<vit_head*>(m.back().get())};
  for (std::size_t i = 1; i + 1 < m.size(); ++i) out.blocks.push_back(dynamic_cast<transformer_block*>(m[i].get()));
  const bool ok = out.embed && out.head && out.blocks.size() == c.depth &&
                  std::ranges::none_of(out.blocks, [](auto* b) { return b == nullptr; });
  if (!ok) {
    throw invalid_argument_error(std::string(where) + ": expected make_vit's whole model (a patch_embed, " +
                                 std::to_string(c.depth) + " transformer_blocks, a vit_head), got " +
                                 std::to_string(m.size()) + " layers of other kinds");
  }
  return out;
}

}  // namespace vit_detail

// Rank tp.rank's shard of a whole ViT (make_vit's, e.g. loaded from an export): each block cut
// as make_vit cuts it, the embedding and the head copied (wrapped under sequence parallelism).
// `whole` is left as it was.
[[nodiscard]] inline host_model shard_vit(host_model& whole, const vit_config& c, tp_shard tp) {
  const vit_detail::vit_parts w = vit_detail::parts_of(whole, c, "shard_vit");
  const bool sp = tp.size > 1 && tp.sequence_parallel;
  if (sp) vit_detail::check_sequence_split((c.image / c.patch) * (c.image / c.patch), tp.size);  // before any batch
  host_model m;
  if (sp) {
    m.push_back(std::make_unique<split_patch_embed>(w.embed->impl(), c.dim, tp));
  } else {
    m.push_back(std::make_unique<patch_embed>(w.embed->impl()));
  }
  for (auto* b : w.blocks) {
    if (tp.size == 1) {
      m.push_back(std::make_unique<transformer_block>(b->impl()));
    } else {
      m.push_back(std::make_unique<transformer_block>(basic_transformer_block<float>(b->impl(), tp)));
    }
  }
  if (sp) {
    m.push_back(std::make_unique<gathered_vit_head>(w.head->impl(), c.dim, tp));
  } else {
    m.push_back(std::make_unique<vit_head>(w.head->impl()));
  }
  return m;
}

// [n, 784] grey images -> [n, 10] logits for softmax_cross_entropy: patch_embed, c.depth
// transformer_blocks, vit_head (c.depth + 2 layers). Sets OpenBLAS to one thread, as conv2d: the
// ranks (processes or threads) already use the cores. With a tp_shard: the same model as rank
// tp.rank of a tensor-parallel group, each block holding its share of the heads and hidden units
// (see basic_transformer_block); the patch embedding and the head are whole on every rank (they
// are 10% of the parameters and their work, and replicated they need no communication). Every
// rank of the group takes the same batch. With tp.sequence_parallel, the embedding hands each rank
// its slice of the tokens and the head gathers them (sequence_split, sequence_gather).
[[nodiscard]] inline host_model make_vit(const vit_config& c, std::uint32_t seed, tp_shard tp = {}) {
  openblas_set_num_threads(1);
  basic_vit<float> v(c, seed);
  host_model m;
  m.push_back(std::make_unique<patch_embed>(std::move(v.embed)));
  for (auto& b : v.blocks) m.push_back(std::make_unique<transformer_block>(std::move(b)));
  m.push_back(std::make_unique<vit_head>(std::move(v.head)));
  return tp.size == 1 ? std::move(m) : shard_vit(m, c, tp);
}

// Collective over the tensor-parallel group: the whole ViT from rank tp.rank's shard (make_vit's
// or shard_vit's, trained or not), every block's slices gathered; what an export of a
// tensor-parallel run writes, readable by a one-process run or shard_vit at another size.
[[nodiscard]] inline host_model gather_vit(host_model& shard, const vit_config& c, tp_shard tp) {
  host_model whole = make_vit(c, 0);
  const vit_detail::vit_parts w = vit_detail::parts_of(whole, c, "gather_vit");
  if (shard.size() != whole.size()) {
    throw invalid_argument_error("gather_vit: a shard of " + std::to_string(shard.size()) + " layers for a ViT of " +
                                 std::to_string(whole.size()));
  }
  auto copy_params = [](host_layer& from, host_layer& to) {
    auto& a = from.parameters();
    auto& b = to.parameters();
    for (std::size_t k = 0; k < a.size() && k < b.size(); ++k) {
      vit_detail::check_gathered_size(a[k].value().size(), b[k].value().size(), k);
      std::copy_n(a[k].value().data(), a[k].value().size(), b[k].value().data());
    }
  };
  copy_params(*shard.front(), *w.embed);
  copy_params(*shard.back(), *w.head);
  for (std::size_t i = 0; i < c.depth; ++i) {
    auto* b = dynamic_cast<transformer_block*>(shard[i + 1].get());
    if (!b) throw invalid_argument_error("gather_vit: layer " + std::to_string(i + 1) + " of the shard is not a transformer_block");
    if (tp.size == 1) {
      copy_params(*b, *w.blocks[i]);
    } else {
      b->impl().gather_into(w.blocks[i]->impl());
    }
  }
  return whole;
}

}  // namespace models::layers
