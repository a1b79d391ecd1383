// partrain/core/detail/json_text.hpp: the small amount of JSON that the metrics and trace writers
// and torchrun's error file emit. Strings are escaped per RFC 8259; numbers use the shortest text
// that reads back to the same double (std::to_chars), and NaN or infinity become null (JSON has no
// such numbers).
#pragma once

#include <charconv>
#include <cmath>
#include <cstdint>
#include <string>
#include <string_view>
#include <system_error>

namespace partrain::inline v0::detail::json {

inline void append_string(std::string& out, std::string_view s) {
  static constexpr char hex[] = "0123456789abcdef";
  out += '"';
  for (const char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (c < 0x20 || c == 0x7f) {  // other control characters must be \u escaped
          out += "\\u00";
          out += hex[c >> 4];
          out += hex[c & 0xf];
        } else {
          out += ch;  // UTF-8 passes through unchanged
        }
    }
  }
  out += '"';
}

inline void append_number(std::string& out, double v) {
  if (!std::isfinite(v)) {
    out += "null";
    return;
  }
  char buf[32];
  const auto [end, ec] = std::to_chars(buf, buf + sizeof buf, v);
  if (ec != std::errc{}) {
    out += "null";
    return;
  }
  out.append(buf, end);
}

inline void append_number(std::string& out, std::int64_t v) {
  char buf[24];
  const auto [end, ec] = std::to_chars(buf, buf + sizeof buf, v);
  (void)ec;  // 24 characters always hold an int64
  out.append(buf, end);
}

// A fixed-point number with `decimals` digits after the point (trace timestamps in microseconds
// with nanosecond resolution: integer arithmetic, so no rounding drift on long runs).
inline void append_fixed_point(std::string& out, std::int64_t value, std::int64_t scale, int decimals) {
  if (value < 0) {
    out += '-';
    value = -value;
  }
  append_number(out, value / scale);
  if (decimals > 0) {
    std::string frac = std::to_string(value % scale);
    out += '.';
    out.append(static_cast<std::size_t>(decimals) - frac.size(), '0');
    out += frac;
  }
}

}  // namespace partrain::inline v0::detail::json
