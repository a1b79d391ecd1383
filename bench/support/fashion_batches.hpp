// What the benchmarks that train the example MLP share: the normalized Fashion-MNIST training
// set, and batches as views straight into it (no loader), so every mode of a benchmark sees the
// same rows and only the training step is measured.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include <partrain/data/batch.hpp>
#include <partrain/data/fashion_mnist.hpp>
#include <partrain/data/in_memory_dataset.hpp>

namespace partrain::bench {

// The training split, normalized as the example normalizes it.
[[nodiscard]] inline in_memory_dataset load_fashion_train() {
  return load_fashion_mnist(fashion_mnist_split::train, fashion_mnist_normalization());
}

// `count` batches of `bs` rows, starting `first` batches in and wrapping around the epoch.
[[nodiscard]] inline std::vector<batch> dataset_batches(const in_memory_dataset& ds, std::size_t bs, std::size_t count,
                                                        std::size_t first = 0) {
  std::vector<batch> out;
  const auto features = ds.features();
  const auto labels = ds.labels();
  const std::size_t per_epoch = ds.size() / bs;
  for (std::size_t i = 0; i < count; ++i) {
    const std::size_t k = (first + i) % per_epoch;
    out.push_back({features.slice(k * bs, (k + 1) * bs), tensor_view<const std::int32_t>(labels.data() + k * bs, bs), {}});
  }
  return out;
}

}  // namespace partrain::bench
