// partrain/data/idx_dataset.hpp: load_idx_dataset(images, labels, normalize) turns a pair of IDX
// files (MNIST layout: images [N, rows, cols] ubyte, labels [N] ubyte) into an in_memory_dataset
// with features [N, rows * cols] as float. Normalisation follows torchvision's ToTensor then
// Normalize: ubyte pixels are scaled to [0, 1], then (x - mean) / std when both are given.
// What cannot train is refused here, naming the file: no images, images of another size than
// asked, pixels of a type that /255 does not scale to [0, 1], labels outside the classes.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include <partrain/core/buffer.hpp>
#include <partrain/core/error.hpp>
#include <partrain/data/idx.hpp>
#include <partrain/data/in_memory_dataset.hpp>

namespace partrain::inline v0 {

struct normalize_options {
  // ubyte pixels / 255. Images of another element type are refused while this is set (/255 would
  // not bring them to [0, 1]); false takes any type's values as they are.
  bool scale = true;
  std::optional<float> mean{};  // then (x - mean) / std (fashion_mnist_normalization() has Fashion-MNIST's)
  std::optional<float> std{};
  std::int32_t num_classes = 10;  // labels must lie in [0, num_classes)
  partrain::shape image_shape{};  // each image's dimensions, e.g. {28, 28}; rank 0: any
};

// Builds the dataset from two arrays already read; the names appear in errors.
[[nodiscard]] inline in_memory_dataset make_idx_dataset(const idx_array& images, const idx_array& labels,
                                                        const normalize_options& options = {},
                                                        const std::string& images_name = "images",
                                                        const std::string& labels_name = "labels") {
  const auto image_error = [&](const std::string& what) { return data_error("IDX file '" + images_name + "': " + what); };
  if (images.shape()[0] == 0) {
    throw image_error("holds no images (shape " + images.shape().to_string() + "), expected at least one");
  }
  if (options.image_shape.rank() > 0) {
    bool same = images.shape().rank() == options.image_shape.rank() + 1;
    for (std::size_t d = 0; same && d < options.image_shape.rank(); ++d) same = images.shape()[d + 1] == options.image_shape[d];
    if (!same) {
      throw image_error("images have shape " + images.shape().to_string() + ", expected [N, " +
                        options.image_shape.to_string().substr(1));
    }
  }
  if (options.scale && images.type() != idx_type::u8) {
    throw image_error("images are " + std::string(to_string(images.type())) +
                      ", expected ubyte pixels (0 to 255, scaled by 1/255 to [0, 1]); convert the file to ubyte, "
                      "or set normalize_options::scale = false to take the values as they are");
  }
  if (labels.shape().rank() != 1) {
    throw data_error("IDX file '" + labels_name + "': labels have shape " + labels.shape().to_string() +
                     ", expected one dimension [N]");
  }
  if (labels.type() == idx_type::f32 || labels.type() == idx_type::f64) {
    throw data_error("IDX file '" + labels_name + "': labels are " + std::string(to_string(labels.type())) +
                     ", expected an integer type");
  }
  if (images.shape()[0] != labels.shape()[0]) {
    throw data_error("IDX files '" + images_name + "' and '" + labels_name + "' disagree: " +
                     std::to_string(images.shape()[0]) + " images but " + std::to_string(labels.shape()[0]) +
                     " labels, expected equal counts");
  }
  if (options.mean.has_value() != options.std.has_value()) {
    throw invalid_argument_error("load_idx_dataset: normalize_options has only one of mean and std, expected both or neither");
  }
  if (options.std && !(std::isfinite(*options.std) && *options.std > 0)) {
    throw invalid_argument_error("load_idx_dataset: normalize_options.std is " + std::to_string(*options.std) +
                                 ", expected a finite value > 0");
  }
  const std::size_t n = labels.shape()[0];
  std::vector<std::int32_t> y(n);
  for (std::size_t i = 0; i < n; ++i) {
    const double v = labels.at(i);
    if (v < 0 || v >= options.num_classes) {
      throw data_error("IDX file '" + labels_name + "': label " + std::to_string(i) + " is " +
                       std::to_string(static_cast<long long>(v)) + ", expected 0 <= label < " +
                       std::to_string(options.num_classes));
    }
    y[i] = static_cast<std::int32_t>(v);
  }
  const std::size_t row = images.shape().row_numel();
  host_buffer<float> x(shape{n, row});
  const float scale = options.scale ? 1.0f / 255.0f : 1.0f;  // ubyte only, checked above
  images.to_float({x.data(), x.size()}, scale);
  if (images.type() == idx_type::f32 || images.type() == idx_type::f64) {
    for (std::size_t i = 0; i < x.size(); ++i) {
      if (!std::isfinite(x.data()[i])) {
        throw image_error("value " + std::to_string(i) + " (image " + std::to_string(i / row) + ") is " +
                          std::to_string(x.data()[i]) + ", expected a finite number");
      }
    }
  }
  if (options.mean) {
    const float mean = *options.mean;
    const float inv_std = 1.0f / *options.std;
    for (float& v : x) v = (v - mean) * inv_std;
  }
  return in_memory_dataset(std::move(x), std::move(y), options.num_classes);
}

// Reads images and labels (plain or .gz) into memory.
[[nodiscard]] inline in_memory_dataset load_idx_dataset(const std::filesystem::path& images_path,
                                                        const std::filesystem::path& labels_path,
                                                        const normalize_options& options = {}) {
  const idx_array images = read_idx(images_path);
  const idx_array labels = read_idx(labels_path);
  return make_idx_dataset(images, labels, options, images_path.string(), labels_path.string());
}

}  // namespace partrain::inline v0
