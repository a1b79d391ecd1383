// partrain/data/batch.hpp: what the loader hands out. A view into the loader's buffer: valid until
// the loader produces the next batch (copy the data out to keep it longer).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include <partrain/core/tensor_view.hpp>

namespace partrain::inline v0 {

struct batch {
  tensor_view<const float> features;        // [n, example dims...], e.g. [n, 784] for Fashion-MNIST
  tensor_view<const std::int32_t> labels;   // [n]
  std::span<const std::size_t> indices;     // dataset indices of the rows, in order
  [[nodiscard]] std::size_t size() const noexcept { return labels.size(); }
};

}  // namespace partrain::inline v0
