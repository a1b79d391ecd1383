// partrain/data/fashion_mnist.hpp: where Fashion-MNIST lives and how to load it. Debian's
// dataset-fashion-mnist installs the four gzip IDX files under /usr/share/datasets/fashion-mnist;
// PARTRAIN_FASHION_MNIST_DIR points elsewhere.
#pragma once

#include <cstdlib>
#include <filesystem>
#include <string>
#include <string_view>

#include <partrain/core/error.hpp>
#include <partrain/data/idx_dataset.hpp>

namespace partrain::inline v0 {

[[nodiscard]] inline std::filesystem::path fashion_mnist_dir() {
  if (const char* dir = std::getenv("PARTRAIN_FASHION_MNIST_DIR"); dir && *dir) return dir;
  return "/usr/share/datasets/fashion-mnist";
}

enum class fashion_mnist_split { train, test };

// Pixels scaled to [0, 1], then standardized by the training split's own mean and standard
// deviation: the usual inputs for a model trained on Fashion-MNIST.
[[nodiscard]] inline normalize_options fashion_mnist_normalization() {
  normalize_options norm;
  norm.mean = 0.2860f;
  norm.std = 0.3530f;
  return norm;
}

// 60,000 training or 10,000 test examples, features [N, 784]. Either split's files are checked
// for what Fashion-MNIST is (28x28 ubyte images, labels 0 to 9, unless options say otherwise), so
// the splits cannot disagree with each other or with a model made for the data set.
[[nodiscard]] inline in_memory_dataset load_fashion_mnist(fashion_mnist_split split, const normalize_options& options = {},
                                                          const std::filesystem::path& dir = fashion_mnist_dir()) {
  const std::string_view prefix = split == fashion_mnist_split::train ? "train" : "t10k";
  normalize_options o = options;
  if (o.image_shape.rank() == 0) o.image_shape = {28, 28};
  return load_idx_dataset(dir / (std::string(prefix) + "-images-idx3-ubyte.gz"),
                          dir / (std::string(prefix) + "-labels-idx1-ubyte.gz"), o);
}

}  // namespace partrain::inline v0
