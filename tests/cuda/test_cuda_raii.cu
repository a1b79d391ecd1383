// The CUDA RAII pieces: streams, events, device and pinned buffers, cuBLAS handles, error checks.
#include <catch2/catch.hpp>

#include <partrain/cuda/check.hpp>
#include <partrain/cuda/cublas.hpp>
#include <partrain/cuda/device_buffer.hpp>
#include <partrain/cuda/event.hpp>
#include <partrain/cuda/pinned_buffer.hpp>
#include <partrain/cuda/stream.hpp>
#include <partrain/launch/process.hpp>

#include <string>
#include <thread>
#include <utility>
#include <vector>

using namespace partrain;

namespace {

__global__ void scale_add(float* x, std::size_t n, float a, float b) {
  const std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x;
  if (i < n) x[i] = a * x[i] + b;
}

// Keeps a stream busy for about `ns` nanoseconds.
__global__ void spin(unsigned long long ns) {
  const unsigned long long start = clock64();
  while (clock64() - start < ns) {
  }
}

void launch_scale_add(float* x, std::size_t n, float a, float b, cudaStream_t s) {
  const unsigned blocks = static_cast<unsigned>((n + 255) / 256);
  scale_add<<<blocks, 256, 0, s>>>(x, n, a, b);
  PARTRAIN_CUDA_CHECK(cudaGetLastError());
}

}  // namespace

extern bool partrain_test_cuda_initialised_at_start;  // tests/cuda/gpu_main.cpp

// spawn forks only where CUDA is not initialised: a program with device code, loaded (libcuda
// mapped by the runtime) but before its first CUDA call, may fork; after it, it may not.
TEST_CASE("cuda_initialised: false until the first CUDA call, true after it", "[cuda][spawn]") {
  CHECK_FALSE(partrain_test_cuda_initialised_at_start);
  CHECK(detail::launch::cuda_initialised());  // gpu_main made a context
  CHECK_THROWS_AS(detail::launch::refuse_fork_after_cuda(), config_error);
}

TEST_CASE("cuda_stream and cuda_event are RAII handles with noexcept moves", "[cuda][raii]") {
  static_assert(std::is_nothrow_move_constructible_v<cuda_stream>);
  static_assert(std::is_nothrow_move_assignable_v<cuda_stream>);
  static_assert(std::is_nothrow_move_constructible_v<cuda_event>);
  static_assert(!std::is_copy_constructible_v<cuda_stream>);
  static_assert(!std::is_copy_constructible_v<device_buffer<float>>);

  cuda_stream a(0);
  REQUIRE(a);
  cudaStream_t raw = a.get();
  cuda_stream b = std::move(a);
  CHECK(b.get() == raw);
  CHECK_FALSE(a);  // NOLINT: moved-from is empty by contract
  CHECK(b.query());

  cuda_event start(true), stop(true);
  start.record(b.get());
  spin<<<1, 1, 0, b.get()>>>(20'000'000);
  stop.record(b.get());
  stop.synchronize();
  CHECK(stop.query());
  CHECK(stop.elapsed_ms(start) > 0.0f);

  cuda_event untimed;
  untimed.record(b.get());
  CHECK_THROWS_AS(untimed.elapsed_ms(start), invalid_argument_error);
}

TEST_CASE("an event orders one stream behind another", "[cuda][raii]") {
  cuda_stream producer(0), consumer(0);
  device_buffer<float> x(std::size_t{1 << 16}, 0);
  std::vector<float> host(x.size(), 1.0f);
  x.copy_from(tensor_view<const float>(host));
  spin<<<1, 1, 0, producer.get()>>>(10'000'000);
  launch_scale_add(x.data(), x.size(), 2.0f, 0.0f, producer.get());  // 2
  cuda_event ready;
  ready.record(producer.get());
  ready.block(consumer.get());
  launch_scale_add(x.data(), x.size(), 1.0f, 1.0f, consumer.get());  // 3, only after the 2
  consumer.synchronize();
  x.copy_to(tensor_view<float>(host));
  for (float v : host) REQUIRE(v == 3.0f);
}

TEST_CASE("device and pinned buffers round-trip through a kernel", "[cuda][buffer]") {
  for (std::size_t n : {std::size_t{1}, std::size_t{1000}, std::size_t{1} << 20}) {
    pinned_buffer<float> in(n, 0), out(n, 0);
    for (std::size_t i = 0; i < n; ++i) in[i] = static_cast<float>(i % 1024);
    device_buffer<float> d(shape{n}, device::cuda(0));
    CHECK(d.view().size() == n);
    static_assert(std::same_as<decltype(d.view()), tensor_view<float, cuda>>);
    cuda_stream s(0);
    d.copy_from(in.view(), s.get());
    launch_scale_add(d.data(), n, 3.0f, -1.0f, s.get());
    d.copy_to(out.view(), s.get());
    s.synchronize();
    for (std::size_t i = 0; i < n; ++i) REQUIRE(out[i] == 3.0f * static_cast<float>(i % 1024) - 1.0f);
  }
  device_buffer<double> zeros(std::size_t{17}, 0);
  std::vector<double> back(17, 5.0);
  zeros.copy_to(tensor_view<double>(back));
  for (double v : back) CHECK(v == 0.0);  // zero-initialised
  std::vector<double> wrong(3);
  CHECK_THROWS_AS(zeros.copy_to(tensor_view<double>(wrong)), invalid_argument_error);
  device_buffer<double> moved = std::move(zeros);
  CHECK(moved.size() == 17);
  CHECK(zeros.data() == nullptr);  // NOLINT: moved-from is empty by contract
}

TEST_CASE("PARTRAIN_CUDA_CHECK names the call, the place and CUDA's error", "[cuda][error]") {
  try {
    PARTRAIN_CUDA_CHECK(cudaSetDevice(12345));
    FAIL("cudaSetDevice(12345) should fail");
  } catch (const cuda_error& e) {
    const std::string what = e.what();
    CHECK(what.find("cudaSetDevice(12345)") != std::string::npos);
    CHECK(what.find("test_cuda_raii.cu") != std::string::npos);
    CHECK(what.find("cudaErrorInvalidDevice") != std::string::npos);
    CHECK(e.code() == cudaErrorInvalidDevice);
    CHECK(e.kind() == error_kind::internal);
  }
  CHECK(cudaGetLastError() == cudaSuccess);  // the failure did not stick
}

TEST_CASE("cublas_handle runs on the stream it is given", "[cuda][cublas]") {
  cuda_stream s(0);
  cublas_handle h(0);
  h.set_stream(s.get());
  const std::size_t n = 1000;
  std::vector<float> x(n, 2.0f), y(n, 1.0f);
  device_buffer<float> dx(n, 0), dy(n, 0);
  dx.copy_from(tensor_view<const float>(x));
  dy.copy_from(tensor_view<const float>(y));
  const float alpha = 3.0f;
  PARTRAIN_CUBLAS_CHECK(cublasSaxpy(h.get(), static_cast<int>(n), &alpha, dx.data(), 1, dy.data(), 1));
  s.synchronize();
  dy.copy_to(tensor_view<float>(y));
  for (float v : y) REQUIRE(v == 7.0f);
  cublas_handle moved = std::move(h);
  CHECK(moved.get() != nullptr);
  CHECK(h.get() == nullptr);  // NOLINT: moved-from is empty by contract
}

TEST_CASE("cuda_device_guard switches only when needed and never restores an unset device", "[cuda][raii]") {
  REQUIRE(cudaSetDevice(0) == cudaSuccess);
  {
    cuda_device_guard same(0);  // already current: nothing switched, nothing to restore
    CHECK(cuda_current_device() == 0);
  }
  CHECK(cuda_current_device() == 0);
  if (cuda_device_count() > 1) {
    {
      cuda_device_guard other(1);
      CHECK(cuda_current_device() == 1);
    }
    CHECK(cuda_current_device() == 0);  // this thread had set 0: restored
  }
  // A fresh thread has no context: cudaGetDevice says 0 without making one, and only a real
  // cudaSetDevice gives the thread a context (what the guard asks before restoring anything).
  bool before = true, after = false;
  int other_after = -1;
  std::thread t([&] {
    before = detail::thread_has_cuda_context();
    if (cuda_device_count() > 1) {
      { cuda_device_guard g(1); }
      other_after = cuda_current_device();  // stays 1: restoring "0" would create device 0's context
    }
    (void)cudaSetDevice(0);
    after = detail::thread_has_cuda_context();
  });
  t.join();
  CHECK_FALSE(before);
  CHECK(after);
  if (cuda_device_count() > 1) CHECK(other_after == 1);
}

TEST_CASE("device memory says which device it is on; host memory is refused", "[cuda][raii]") {
  device_buffer<float> d(std::size_t{8}, device::cuda(0));
  // Fields, not ==: nvcc 13 does not define the operator== that device's defaulted <=> implies.
  CHECK((d.device().is_cuda() && d.device().index == 0));
  const device where = cuda_device_of(d.data(), "test");
  CHECK((where.is_cuda() && where.index == 0));
  std::vector<float> host(8);
  CHECK_THROWS_AS(cuda_device_of(host.data(), "test"), config_error);
  CHECK_THROWS_AS(device_buffer<float>(std::size_t{8}, device::cpu()), invalid_argument_error);
}

// A rank-0 shape is a scalar (one element): an empty buffer must say empty, or code that tests
// empty() before reusing one (ZeRO-2's accumulation buffer) copies into a null pointer.
TEST_CASE("default-constructed, moved-from and zero-sized buffers are empty", "[cuda][buffer]") {
  device_buffer<float> d;
  CHECK(d.empty());
  CHECK(d.size() == 0);
  CHECK(d.view().empty());
  device_buffer<float> full(std::size_t{4}, 0);
  device_buffer<float> taken(std::move(full));
  CHECK(taken.size() == 4);
  CHECK(full.empty());  // NOLINT(bugprone-use-after-move): the moved-from state is what is checked
  taken = device_buffer<float>();
  CHECK(taken.empty());
  CHECK(device_buffer<float>(std::size_t{0}, 0).empty());
  pinned_buffer<float> p;
  CHECK(p.size() == 0);
  pinned_buffer<float> q(std::size_t{4}, 0);
  pinned_buffer<float> r(std::move(q));
  CHECK(r.size() == 4);
  CHECK(q.size() == 0);  // NOLINT(bugprone-use-after-move)
}
