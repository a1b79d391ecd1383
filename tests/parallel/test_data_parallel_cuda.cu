// data_parallel over CUDA devices (gpu label): the same equivalence as on the host. On a machine
// with one GPU the device list names it twice; each replica still gets its own stream and thread.
#include <catch2/catch.hpp>

#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <vector>

#include <partrain/cuda/device_buffer.hpp>
#include <partrain/parallel/data_parallel.hpp>

using namespace partrain;

namespace {

// gpu_main has already skipped (exit 77) when there is no device: here there is at least one.
int gpu_count() {
  int count = 0;
  REQUIRE(cudaGetDeviceCount(&count) == cudaSuccess);
  REQUIRE(count > 0);
  return count;
}

void ok(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
}

// Host data, [n, in] features and [n, out] targets; sliceable along the batch.
struct reg_batch {
  tensor_view<const float> x, y;
  [[nodiscard]] std::size_t size() const noexcept { return x.extent(0); }
  [[nodiscard]] reg_batch slice(std::size_t a, std::size_t b) const { return {x.slice(a, b), y.slice(a, b)}; }
};

__global__ void residual_kernel(const float* w, const float* b, const float* x, const float* y, float* r,
                                std::size_t n, std::size_t in, std::size_t out) {
  const std::size_t t = blockIdx.x * blockDim.x + threadIdx.x;
  if (t >= n * out) return;
  const std::size_t e = t / out, k = t % out;
  float a = b[k];
  for (std::size_t j = 0; j < in; ++j) a += w[k * in + j] * x[e * in + j];
  r[t] = a - y[t];
}

// d/dp of mean over n*out of r^2.
__global__ void grad_kernel(const float* x, const float* r, float* gw, float* gb, std::size_t n, std::size_t in,
                            std::size_t out) {
  const std::size_t t = blockIdx.x * blockDim.x + threadIdx.x;
  const float s = 2.0f / static_cast<float>(n * out);
  if (t < out * in) {
    const std::size_t k = t / in, j = t % in;
    float a = 0;
    for (std::size_t e = 0; e < n; ++e) a += r[e * out + k] * x[e * in + j];
    gw[t] = s * a;
  } else if (t < out * in + out) {
    const std::size_t k = t - out * in;
    float a = 0;
    for (std::size_t e = 0; e < n; ++e) a += r[e * out + k];
    gb[k] = s * a;
  }
}

__global__ void sgd_kernel(float* v, const float* g, float lr, std::size_t n) {
  const std::size_t t = blockIdx.x * blockDim.x + threadIdx.x;
  if (t < n) v[t] -= lr * g[t];
}

// n floats on device dev (partrain's device_buffer), seen as a raw pointer by the kernels.
struct device_array {
  device_buffer<float> buf;
  float* p;
  std::size_t n;
  device_array(std::size_t n_, int dev) : buf(n_, dev), p(buf.data()), n(n_) {}
};

// Linear regression on one GPU, its own stream; parameters are CUDA tensor views.
class cuda_linear {
 public:
  struct param {
    tensor_view<float, cuda> v, g;
    [[nodiscard]] tensor_view<float, cuda> value() const noexcept { return v; }
    [[nodiscard]] tensor_view<float, cuda> grad() const noexcept { return g; }
  };

  cuda_linear(std::size_t in, std::size_t out, int dev)
      : in_(in), out_(out), dev_(dev), w_(in * out, dev), b_(out, dev), gw_(in * out, dev), gb_(out, dev) {
    ok(cudaSetDevice(dev), "cudaSetDevice");
    ok(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
    std::vector<float> hw(in * out), hb(out, 0.1f);
    for (std::size_t i = 0; i < hw.size(); ++i) hw[i] = 0.01f * static_cast<float>((i * 7) % 13) - 0.06f;
    ok(cudaMemcpy(w_.p, hw.data(), hw.size() * sizeof(float), cudaMemcpyHostToDevice), "init w");
    ok(cudaMemcpy(b_.p, hb.data(), hb.size() * sizeof(float), cudaMemcpyHostToDevice), "init b");
    bind();
  }
  cuda_linear(cuda_linear&& o) noexcept
      : in_(o.in_), out_(o.out_), dev_(o.dev_), w_(std::move(o.w_)), b_(std::move(o.b_)), gw_(std::move(o.gw_)),
        gb_(std::move(o.gb_)), stream_(o.stream_) {
    o.stream_ = nullptr;
    bind();
  }
  ~cuda_linear() {
    if (stream_) cudaStreamDestroy(stream_);
  }

  std::vector<param>& parameters() { return params_; }

  [[nodiscard]] cuda_linear replicate_to(device d) const {
    cuda_linear m(in_, out_, d.index);
    ok(cudaMemcpy(m.w_.p, w_.p, w_.n * sizeof(float), cudaMemcpyDefault), "replicate w");
    ok(cudaMemcpy(m.b_.p, b_.p, b_.n * sizeof(float), cudaMemcpyDefault), "replicate b");
    return m;
  }

  double train_step(const reg_batch& bt) {
    ok(cudaSetDevice(dev_), "cudaSetDevice");
    const std::size_t n = bt.size();
    device_array x(n * in_, dev_), y(n * out_, dev_), r(n * out_, dev_);
    ok(cudaMemcpyAsync(x.p, bt.x.data(), x.n * sizeof(float), cudaMemcpyHostToDevice, stream_), "copy x");
    ok(cudaMemcpyAsync(y.p, bt.y.data(), y.n * sizeof(float), cudaMemcpyHostToDevice, stream_), "copy y");
    residual_kernel<<<static_cast<unsigned>((n * out_ + 127) / 128), 128, 0, stream_>>>(w_.p, b_.p, x.p, y.p, r.p, n,
                                                                                        in_, out_);
    grad_kernel<<<static_cast<unsigned>((in_ * out_ + out_ + 127) / 128), 128, 0, stream_>>>(x.p, r.p, gw_.p, gb_.p,
                                                                                             n, in_, out_);
    std::vector<float> hr(n * out_);
    ok(cudaMemcpyAsync(hr.data(), r.p, hr.size() * sizeof(float), cudaMemcpyDeviceToHost, stream_), "copy r");
    ok(cudaStreamSynchronize(stream_), "sync");
    double loss = 0;
    for (float v : hr) loss += static_cast<double>(v) * v;
    return loss / static_cast<double>(hr.size());
  }

  [[nodiscard]] std::vector<float> host_params() const {
    std::vector<float> h(w_.n + b_.n);
    ok(cudaMemcpy(h.data(), w_.p, w_.n * sizeof(float), cudaMemcpyDeviceToHost), "read w");
    ok(cudaMemcpy(h.data() + w_.n, b_.p, b_.n * sizeof(float), cudaMemcpyDeviceToHost), "read b");
    return h;
  }
  [[nodiscard]] int dev() const noexcept { return dev_; }

 private:
  void bind() {
    params_ = {param{{w_.p, shape{out_, in_}}, {gw_.p, shape{out_, in_}}}, param{{b_.p, out_}, {gb_.p, out_}}};
  }
  std::size_t in_, out_;
  int dev_;
  device_array w_, b_, gw_, gb_;
  cudaStream_t stream_ = nullptr;
  std::vector<param> params_;
};

struct cuda_sgd {
  cuda_linear* m;
  float lr;
  void step() {
    ok(cudaSetDevice(m->dev()), "cudaSetDevice");
    for (auto& p : m->parameters()) {
      sgd_kernel<<<static_cast<unsigned>((p.v.size() + 127) / 128), 128>>>(p.v.data(), p.g.data(), lr, p.v.size());
    }
    ok(cudaDeviceSynchronize(), "sgd");
  }
};

}  // namespace

TEST_CASE("data_parallel over CUDA devices equals one device on the whole batch", "[parallel][dp][gpu]") {
  const int count = gpu_count();
  constexpr std::size_t in = 16, out = 3, n = 600;
  std::vector<float> x(n * in), y(n * out);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>((i * 37) % 101) / 101.0f - 0.5f;
  for (std::size_t i = 0; i < y.size(); ++i) y[i] = static_cast<float>((i * 11) % 23) / 23.0f;
  auto rows = [&](std::size_t first, std::size_t m) {
    return reg_batch{tensor_view<const float>(x.data() + first * in, shape{m, in}),
                     tensor_view<const float>(y.data() + first * out, shape{m, out})};
  };
  constexpr float lr = 0.1f;

  cuda_linear single(in, out, 0);
  cuda_sgd single_opt{&single, lr};
  for (std::size_t s = 0; s < 20; ++s) {
    (void)single.train_step(rows(s * 25, 25));
    single_opt.step();
  }
  const auto ref = single.host_params();

  // Two or three replicas: distinct GPUs where there are several, else the same GPU named again.
  for (std::size_t ndev : {2u, 3u}) {
    CAPTURE(ndev);
    std::vector<device> devs;
    for (std::size_t i = 0; i < ndev; ++i) devs.push_back(device::cuda(static_cast<int>(i) % count));
    cuda_linear model(in, out, 0);
    data_parallel dp(model, devs, [&](cuda_linear& r) { return cuda_sgd{&r, lr}; });
    for (std::size_t s = 0; s < 20; ++s) (void)dp.train_step(rows(s * 25, 25));  // 25: uneven for 2 and 3
    const auto got = model.host_params();
    double num = 0, den = 0;
    for (std::size_t i = 0; i < got.size(); ++i) {
      num = std::max(num, std::abs(static_cast<double>(got[i]) - ref[i]));
      den = std::max(den, std::abs(static_cast<double>(ref[i])));
    }
    CHECK(num / den < 1e-5);
    for (std::size_t i = 1; i < ndev; ++i) CHECK(dp.replica(i).host_params() == got);
  }
}
