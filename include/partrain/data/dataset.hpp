// partrain/data/dataset.hpp: what the loader needs from a dataset. Any type with these members
// plugs in (in_memory_dataset is one); fetch is called from the loader's background thread, so
// it must be safe to call concurrently with the dataset's other const members.
//
//   struct my_dataset {
//     std::size_t size() const;                  // number of examples
//     partrain::shape example_shape() const;     // features of one example, e.g. {784}
//     // Gather examples `indices` (in order) into rows of `features` ([n, example dims...],
//     // contiguous) and `labels` ([n]); throw (e.g. data_error) on a bad index or a bad read.
//     void fetch(std::span<const std::size_t> indices, partrain::tensor_view<float> features,
//                partrain::tensor_view<std::int32_t> labels) const;
//   };
#pragma once

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <span>

#include <partrain/core/tensor_view.hpp>

namespace partrain::inline v0 {

template <class D>
concept dataset = requires(const D& d, std::span<const std::size_t> indices, tensor_view<float> features,
                           tensor_view<std::int32_t> labels) {
  { d.size() } -> std::convertible_to<std::size_t>;
  { d.example_shape() } -> std::convertible_to<shape>;
  d.fetch(indices, features, labels);
};

namespace detail::data {
template <class D>
concept dataset_has_size = requires(const D& d) {
  { d.size() } -> std::convertible_to<std::size_t>;
};
template <class D>
concept dataset_has_example_shape = requires(const D& d) {
  { d.example_shape() } -> std::convertible_to<shape>;
};
}  // namespace detail::data

// Spells out which member a would-be dataset lacks; use at public entry points.
template <class D>
constexpr bool check_dataset() {
  static_assert(detail::data::dataset_has_size<D>,
                "partrain: a dataset needs `std::size_t size() const` (the number of examples)");
  static_assert(detail::data::dataset_has_example_shape<D>,
                "partrain: a dataset needs `partrain::shape example_shape() const` (the features of one "
                "example, e.g. {784})");
  static_assert(dataset<D>,
                "partrain: a dataset needs `void fetch(std::span<const std::size_t> indices, "
                "partrain::tensor_view<float> features, partrain::tensor_view<std::int32_t> labels) const`");
  return dataset<D>;
}

}  // namespace partrain::inline v0
