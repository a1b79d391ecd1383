// partrain/core/device.hpp: a device is a kind (cpu or cuda) and an index.
#pragma once

#include <charconv>
#include <compare>
#include <string>
#include <string_view>

#include <partrain/core/error.hpp>

namespace partrain::inline v0 {

enum class device_kind { cpu, cuda };

struct device {
  device_kind kind = device_kind::cpu;
  int index = 0;

  [[nodiscard]] static constexpr device cpu(int i = 0) noexcept { return {device_kind::cpu, i}; }
  [[nodiscard]] static constexpr device cuda(int i = 0) noexcept { return {device_kind::cuda, i}; }
  [[nodiscard]] constexpr bool is_cuda() const noexcept { return kind == device_kind::cuda; }
  friend constexpr auto operator<=>(const device&, const device&) = default;

  [[nodiscard]] std::string to_string() const {
    return std::string(kind == device_kind::cpu ? "cpu:" : "cuda:") + std::to_string(index);
  }

  // "cpu", "cpu:1", "cuda", "cuda:0" (torch.device spelling).
  [[nodiscard]] static device parse(std::string_view s) {
    device d;
    std::string_view kind = s.substr(0, s.find(':'));
    if (kind == "cpu") {
      d.kind = device_kind::cpu;
    } else if (kind == "cuda") {
      d.kind = device_kind::cuda;
    } else {
      throw config_error("device '" + std::string(s) + "': expected 'cpu', 'cuda' or 'cuda:N'");
    }
    if (auto colon = s.find(':'); colon != std::string_view::npos) {
      auto idx = s.substr(colon + 1);
      auto [p, ec] = std::from_chars(idx.data(), idx.data() + idx.size(), d.index);
      if (ec != std::errc{} || p != idx.data() + idx.size() || d.index < 0) {
        throw config_error("device '" + std::string(s) + "': index must be a non-negative integer");
      }
    }
    return d;
  }
};

}  // namespace partrain::inline v0
