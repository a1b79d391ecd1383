// partrain/data/in_memory_dataset.hpp: a dataset held in host memory: float features
// [N, example dims...] and int32 labels [N]. fetch() gathers rows with one memcpy each, which is
// what the loader's batch assembly costs. Immutable after construction, so concurrent fetches
// (the loader's thread) are safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <partrain/core/buffer.hpp>
#include <partrain/core/error.hpp>
#include <partrain/core/tensor_view.hpp>
#include <partrain/data/dataset.hpp>

namespace partrain::inline v0 {

class in_memory_dataset {
 public:
  in_memory_dataset() = default;
  // features: [N, ...]; labels: N values in [0, num_classes).
  in_memory_dataset(host_buffer<float> features, std::vector<std::int32_t> labels, std::int32_t num_classes)
      : features_(std::move(features)), labels_(std::move(labels)), num_classes_(num_classes) {
    if (features_.shape().rank() == 0) {
      throw invalid_argument_error("in_memory_dataset: features have no dimensions, expected [N, ...]");
    }
    if (features_.shape()[0] != labels_.size()) {
      throw invalid_argument_error("in_memory_dataset: " + std::to_string(features_.shape()[0]) +
                                   " feature rows but " + std::to_string(labels_.size()) + " labels, expected equal counts");
    }
    if (num_classes_ < 1) {
      throw invalid_argument_error("in_memory_dataset: num_classes is " + std::to_string(num_classes_) +
                                   ", expected at least 1");
    }
    for (std::size_t i = 0; i < labels_.size(); ++i) {
      if (labels_[i] < 0 || labels_[i] >= num_classes_) {
        throw invalid_argument_error("in_memory_dataset: label " + std::to_string(i) + " is " +
                                     std::to_string(labels_[i]) + ", expected 0 <= label < " +
                                     std::to_string(num_classes_));
      }
    }
    const auto dims = features_.shape().dims();
    example_shape_ = shape(dims.subspan(1));
    row_ = features_.shape().row_numel();
  }

  [[nodiscard]] std::size_t size() const noexcept { return labels_.size(); }
  [[nodiscard]] shape example_shape() const noexcept { return example_shape_; }
  [[nodiscard]] std::int32_t num_classes() const noexcept { return num_classes_; }
  [[nodiscard]] tensor_view<const float> features() const noexcept { return features_.view(); }
  [[nodiscard]] std::span<const std::int32_t> labels() const noexcept { return labels_; }

  void fetch(std::span<const std::size_t> indices, tensor_view<float> features, tensor_view<std::int32_t> labels) const {
    if (features.size() != indices.size() * row_ || labels.size() != indices.size()) {
      throw invalid_argument_error("in_memory_dataset::fetch: " + std::to_string(indices.size()) +
                                   " indices need " + std::to_string(indices.size() * row_) + " feature elements and " +
                                   std::to_string(indices.size()) + " labels, given " +
                                   std::to_string(features.size()) + " and " + std::to_string(labels.size()));
    }
    const float* src = features_.data();
    float* dst = features.data();
    for (std::size_t k = 0; k < indices.size(); ++k) {
      const std::size_t i = indices[k];
      if (i >= labels_.size()) {
        throw invalid_argument_error("in_memory_dataset::fetch: index " + std::to_string(i) +
                                     " is out of range for a dataset of " + std::to_string(labels_.size()) + " examples");
      }
      std::memcpy(dst + k * row_, src + i * row_, row_ * sizeof(float));
      labels[k] = labels_[i];
    }
  }

 private:
  host_buffer<float> features_;
  std::vector<std::int32_t> labels_;
  std::int32_t num_classes_ = 1;
  shape example_shape_{};
  std::size_t row_ = 0;
};

static_assert(dataset<in_memory_dataset>);

}  // namespace partrain::inline v0
