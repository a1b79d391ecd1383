// models/cnn_layers.hpp: a small convolutional network as stage-able host layers, beside the MLP's
// in mlp_layers.hpp (same base, parameters and loss): conv2d (3x3, stride 1, padding 1; im2col and
// OpenBLAS GEMMs), maxpool2d (2x2, stride 2), flatten, and a Fashion-MNIST CNN factory.
// Images are NCHW; a layer also takes a rank-2 [n, C*H*W] batch (what the data loader gives).
#pragma once

#include <algorithm>
#include <array>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <cblas.h>

#include <partrain/core/error.hpp>
#include <partrain/core/tensor_view.hpp>

#include "mlp_layers.hpp"

namespace models::layers {

namespace cnn_detail {

// Checks that s is [n, c*h*w] or [n, c, h, w] and returns n; `layer` names the layer in the message.
inline std::size_t image_batch(const shape& s, std::size_t c, std::size_t h, std::size_t w, const char* layer) {
  const bool ok = (s.rank() == 2 && s[1] == c * h * w) || (s.rank() == 4 && s[1] == c && s[2] == h && s[3] == w);
  if (!ok) {
    throw invalid_argument_error(std::string(layer) + ": input shape " + s.to_string() + ", expected [batch, " +
                                 std::to_string(c * h * w) + "] or [batch, " + std::to_string(c) + ", " +
                                 std::to_string(h) + ", " + std::to_string(w) + "]");
  }
  return s[0];
}

inline void check_size(const char* what, std::size_t got, std::size_t expected) {
  if (got != expected) {
    throw invalid_argument_error(std::string(what) + " has " + std::to_string(got) + " elements, expected " +
                                 std::to_string(expected));
  }
}

// Per-thread scratch, grown on demand and reused by every later call on this thread: the layers
// keep no per-batch state, and one thread runs one layer call at a time.
inline float* scratch(std::size_t slot, std::size_t n) {
  thread_local std::array<std::vector<float>, 3> buffers;
  auto& b = buffers[slot];
  if (b.size() < n) b.resize(n);
  return b.data();
}

// Element loops in blocks of 16 and a scalar tail: g++ -O2 vectorizes a loop only when no
// remainder is left over, which a fixed 16 guarantees.
inline constexpr std::size_t block = 16;

// d[i] += s[i]
inline void add(float* __restrict d, const float* __restrict s, std::size_t n) noexcept {
  std::size_t i = 0;
  for (; i + block <= n; i += block) {
    for (std::size_t j = 0; j < block; ++j) d[i + j] += s[i + j];
  }
  for (; i < n; ++i) d[i] += s[i];
}

// d[i] = s[i] + b
inline void add_scalar(float* __restrict d, const float* __restrict s, float b, std::size_t n) noexcept {
  std::size_t i = 0;
  for (; i + block <= n; i += block) {
    for (std::size_t j = 0; j < block; ++j) d[i + j] = s[i + j] + b;
  }
  for (; i < n; ++i) d[i] = s[i] + b;
}

// The sum of s[0..n), in 16 interleaved partial sums (a fixed order: the same bits every run).
inline float sum(const float* s, std::size_t n) noexcept {
  float part[block] = {};
  std::size_t i = 0;
  for (; i + block <= n; i += block) {
    for (std::size_t j = 0; j < block; ++j) part[j] += s[i + j];
  }
  float total = 0.0f;
  for (const float v : part) total += v;
  for (; i < n; ++i) total += s[i];
  return total;
}

// The rows [y0, y1) of the output that kernel row ky reads inside the image (the others read the
// zero padding).
struct valid_rows {
  std::size_t y0, y1;
  valid_rows(std::size_t ky, std::size_t h) noexcept : y0(ky == 0 ? 1 : 0), y1(ky == 2 ? h - 1 : h) {
    if (y1 < y0) y1 = y0;  // h == 1: nothing valid for ky 0 and 2
  }
};

// One image x [c, h, w] into columns col[(c*3 + ky)*3 + kx][y*w + x] = x[c][y+ky-1][x+kx-1] (0
// outside), rows ld floats apart (ld > h*w when several images share the matrix side by side).
// Within a column row, the valid part is one shifted contiguous run of the image: copied whole,
// then the entries that wrapped around from the neighbouring image row are set to the padding.
inline void im2col(const float* x, std::size_t c, std::size_t h, std::size_t w, float* col, std::size_t ld) {
  const std::size_t hw = h * w;
  for (std::size_t ci = 0; ci < c; ++ci) {
    const float* img = x + ci * hw;
    for (std::size_t ky = 0; ky < 3; ++ky) {
      const valid_rows r(ky, h);
      const std::size_t first = r.y0 * w, last = r.y1 * w;
      // For p in [first, last), d[p] reads img[p + (ky-1)*w + kx-1] (but where x + kx-1 leaves the row).
      for (std::size_t kx = 0; kx < 3; ++kx) {
        float* d = col + ((ci * 3 + ky) * 3 + kx) * ld;
        std::fill(d, d + first, 0.0f);
        std::fill(d + last, d + hw, 0.0f);
        if (first == last) continue;
        const float* s = img + (r.y0 + ky - 1) * w;  // the image row under output row y0, kx = 1
        if (kx == 1) {
          std::copy(s, s + (last - first), d + first);
        } else if (kx == 0) {
          std::copy(s, s + (last - first - 1), d + first + 1);
          for (std::size_t y = r.y0; y < r.y1; ++y) d[y * w] = 0.0f;
        } else {
          std::copy(s + 1, s + (last - first), d + first);
          for (std::size_t y = r.y0; y < r.y1; ++y) d[y * w + w - 1] = 0.0f;
        }
      }
    }
  }
}

// The adjoint of im2col: gx [c, h, w] = the sum of every column entry that read each element
// (gx is zeroed first). Sets col's entries that read the left or right padding to 0, so that each
// shifted run can be added whole.
inline void col2im(float* col, std::size_t ld, std::size_t c, std::size_t h, std::size_t w, float* gx) {
  const std::size_t hw = h * w;
  std::fill(gx, gx + c * hw, 0.0f);
  for (std::size_t ci = 0; ci < c; ++ci) {
    float* img = gx + ci * hw;
    for (std::size_t ky = 0; ky < 3; ++ky) {
      const valid_rows r(ky, h);
      const std::size_t first = r.y0 * w, last = r.y1 * w;
      if (first == last) continue;
      float* d = img + (r.y0 + ky - 1) * w;
      for (std::size_t kx = 0; kx < 3; ++kx) {
        float* s = col + ((ci * 3 + ky) * 3 + kx) * ld;
        if (kx == 1) {
          add(d, s + first, last - first);
        } else if (kx == 0) {
          for (std::size_t y = r.y0; y < r.y1; ++y) s[y * w] = 0.0f;
          add(d, s + first + 1, last - first - 1);
        } else {
          for (std::size_t y = r.y0; y < r.y1; ++y) s[y * w + w - 1] = 0.0f;
          add(d + 1, s + first, last - first - 1);
        }
      }
    }
  }
}

}  // namespace cnn_detail

// 3x3 convolution, stride 1, padding 1: [n, in_c, h, w] -> [n, out_c, h, w]. Weights
// [out_c, in_c*3*3] (PyTorch's [out_c, in_c, 3, 3] flattened) and bias [out_c], initialised as a
// linear layer of fan-in in_c*9. Several images at a time go through one GEMM over their
// side-by-side im2col columns: with one GEMM per image the 1-channel layer took 1.5x as long.
class conv2d final : public host_layer {
 public:
  using host_layer::backward;  // the saved-activation forms stay visible
  using host_layer::forward;
  conv2d(std::size_t in_channels, std::size_t out_channels, std::size_t height, std::size_t width, std::uint32_t seed)
      : c_(in_channels), m_(out_channels), h_(height), w_(width) {
    if (c_ == 0 || m_ == 0 || h_ == 0 || w_ == 0) {
      throw invalid_argument_error("conv2d: " + std::to_string(c_) + " -> " + std::to_string(m_) + " channels on " +
                                   std::to_string(h_) + "x" + std::to_string(w_) + " (expected every size > 0)");
    }
    // One BLAS thread per rank, as mlp_host: the ranks (processes or threads) already use the cores.
    openblas_set_num_threads(1);
    params_.emplace_back(shape{m_, c_ * 9});
    params_.emplace_back(shape{m_});
    init_linear(c_ * 9, seed, params_[0].v.view(), params_[1].v.view());
  }

  [[nodiscard]] shape output_shape(const shape& s) const override {
    return {cnn_detail::image_batch(s, c_, h_, w_, "conv2d"), m_, h_, w_};
  }

  void forward(tensor_view<const float> x, tensor_view<float> y) override {
    const auto n = output_shape(x.shape())[0];
    const std::size_t hw = h_ * w_, k = c_ * 9;
    cnn_detail::check_size("conv2d::forward: the output", y.size(), n * m_ * hw);
    const float* wt = params_[0].value().data();  // value(), not v: the storage may be bound elsewhere
    const float* b = params_[1].value().data();
    const std::size_t per = images_per_gemm();
    float* col = cnn_detail::scratch(0, k * per * hw);
    float* out = cnn_detail::scratch(1, m_ * per * hw);
    for (std::size_t first = 0; first < n; first += per) {
      const std::size_t count = std::min(per, n - first), ld = count * hw;
      for (std::size_t e = 0; e < count; ++e) cnn_detail::im2col(x.data() + (first + e) * c_ * hw, c_, h_, w_, col + e * hw, ld);
      // out [m, count*hw] = W [m, k] x col [k, count*hw]
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, static_cast<int>(m_), static_cast<int>(ld),
                  static_cast<int>(k), 1.0f, wt, static_cast<int>(k), col, static_cast<int>(ld), 0.0f, out,
                  static_cast<int>(ld));
      for (std::size_t e = 0; e < count; ++e) {
        for (std::size_t o = 0; o < m_; ++o) {
          cnn_detail::add_scalar(y.data() + ((first + e) * m_ + o) * hw, out + o * ld + e * hw, b[o], hw);
        }
      }
    }
  }

  void backward(tensor_view<const float> x, tensor_view<const float>, tensor_view<const float> gy,
                tensor_view<float> gx) override {
    const auto n = output_shape(x.shape())[0];
    const std::size_t hw = h_ * w_, k = c_ * 9;
    cnn_detail::check_size("conv2d::backward: the output gradient", gy.size(), n * m_ * hw);
    cnn_detail::check_size("conv2d::backward: the input gradient", gx.size(), x.size());
    const float* wt = params_[0].value().data();
    float* gw = params_[0].grad().data();
    float* gb = params_[1].grad().data();
    const std::size_t per = images_per_gemm();
    float* col = cnn_detail::scratch(0, k * per * hw);
    float* g = cnn_detail::scratch(1, m_ * per * hw);
    float* gcol = cnn_detail::scratch(2, k * per * hw);
    // The bias sums: float within an image's plane, double across planes (cheap, and the result
    // barely depends on how the batch was cut).
    std::vector<double> sb(m_, 0.0);
    for (std::size_t first = 0; first < n; first += per) {
      const std::size_t count = std::min(per, n - first), ld = count * hw;
      for (std::size_t e = 0; e < count; ++e) {
        cnn_detail::im2col(x.data() + (first + e) * c_ * hw, c_, h_, w_, col + e * hw, ld);
        for (std::size_t o = 0; o < m_; ++o) {
          const float* s = gy.data() + ((first + e) * m_ + o) * hw;
          std::copy(s, s + hw, g + o * ld + e * hw);
          sb[o] += cnn_detail::sum(s, hw);
        }
      }
      // grad W [m, k] += g [m, count*hw] x col^T
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(m_), static_cast<int>(k),
                  static_cast<int>(ld), 1.0f, g, static_cast<int>(ld), col, static_cast<int>(ld), 1.0f, gw,
                  static_cast<int>(k));
      // gcol [k, count*hw] = W^T x g
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, static_cast<int>(k), static_cast<int>(ld),
                  static_cast<int>(m_), 1.0f, wt, static_cast<int>(k), g, static_cast<int>(ld), 0.0f, gcol,
                  static_cast<int>(ld));
      for (std::size_t e = 0; e < count; ++e) {
        cnn_detail::col2im(gcol + e * hw, ld, c_, h_, w_, gx.data() + (first + e) * c_ * hw);
      }
    }
    for (std::size_t o = 0; o < m_; ++o) gb[o] += static_cast<float>(sb[o]);
  }

  [[nodiscard]] std::vector<host_param>& parameters() override { return params_; }
  [[nodiscard]] std::unique_ptr<host_layer> clone() const override { return std::make_unique<conv2d>(*this); }

 private:
  // Images per GEMM: their im2col columns take about 1 MiB (the scratch stays that small for a
  // large evaluation batch too).
  [[nodiscard]] std::size_t images_per_gemm() const noexcept {
    return std::max<std::size_t>(1, (std::size_t{1} << 18) / (c_ * 9 * h_ * w_));
  }

  std::size_t c_, m_, h_, w_;
  std::vector<host_param> params_;
};

// 2x2 max pooling, stride 2: [n, c, h, w] -> [n, c, h/2, w/2]. Of equal values in a window the
// first in row-major order wins, in forward and backward alike (backward recomputes it from the
// input: the layer keeps nothing between the two).
class maxpool2d final : public host_layer {
 public:
  using host_layer::backward;  // the saved-activation forms stay visible
  using host_layer::forward;
  maxpool2d(std::size_t channels, std::size_t height, std::size_t width) : c_(channels), h_(height), w_(width) {
    if (c_ == 0 || h_ == 0 || w_ == 0 || h_ % 2 != 0 || w_ % 2 != 0) {
      throw invalid_argument_error("maxpool2d: " + std::to_string(c_) + " channels of " + std::to_string(h_) + "x" +
                                   std::to_string(w_) + " (expected channels > 0 and an even height and width > 0)");
    }
  }

  [[nodiscard]] shape output_shape(const shape& s) const override {
    return {cnn_detail::image_batch(s, c_, h_, w_, "maxpool2d"), c_, h_ / 2, w_ / 2};
  }

  void forward(tensor_view<const float> x, tensor_view<float> y) override {
    const auto n = output_shape(x.shape())[0];
    const std::size_t oh = h_ / 2, ow = w_ / 2;
    cnn_detail::check_size("maxpool2d::forward: the output", y.size(), n * c_ * oh * ow);
    for (std::size_t plane = 0; plane < n * c_; ++plane) {
      const float* src = x.data() + plane * h_ * w_;
      float* dst = y.data() + plane * oh * ow;
      for (std::size_t oy = 0; oy < oh; ++oy) {
        const float* top = src + 2 * oy * w_;
        const float* bottom = top + w_;
        for (std::size_t ox = 0; ox < ow; ++ox) {
          dst[oy * ow + ox] = pick(top[2 * ox], top[2 * ox + 1], bottom[2 * ox], bottom[2 * ox + 1]).value;
        }
      }
    }
  }

  void backward(tensor_view<const float> x, tensor_view<const float>, tensor_view<const float> gy,
                tensor_view<float> gx) override {
    const auto n = output_shape(x.shape())[0];
    const std::size_t oh = h_ / 2, ow = w_ / 2;
    cnn_detail::check_size("maxpool2d::backward: the output gradient", gy.size(), n * c_ * oh * ow);
    cnn_detail::check_size("maxpool2d::backward: the input gradient", gx.size(), x.size());
    // The windows tile the input: every element of gx is written once.
    for (std::size_t plane = 0; plane < n * c_; ++plane) {
      const float* src = x.data() + plane * h_ * w_;
      const float* g = gy.data() + plane * oh * ow;
      float* dst = gx.data() + plane * h_ * w_;
      for (std::size_t oy = 0; oy < oh; ++oy) {
        const float* top = src + 2 * oy * w_;
        const float* bottom = top + w_;
        float* gtop = dst + 2 * oy * w_;
        float* gbottom = gtop + w_;
        for (std::size_t ox = 0; ox < ow; ++ox) {
          const auto p = pick(top[2 * ox], top[2 * ox + 1], bottom[2 * ox], bottom[2 * ox + 1]);
          const float v = g[oy * ow + ox];
          gtop[2 * ox] = keep_if(v, !p.lower & !p.right);
          gtop[2 * ox + 1] = keep_if(v, !p.lower & p.right);
          gbottom[2 * ox] = keep_if(v, p.lower & !p.right);
          gbottom[2 * ox + 1] = keep_if(v, p.lower & p.right);
        }
      }
    }
  }

  [[nodiscard]] std::vector<host_param>& parameters() override { return none_; }
  [[nodiscard]] std::unique_ptr<host_layer> clone() const override { return std::make_unique<maxpool2d>(*this); }

 private:
  // A 2x2 window's maximum and where it is, the first of equal values winning (strict >: the top
  // row before the bottom one, left before right). Selects, not branches: ReLU outputs are full of
  // ties and near-ties a branch predictor would miss.
  struct window_max {
    float value;
    bool lower, right;
  };
  [[nodiscard]] static window_max pick(float a, float b, float c, float d) noexcept {
    const bool top_right = b > a, bottom_right = d > c;
    const float top = top_right ? b : a, bottom = bottom_right ? d : c;
    const bool lower = bottom > top;
    const bool right = static_cast<bool>((lower & bottom_right) | (!lower & top_right));  // no branch
    return {lower ? bottom : top, lower, right};
  }
  // v where k, else 0, by a mask (g++ turns `k ? v : 0.0f` stored to memory into a branch).
  [[nodiscard]] static float keep_if(float v, bool k) noexcept {
    return std::bit_cast<float>(std::bit_cast<std::uint32_t>(v) & (0u - static_cast<std::uint32_t>(k)));
  }

  std::size_t c_, h_, w_;
  std::vector<host_param> none_;
};

// [n, d1, d2, ...] -> [n, d1*d2*...]: the same elements, copied.
class flatten final : public host_layer {
 public:
  using host_layer::backward;  // the saved-activation forms stay visible
  using host_layer::forward;
  [[nodiscard]] shape output_shape(const shape& s) const override {
    if (s.rank() < 1) throw invalid_argument_error("flatten: input shape " + s.to_string() + ", expected [batch, ...]");
    return {s[0], s.row_numel()};
  }
  void forward(tensor_view<const float> x, tensor_view<float> y) override {
    cnn_detail::check_size("flatten::forward: the output", y.size(), x.size());
    std::copy(x.begin(), x.end(), y.begin());
  }
  void backward(tensor_view<const float> x, tensor_view<const float>, tensor_view<const float> gy,
                tensor_view<float> gx) override {
    cnn_detail::check_size("flatten::backward: the output gradient", gy.size(), x.size());
    cnn_detail::check_size("flatten::backward: the input gradient", gx.size(), x.size());
    std::copy(gy.begin(), gy.end(), gx.begin());
  }
  [[nodiscard]] std::vector<host_param>& parameters() override { return none_; }
  [[nodiscard]] std::unique_ptr<host_layer> clone() const override { return std::make_unique<flatten>(); }

 private:
  std::vector<host_param> none_;
};

// For 28x28 grey images ([n, 784]) in 10 classes: conv 1->8, relu, maxpool (8x14x14), conv 8->16,
// relu, maxpool (16x7x7), flatten, linear 784->10. Layer i with weights is seeded seed + i.
[[nodiscard]] inline host_model make_cnn(std::uint32_t seed) {
  host_model m;
  m.push_back(std::make_unique<conv2d>(1, 8, 28, 28, seed));
  m.push_back(std::make_unique<relu>());
  m.push_back(std::make_unique<maxpool2d>(8, 28, 28));
  m.push_back(std::make_unique<conv2d>(8, 16, 14, 14, seed + 1));
  m.push_back(std::make_unique<relu>());
  m.push_back(std::make_unique<maxpool2d>(16, 14, 14));
  m.push_back(std::make_unique<flatten>());
  m.push_back(std::make_unique<linear>(16 * 7 * 7, 10, seed + 2));
  return m;
}

}  // namespace models::layers
