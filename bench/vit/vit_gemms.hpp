// bench/vit/vit_gemms.hpp: the GEMMs of one training step (forward and backward) of the example
// ViT (models/vit_layers.hpp), written out call by call from that file's code, and a replay that
// runs them alone on buffers laid out as the layers lay theirs out (same shapes, transposes,
// leading dimensions, offsets, alpha and beta). bench_vit times a step against its replay.
// models/vit_layers.hpp has no hook that reports its GEMMs, so the list is derived by hand: a
// change there (a new GEMM, a fused one) must be mirrored here. Checked once against the calls a
// real step makes (cblas_sgemm interposed; vit_config{}, batch 64): the same 6198 calls, shapes,
// transposes, leading dimensions, alpha, beta, and offsets into the same buffers.
#pragma once

#include <cmath>
#include <cstddef>
#include <string>
#include <utility>
#include <vector>

#include <cblas.h>

#include "vit_layers.hpp"

namespace partrain::bench::vit {

// One cblas_sgemm call, row-major; A, B and C are (buffer, offset) into the plan's buffers.
struct gemm_call {
  CBLAS_TRANSPOSE ta, tb;
  std::size_t m, n, k;
  float alpha;
  std::size_t a, a_off, lda;
  std::size_t b, b_off, ldb;
  float beta;
  std::size_t c, c_off, ldc;
};

struct gemm_plan {
  std::vector<std::string> buffer_names;
  std::vector<std::size_t> buffer_floats;  // the most each buffer is read or written at
  std::vector<gemm_call> calls;

  [[nodiscard]] double flops() const {
    double f = 0;
    for (const auto& c : calls) f += 2.0 * static_cast<double>(c.m) * static_cast<double>(c.n) * static_cast<double>(c.k);
    return f;
  }

  [[nodiscard]] std::size_t buffer(std::string name) {
    buffer_names.push_back(std::move(name));
    buffer_floats.push_back(0);
    return buffer_names.size() - 1;
  }
  // Appends a call and grows its buffers to cover what it touches (a row-major op(X) of r x c
  // stored with leading dimension ld spans (rows - 1) * ld + cols floats from its offset).
  void gemm(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, std::size_t m, std::size_t n, std::size_t k, float alpha,
            std::size_t a, std::size_t a_off, std::size_t lda, std::size_t b, std::size_t b_off, std::size_t ldb,
            float beta, std::size_t c, std::size_t c_off, std::size_t ldc) {
    calls.push_back({ta, tb, m, n, k, alpha, a, a_off, lda, b, b_off, ldb, beta, c, c_off, ldc});
    const auto cover = [&](std::size_t buf, std::size_t off, std::size_t rows, std::size_t cols, std::size_t ld) {
      const std::size_t end = off + (rows - 1) * ld + cols;
      if (buffer_floats[buf] < end) buffer_floats[buf] = end;
    };
    // Stored shapes: A is m x k (k x m transposed), B is k x n (n x k transposed), C is m x n.
    if (ta == CblasNoTrans) cover(a, a_off, m, k, lda); else cover(a, a_off, k, m, lda);
    if (tb == CblasNoTrans) cover(b, b_off, k, n, ldb); else cover(b, b_off, n, k, ldb);
    cover(c, c_off, m, n, ldc);
  }
};

// Every GEMM of sequential::train_step on the ViT of config c at `batch` examples, in the order
// the layers call them (no recomputation, no dropout: GEMMs are the same with either).
[[nodiscard]] inline gemm_plan vit_step_gemms(const models::layers::vit_config& c, std::size_t batch) {
  constexpr auto N = CblasNoTrans;
  constexpr auto T = CblasTrans;
  gemm_plan p;
  const std::size_t n = batch, grid = c.image / c.patch, t = grid * grid, d = c.dim, h = c.heads, dh = d / h;
  const std::size_t f = c.mlp_ratio * d, pp = c.patch * c.patch, m = n * t, classes = c.classes;
  const float scale = 1.0f / std::sqrt(static_cast<float>(dh));

  // The runner's buffers (sequential's layer outputs and its two gradient buffers), each layer's
  // parameters and gradients, and the per-thread scratch slots the layers share.
  // Scratch slots (vit_detail::scratch) are one buffer per slot and thread whatever the layer: 0
  // holds the patches and the blocks' LN outputs; 1 the patch gradients, GELU outputs and the
  // head's normed rows; 3 a block's branch gradient and the head's dnormed; 4 dctx, 5 dqkv, 7 dP.
  const std::size_t scratch0 = p.buffer("scratch 0"), scratch1 = p.buffer("scratch 1");
  const std::size_t scratch3 = p.buffer("scratch 3"), dctx = p.buffer("scratch 4 (dctx)");
  const std::size_t dqkv = p.buffer("scratch 5 (dqkv)"), dprobs = p.buffer("scratch 7 (dP)");
  const std::size_t patches = scratch0, ln_out = scratch0, gpatches = scratch1, gelu = scratch1, normed = scratch1;
  const std::size_t dbranch = scratch3, dnormed = scratch3;
  const std::size_t embed_w = p.buffer("patch_embed W"), embed_gw = p.buffer("patch_embed grad W");
  std::vector<std::size_t> outs;  // outs[0]: patch_embed's output, outs[i + 1]: block i's
  outs.push_back(p.buffer("patch_embed out"));
  struct block_buffers {
    std::size_t saved, w_qkv, w_proj, w_fc1, w_fc2, g_qkv, g_proj, g_fc1, g_fc2;
  };
  std::vector<block_buffers> blocks;
  for (std::size_t i = 0; i < c.depth; ++i) {
    const std::string b = "block " + std::to_string(i) + " ";
    blocks.push_back({p.buffer(b + "saved"), p.buffer(b + "qkv W"), p.buffer(b + "proj W"), p.buffer(b + "fc1 W"),
                      p.buffer(b + "fc2 W"), p.buffer(b + "grad qkv W"), p.buffer(b + "grad proj W"),
                      p.buffer(b + "grad fc1 W"), p.buffer(b + "grad fc2 W")});
    outs.push_back(p.buffer(b + "out"));
  }
  const std::size_t logits = p.buffer("logits"), head_w = p.buffer("head W"), head_gw = p.buffer("head grad W");
  const std::size_t grad_a = p.buffer("grad buffer a"), grad_b = p.buffer("grad buffer b");

  const models::layers::basic_transformer_block<float>::layout at(n, t, d, h, f);

  // ---- forward ----
  p.gemm(N, T, m, d, pp, 1, patches, 0, pp, embed_w, 0, pp, 0, outs[0], 0, d);
  for (std::size_t i = 0; i < c.depth; ++i) {
    const auto& b = blocks[i];
    p.gemm(N, T, m, 3 * d, d, 1, ln_out, 0, d, b.w_qkv, 0, d, 0, b.saved, at.qkv, 3 * d);  // qkv
    for (std::size_t e = 0; e < n; ++e) {
      for (std::size_t hh = 0; hh < h; ++hh) {
        const std::size_t q = at.qkv + e * t * 3 * d + hh * dh, pr = at.probs + (e * h + hh) * t * t;
        p.gemm(N, T, t, t, dh, 1, b.saved, q, 3 * d, b.saved, q + d, 3 * d, 0, b.saved, pr, t);  // q k^T
        p.gemm(N, N, t, dh, t, 1, b.saved, pr, t, b.saved, q + 2 * d, 3 * d, 0, b.saved, at.ctx + e * t * d + hh * dh, d);
      }
    }
    p.gemm(N, T, m, d, d, 1, b.saved, at.ctx, d, b.w_proj, 0, d, 0, outs[i + 1], 0, d);  // proj
    p.gemm(N, T, m, f, d, 1, ln_out, 0, d, b.w_fc1, 0, d, 0, b.saved, at.hidden, f);     // fc1
    p.gemm(N, T, m, d, f, 1, gelu, 0, f, b.w_fc2, 0, f, 0, outs[i + 1], 0, d);           // fc2
  }
  p.gemm(N, T, n, classes, d, 1, normed, 0, d, head_w, 0, d, 0, logits, 0, classes);

  // ---- backward: the loss writes grad_a; layer j reads g and writes the other buffer ----
  std::size_t g = grad_a, gx = grad_b;
  p.gemm(T, N, classes, d, n, 1, g, 0, classes, normed, 0, d, 1, head_gw, 0, d);
  p.gemm(N, N, n, d, classes, 1, g, 0, classes, head_w, 0, d, 0, dnormed, 0, d);
  std::swap(g, gx);
  for (std::size_t i = c.depth; i-- > 0;) {
    const auto& b = blocks[i];
    p.gemm(T, N, d, f, m, 1, g, 0, d, gelu, 0, f, 1, b.g_fc2, 0, f);  // fc2: grad W
    p.gemm(N, N, m, f, d, 1, g, 0, d, b.w_fc2, 0, f, 0, gelu, 0, f);  //      input grad
    p.gemm(T, N, f, d, m, 1, gelu, 0, f, ln_out, 0, d, 1, b.g_fc1, 0, d);
    p.gemm(N, N, m, d, f, 1, gelu, 0, f, b.w_fc1, 0, d, 0, dbranch, 0, d);
    p.gemm(T, N, d, d, m, 1, gx, 0, d, b.saved, at.ctx, d, 1, b.g_proj, 0, d);
    p.gemm(N, N, m, d, d, 1, gx, 0, d, b.w_proj, 0, d, 0, dctx, 0, d);
    for (std::size_t e = 0; e < n; ++e) {
      for (std::size_t hh = 0; hh < h; ++hh) {
        const std::size_t q = at.qkv + e * t * 3 * d + hh * dh, pr = at.probs + (e * h + hh) * t * t;
        const std::size_t dc = e * t * d + hh * dh, dq = e * t * 3 * d + hh * dh;
        p.gemm(T, N, t, dh, t, 1, b.saved, pr, t, dctx, dc, d, 0, dqkv, dq + 2 * d, 3 * d);  // dv
        p.gemm(N, T, t, t, dh, 1, dctx, dc, d, b.saved, q + 2 * d, 3 * d, 0, dprobs, 0, t);  // dP
        p.gemm(N, N, t, dh, t, scale, dprobs, 0, t, b.saved, q + d, 3 * d, 0, dqkv, dq, 3 * d);      // dq
        p.gemm(T, N, t, dh, t, scale, dprobs, 0, t, b.saved, q, 3 * d, 0, dqkv, dq + d, 3 * d);      // dk
      }
    }
    p.gemm(T, N, 3 * d, d, m, 1, dqkv, 0, 3 * d, ln_out, 0, d, 1, b.g_qkv, 0, d);
    p.gemm(N, N, m, d, 3 * d, 1, dqkv, 0, 3 * d, b.w_qkv, 0, d, 0, dbranch, 0, d);
    std::swap(g, gx);
  }
  p.gemm(T, N, d, pp, m, 1, g, 0, d, patches, 0, pp, 1, embed_gw, 0, pp);
  p.gemm(N, N, m, pp, d, 1, g, 0, d, embed_w, 0, pp, 0, gpatches, 0, pp);
  return p;
}

// The plan's calls alone, on buffers of its sizes (small values: no denormals, no overflow over
// repeated runs with beta 1).
class gemm_replay {
 public:
  explicit gemm_replay(gemm_plan plan) : plan_(std::move(plan)) {
    for (const std::size_t floats : plan_.buffer_floats) buffers_.emplace_back(floats, 1e-3f);
  }
  void run() {
    const auto i = [](std::size_t v) { return static_cast<blasint>(v); };
    for (const auto& c : plan_.calls) {
      cblas_sgemm(CblasRowMajor, c.ta, c.tb, i(c.m), i(c.n), i(c.k), c.alpha, buffers_[c.a].data() + c.a_off, i(c.lda),
                  buffers_[c.b].data() + c.b_off, i(c.ldb), c.beta, buffers_[c.c].data() + c.c_off, i(c.ldc));
    }
  }
  [[nodiscard]] const gemm_plan& plan() const noexcept { return plan_; }

 private:
  gemm_plan plan_;
  std::vector<std::vector<float>> buffers_;
};

}  // namespace partrain::bench::vit
