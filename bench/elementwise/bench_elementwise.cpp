// bench_elementwise: the host element-wise paths of a training step against memcpy of the same
// bytes, on the example MLP's parameters (235,146 floats: what one rank touches every step).
//   GB/s = bytes read + bytes written / time.
// Two references per row: a memcpy that moves as many bytes as the row (B/2 bytes copied for a row
// that reads and writes B), so a row whose buffers outgrow a cache level meets a copy that does
// too; and memcpy of one parameter-sized buffer (2 x 4N bytes for N floats), which stays in a 2 MB
// L2 here and so is the pace of the rows that fit.
// Rows: SGD (plain, momentum), AdamW, clipping (norm + scale), the grad scaler's unscale and
// finite check, fp32 <-> fp16/bf16 casts, DDP's bucket division and no_sync accumulation.
// Each row is the median of alternating rounds (row, its memcpy, row, ...), then the one-buffer
// memcpy alternated with the row the same way.
// A second table (where the build found Thrust: PARTRAIN_THRUST_HOST) runs the same element
// functors through Thrust's sequential host system, the calls the CUDA path makes and the CPU
// tier runs, alternated with the host loop the training paths use: time of Thrust / time of the
// loop per row, summary key thrust_host_vs_loop (the largest).
//   bench_elementwise [--quick] [--params N]   (N floats instead of the MLP's layout)
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include <partrain/core/for_each_index.hpp>
#if defined(PARTRAIN_THRUST_HOST)
#include <partrain/core/detail/thrust_index.hpp>
#endif
#include <partrain/optim/adamw.hpp>
#include <partrain/optim/clip.hpp>
#include <partrain/optim/detail/elements.hpp>
#include <partrain/optim/sgd.hpp>
#include <partrain/parallel/detail/ddp_elements.hpp>
#include <partrain/precision/detail/elements.hpp>
#include <partrain/precision/cast.hpp>
#include <partrain/precision/grad_scaler.hpp>

#include "mlp_host.hpp"

namespace {

using namespace partrain;
using clk = std::chrono::steady_clock;

struct plan {
  int calls = 200;
  int rounds = 7;
};

// Median seconds per call of f over rounds, with memcpy's rounds alternating.
std::pair<double, double> time_against(const plan& p, const std::function<void()>& f, const std::function<void()>& copy) {
  std::vector<double> tf, tc;
  f();
  copy();
  auto round = [&](const std::function<void()>& g) {
    const auto t0 = clk::now();
    for (int i = 0; i < p.calls; ++i) g();
    return std::chrono::duration<double>(clk::now() - t0).count() / p.calls;
  };
  for (int r = 0; r < p.rounds; ++r) {
    tf.push_back(round(f));
    tc.push_back(round(copy));
  }
  std::nth_element(tf.begin(), tf.begin() + p.rounds / 2, tf.end());
  std::nth_element(tc.begin(), tc.begin() + p.rounds / 2, tc.end());
  return {tf[static_cast<std::size_t>(p.rounds / 2)], tc[static_cast<std::size_t>(p.rounds / 2)]};
}

#if defined(PARTRAIN_THRUST_HOST)
// The same functor through both host loops, alternated; prints a row, returns Thrust / loop.
template <class Run>
double thrust_row(const plan& p, const char* name, const Run& run) {
  const auto [thrust_t, loop_t] = time_against(p, [&] { run(detail::thrust_host_exec{}); }, [&] { run(detail::host_exec{}); });
  std::printf("%-26s %12.1f %12.1f %10.3f\n", name, loop_t * 1e6, thrust_t * 1e6, thrust_t / loop_t);
  return thrust_t / loop_t;
}

// The element functors of the optimizers, clipping, the scaler, the casts and DDP's buckets over
// n floats, through Thrust's host system and through the host loop. Returns the largest ratio.
double thrust_rows(const plan& p, std::size_t n) {
  std::vector<float> v(n, 1.0f), g(n, 1e-3f), m(n, 0.0f), s(n, 0.0f), acc(n, 0.5f);
  std::vector<partrain::bfloat16> low(n);
  const detail::optim::sgd_coeffs<float> sc{1e-6f, 0.9f, 1.0f, 0.0f, false, true, false};
  const detail::optim::adamw_coeffs<float> ac{1.0f, 0.1f, 0.9f, 0.999f, 0.001f, 1.0f, 1e-8f, -1e-6f};
  volatile double sink = 0;
  std::printf("\nthe same functors through Thrust's host system (the CPU tier's calls) and the host loop\n");
  std::printf("%-26s %12s %12s %10s\n", "functor", "loop_us", "thrust_us", "thrust/loop");
  double worst = 0;
  auto row = [&](const char* name, const auto& run) { worst = std::max(worst, thrust_row(p, name, run)); };
  row("sgd momentum", [&](auto exec) {
    detail::for_each_index(exec, n, detail::optim::sgd_update_fn<float>{v.data(), g.data(), m.data(), sc, false});
  });
  row("adamw", [&](auto exec) {
    detail::for_each_index(exec, n, detail::optim::adamw_update_fn<float>{v.data(), g.data(), m.data(), s.data(), ac});
  });
  row("sum of squares (double)", [&](auto exec) {
    sink = sink + detail::transform_reduce_index(exec, n, 0.0, detail::optim::square_as_double_fn<float>{g.data()},
                                                 detail::plus_fn{});
  });
  row("unscale + finite check", [&](auto exec) {
    sink = sink + detail::transform_reduce_index(exec, n, 0, detail::amp::unscale_check_fn{g.data(), 1.0f},
                                                 detail::bit_or_fn{});
  });
  row("cast fp32 -> bf16", [&](auto exec) {
    detail::for_each_index(exec, n, detail::amp::cast_fn<float, partrain::bfloat16>{v.data(), low.data()});
  });
  row("ddp accumulate", [&](auto exec) {
    detail::for_each_index(exec, n, detail::ddp::accumulate_fn<float>{acc.data(), g.data()});
  });
  return worst;
}
#endif

}  // namespace

int main(int argc, char** argv) {
  plan p;
  std::size_t flat = 0;
  for (int i = 1; i < argc; ++i) {
    const std::string_view a = argv[i];
    if (a == "--quick") {
      p.calls = 20;
      p.rounds = 3;
    } else if (a == "--params" && i + 1 < argc) {
      const long long v = std::atoll(argv[++i]);
      if (v <= 0 || v > (1ll << 31)) {
        std::fprintf(stderr, "bench_elementwise: --params must be in [1, 2^31], got '%s'\n", argv[i]);
        return 2;
      }
      flat = static_cast<std::size_t>(v);
    } else {
      std::fprintf(stderr, "bench_elementwise: unknown argument '%s' (expected --quick or --params N)\n", argv[i]);
      return 2;
    }
  }
  models::mlp_layout layout;
  if (flat) layout.widths = {flat, 1};  // one weight of N floats (and a bias of 1)
  models::mlp_host model(layout, 0);
  const std::size_t n = layout.parameter_count();
  for (auto& q : model.parameters()) {
    auto g = q.grad();
    for (std::size_t i = 0; i < g.size(); ++i) g[i] = 1e-3f * static_cast<float>(i % 7);
  }
  std::vector<float> src(n, 1.0f), dst(n), acc(n, 0.5f);
  std::vector<partrain::half> h(n);
  std::vector<partrain::bfloat16> bf(n);
  // The largest row moves 28 bytes per float (AdamW): its memcpy copies 14 bytes per float.
  std::vector<char> big_src(14 * n, 1), big_dst(14 * n);
  auto copy_bytes = [&](std::size_t bytes) {
    return [&big_src, &big_dst, bytes] {
      std::memcpy(big_dst.data(), big_src.data(), bytes);
      asm volatile("" : : "r"(big_dst.data()) : "memory");
    };
  };
  auto copy = [&] {
    std::memcpy(dst.data(), src.data(), n * sizeof(float));
    asm volatile("" : : "r"(dst.data()) : "memory");
  };

  sgd plain(model, {.lr = 1e-6});
  sgd momentum(model, {.lr = 1e-6, .momentum = 0.9});
  adamw adam(model, {.lr = 1e-6});
  auto scaler = grad_scaler::for_precision(precision::fp16);
  float* flat_grad = model.parameters().front().grad().data();
  // World sizes the compiler cannot see (x / 2 would be folded into a multiplication): 2, which
  // DDP divides by as a multiplication (an exact reciprocal), and 3, which it divides by.
  // Each call divides by d, the next by 1 / d (the same path: 0.5 is a power of two, 1/3 is not),
  // so the gradients stay in range instead of sinking into slow subnormals.
  volatile float two = 2.0f, three = 3.0f;
  const float world2[] = {two, 1.0f / two}, world3[] = {three, 1.0f / three};
  std::size_t flips = 0;
  const std::size_t first = model.parameters().front().grad().size();

  struct row_def {
    const char* name;
    double bytes_per_float;  // read + written
    std::function<void()> f;
  };
  const std::vector<row_def> rows = {
      {"sgd (lr only)", 12, [&] { plain.step(); }},
      {"sgd momentum", 20, [&] { momentum.step(); }},
      {"adamw", 28, [&] { adam.step(); }},
      {"clip_grad_norm (scales)", 12, [&] { (void)clip_grad_norm(model, 1e-9); }},
      {"grad_scaler unscale", 8, [&] {
         (void)scaler.unscale(model);
         scaler.update();
       }},
      {"cast fp32 -> fp16", 6, [&] { cast(tensor_view<const float>(src), tensor_view<partrain::half>(h)); }},
      {"cast fp16 -> fp32", 6, [&] { cast(tensor_view<const partrain::half>(h), tensor_view<float>(dst)); }},
      {"cast fp32 -> bf16", 6, [&] { cast(tensor_view<const float>(src), tensor_view<partrain::bfloat16>(bf)); }},
      {"cast bf16 -> fp32", 6, [&] { cast(tensor_view<const partrain::bfloat16>(bf), tensor_view<float>(dst)); }},
      {"ddp bucket divide (2)", 8, [&] { detail::ddp::divide_elements(detail::host_exec{}, first, flat_grad, world2[flips++ % 2]); }},
      {"ddp bucket divide (3)", 8, [&] { detail::ddp::divide_elements(detail::host_exec{}, first, flat_grad, world3[flips++ % 2]); }},
      {"ddp no_sync accumulate", 12,
       [&] { detail::for_each_index(detail::host_exec{}, n, detail::ddp::accumulate_fn<float>{acc.data(), src.data()}); }},
  };

  std::printf("bench_elementwise: %zu floats (%.2f MB per buffer), %d calls x %d rounds, median\n", n,
              static_cast<double>(n * sizeof(float)) / 1e6, p.calls, p.rounds);
  std::printf("%-26s %10s %10s %12s %10s %12s %10s\n", "path", "time_us", "GB/s", "memcpy GB/s", "vs memcpy",
              "1-buf GB/s", "vs 1-buf");
  double worst = 1e9, worst_buffer = 1e9;
  std::string worst_name, keys;
  for (const auto& r : rows) {
    // Rows over one parameter tensor (the DDP divide) move fewer floats.
    const double floats = std::string_view(r.name).starts_with("ddp bucket divide") ? static_cast<double>(first) : static_cast<double>(n);
    const double bytes = r.bytes_per_float * floats;
    const auto [t, tc] = time_against(p, r.f, copy_bytes(static_cast<std::size_t>(bytes / 2)));
    const auto [t1, tb] = time_against(p, r.f, copy);
    const double gbs = bytes / std::min(t, t1) / 1e9;
    const double copy_gbs = bytes / tc / 1e9;
    const double buffer_gbs = 8.0 * static_cast<double>(n) / tb / 1e9;
    const double ratio = gbs / copy_gbs, ratio_buffer = gbs / buffer_gbs;
    std::printf("%-26s %10.1f %10.2f %12.2f %10.3f %12.2f %10.3f\n", r.name, std::min(t, t1) * 1e6, gbs, copy_gbs, ratio,
                buffer_gbs, ratio_buffer);
    if (ratio < worst) {
      worst = ratio;
      worst_name = r.name;
    }
    worst_buffer = std::min(worst_buffer, ratio_buffer);
    const std::string_view name(r.name);
    if (name == "sgd momentum" || name == "adamw") {
      char buf[96];
      std::snprintf(buf, sizeof buf, " %s_vs_memcpy=%.3f", name == "adamw" ? "adamw" : "sgd_momentum", ratio);
      keys += buf;
    }
  }
  std::printf("slowest against memcpy of the same bytes: %s\n", worst_name.c_str());
  std::string last_keys;
#if defined(PARTRAIN_THRUST_HOST)
  char thrust_key[64];
  std::snprintf(thrust_key, sizeof thrust_key, " thrust_host_vs_loop=%.3f", thrust_rows(p, n));
  last_keys = thrust_key;
#endif
  std::printf("summary: slowest_vs_memcpy=%.3f%s slowest_vs_buffer_memcpy=%.3f%s\n", worst, keys.c_str(), worst_buffer,
              last_keys.c_str());
  return 0;
}
