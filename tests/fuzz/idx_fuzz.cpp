// libFuzzer target for the IDX reader: any byte string, plain or gzip, must either decode or
// throw partrain::data_error; never crash, hang, read out of bounds or allocate without bound.
// Build and run: see tests/fuzz/idx.cmake.
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include <partrain/data/idx.hpp>
#include <partrain/data/idx_dataset.hpp>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::span<const std::byte> bytes(reinterpret_cast<const std::byte*>(data), size);
  try {
    // A small inflate limit: a gzip bomb must be refused, not followed.
    const auto a = partrain::decode_idx(bytes, "fuzz-input", {.max_bytes = std::size_t{1} << 20});
    // Touch every element through both decoders, as a loader would.
    double sum = 0;
    for (std::size_t i = 0; i < a.size(); ++i) sum += a.at(i);
    std::vector<float> f(a.size());
    a.to_float(f, 1.0f / 255.0f);
    // As labels (1-D) or as images paired with themselves as labels (other types than ubyte taken
    // as they are, so their checks run too: scaled, they are refused by type).
    if (a.shape().rank() == 1 && a.type() != partrain::idx_type::f32 && a.type() != partrain::idx_type::f64) {
      (void)partrain::make_idx_dataset(a, a, {.scale = a.type() == partrain::idx_type::u8, .num_classes = 256}, "images",
                                       "labels");
    }
    (void)sum;
  } catch (const partrain::data_error&) {
    // Expected for malformed input.
  } catch (const partrain::invalid_argument_error&) {
    // make_idx_dataset may reject a pairing (e.g. labels out of range); also fine.
  }
  return 0;
}
