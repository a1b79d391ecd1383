// The CUDA optimizer and clipping paths against the host path on the same data (gpu label).
#include <catch2/catch.hpp>

#include <cuda_runtime.h>

#include <partrain/cuda/device_buffer.hpp>
#include <partrain/optim/adamw.hpp>
#include <partrain/optim/clip.hpp>
#include <partrain/optim/sgd.hpp>

#include <cmath>
#include <cstdio>
#include <vector>

#include "optim_test_models.hpp"
#include "toy_models.hpp"

using namespace partrain;

namespace {

// Parameters in device memory (partrain's device_buffer on GPU 0), filled from host vectors.
struct cuda_param {
  device_buffer<float> v, g;
  cuda_param(const std::vector<float>& hv, const std::vector<float>& hg) : v(hv.size(), 0), g(hg.size(), 0) {
    v.copy_from(tensor_view<const float>(hv.data(), hv.size()));
    g.copy_from(tensor_view<const float>(hg.data(), hg.size()));
  }
  tensor_view<float, partrain::cuda> value() { return v.view(); }
  tensor_view<float, partrain::cuda> grad() { return g.view(); }
  std::vector<float> host_values() const { return to_host(v); }
  std::vector<float> host_grads() const { return to_host(g); }

 private:
  static std::vector<float> to_host(const device_buffer<float>& b) {
    std::vector<float> h(b.size());
    b.copy_to(tensor_view<float>(h.data(), h.size()));
    return h;
  }
};

struct cuda_model {
  std::vector<cuda_param> params;
  std::vector<cuda_param>& parameters() { return params; }
};

struct pair_models {
  partrain::testing::manual_model<float> host;
  cuda_model dev;
  explicit pair_models(std::size_t n) {
    partrain::testing::toy_rng r(3);
    for (std::size_t sz : {n, std::size_t{7}}) {
      std::vector<float> v(sz), g(sz);
      for (auto& x : v) x = static_cast<float>(r.uniform());
      for (auto& x : g) x = static_cast<float>(r.uniform());
      host.params.push_back({v, g});
      dev.params.emplace_back(v, g);
    }
  }
  // The device fuses multiplies and adds (nvcc's default), the host does not: where an update
  // nearly cancels a parameter (values and gradients are in [0, 1)), the two differ by an ulp of
  // the terms, not of the result (seen on an H200), hence a margin at the terms' scale.
  void check_close(double tol, double margin) {
    for (std::size_t p = 0; p < host.params.size(); ++p) {
      const auto d = dev.params[p].host_values();
      std::size_t bad = 0;
      for (std::size_t i = 0; i < d.size(); ++i) bad += d[i] != Approx(host.params[p].v[i]).epsilon(tol).margin(margin);
      CAPTURE(p, d.size());
      CHECK(bad == 0);
    }
  }
};

}  // namespace

TEST_CASE("cuda sgd matches the host path", "[optim][cuda][gpu]") {
  pair_models m(5000);
  const sgd_options o{.lr = 0.1, .momentum = 0.9, .weight_decay = 0.01, .nesterov = true};
  sgd hs(m.host, o);
  sgd ds(m.dev, o);
  for (int i = 0; i < 5; ++i) {
    hs.step();
    ds.step();
  }
  m.check_close(1e-6, 2e-5);
}

TEST_CASE("cuda adamw matches the host path, and its state round-trips", "[optim][cuda][gpu]") {
  pair_models m(5000);
  adamw ha(m.host, {.lr = 0.01});
  adamw da(m.dev, {.lr = 0.01});
  for (int i = 0; i < 5; ++i) {
    ha.step();
    da.step();
  }
  m.check_close(1e-5, 1e-5);
  state_writer w;
  da.save_state(w);
  adamw db(m.dev, {.lr = 0.01});
  state_reader r(w.bytes());
  db.load_state(r);
  CHECK(db.steps() == 5);
  // The moments themselves came back: saving the loaded optimizer gives the same bytes, and
  // those bytes hold both moment arrays of every parameter (not just the step count).
  std::size_t moment_bytes = 0;
  for (auto&& p : m.dev.parameters()) moment_bytes += 2 * p.value().size() * sizeof(float);
  REQUIRE(moment_bytes > 0);
  CHECK(w.bytes().size() > moment_bytes);
  state_writer again;
  db.save_state(again);
  CHECK(again.bytes() == w.bytes());
  // And they are the moments of five real steps: a fresh optimizer's state differs.
  adamw fresh(m.dev, {.lr = 0.01});
  state_writer zero;
  fresh.save_state(zero);
  CHECK(zero.bytes() != w.bytes());
}

TEST_CASE("cuda clip_grad_norm matches the host path", "[optim][cuda][gpu]") {
  pair_models m(100000);
  const double hn = clip_grad_norm(m.host, 1.0);
  const double dn = clip_grad_norm(m.dev, 1.0);
  CHECK(dn == Approx(hn).epsilon(1e-12));
  const auto g = m.dev.params[0].host_grads();
  for (std::size_t i = 0; i < g.size(); i += 997) CHECK(g[i] == Approx(m.host.params[0].g[i]).epsilon(1e-6));
  sgd z(m.dev, {});
  z.zero_grad();
  CHECK(m.dev.params[1].host_grads() == std::vector<float>(7, 0.0f));
}
