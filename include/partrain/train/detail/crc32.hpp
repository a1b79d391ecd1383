// partrain/train/detail/crc32.hpp: CRC-32 (IEEE 802.3, reflected polynomial 0xEDB88320, as zlib
// and PNG use), table-driven. crc32("123456789") == 0xCBF43926.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>

namespace partrain::inline v0::detail {

inline constexpr std::array<std::uint32_t, 256> crc32_table = [] {
  std::array<std::uint32_t, 256> t{};
  for (std::uint32_t i = 0; i < 256; ++i) {
    std::uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1u) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
    t[i] = c;
  }
  return t;
}();

// Continues a CRC: crc32(b, crc32(a)) == crc32(a ++ b).
[[nodiscard]] constexpr std::uint32_t crc32(std::span<const std::byte> data, std::uint32_t crc = 0) noexcept {
  crc = ~crc;
  for (const std::byte b : data) crc = crc32_table[(crc ^ static_cast<std::uint32_t>(b)) & 0xFFu] ^ (crc >> 8);
  return ~crc;
}

}  // namespace partrain::inline v0::detail
