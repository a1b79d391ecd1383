// partrain/core/detail/json_parse.hpp: a small strict JSON reader for headers of files partrain
// reads (safetensors). RFC 8259 with these limits, each refused with the byte offset where it
// happens: numbers must be non-negative integers below 2^64 (what offsets and extents are), an
// object may not repeat a key, nesting is depth-limited, strings must be valid UTF-8 (\u escapes,
// surrogate pairs included, become UTF-8; a lone surrogate is refused), nothing may follow the
// value but whitespace. The writer's half is detail/json_text.hpp.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace partrain::inline v0::detail::json {

struct value {
  enum class kind : std::uint8_t { null, boolean, integer, string, array, object };
  kind type = kind::null;
  bool boolean = false;
  std::uint64_t integer = 0;
  std::string string{};
  std::vector<value> array{};
  std::vector<std::pair<std::string, value>> object{};  // in the text's order, keys unique

  [[nodiscard]] const value* find(std::string_view key) const noexcept {
    for (const auto& [k, v] : object) {
      if (k == key) return &v;
    }
    return nullptr;
  }
};

[[nodiscard]] constexpr std::string_view kind_name(value::kind k) noexcept {
  switch (k) {
    case value::kind::null: return "null";
    case value::kind::boolean: return "a boolean";
    case value::kind::integer: return "a number";
    case value::kind::string: return "a string";
    case value::kind::array: return "an array";
    case value::kind::object: return "an object";
  }
  return "a value";
}

inline void append_utf8(std::string& out, std::uint32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xc0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3f));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xe0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
    out += static_cast<char>(0x80 | (cp & 0x3f));
  } else {
    out += static_cast<char>(0xf0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3f));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
    out += static_cast<char>(0x80 | (cp & 0x3f));
  }
}

// Parses `text`; throws Error("<what> is not valid JSON: <why> at byte <k>").
template <class Error>
class parser {
 public:
  parser(std::string_view text, std::string_view what, std::size_t max_depth) : s_(text), what_(what), max_depth_(max_depth) {}

  [[nodiscard]] value parse_document() {
    value v = parse_value(0);
    skip_space();
    if (pos_ != s_.size()) fail("unexpected '" + shown(s_[pos_]) + "' after the value");
    return v;
  }

 private:
  [[noreturn]] void fail(const std::string& why) const {
    throw Error(std::string(what_) + " is not valid JSON: " + why + " at byte " + std::to_string(pos_));
  }
  static std::string shown(char c) {
    const auto u = static_cast<unsigned char>(c);
    if (u >= 0x20 && u < 0x7f) return std::string(1, c);
    static constexpr char hex[] = "0123456789abcdef";
    return std::string("\\x") + hex[u >> 4] + hex[u & 0xf];
  }
  void skip_space() noexcept {
    while (pos_ < s_.size() && (s_[pos_] == ' ' || s_[pos_] == '\t' || s_[pos_] == '\n' || s_[pos_] == '\r')) ++pos_;
  }
  void expect_word(std::string_view w) {
    if (s_.substr(pos_, w.size()) != w) fail("unexpected '" + shown(s_[pos_]) + "'");
    pos_ += w.size();
  }

  value parse_value(std::size_t depth) {
    skip_space();
    if (pos_ >= s_.size()) fail("unexpected end of input");
    value v;
    switch (s_[pos_]) {
      case '{': v.type = value::kind::object; parse_object(v, depth + 1); break;
      case '[': v.type = value::kind::array; parse_array(v, depth + 1); break;
      case '"': v.type = value::kind::string; v.string = parse_string(); break;
      case 't': expect_word("true"); v.type = value::kind::boolean; v.boolean = true; break;
      case 'f': expect_word("false"); v.type = value::kind::boolean; break;
      case 'n': expect_word("null"); break;
      default: v.type = value::kind::integer; v.integer = parse_integer();
    }
    return v;
  }

  void check_depth(std::size_t depth) const {
    if (depth > max_depth_) fail("nested deeper than " + std::to_string(max_depth_) + " levels");
  }

  void parse_object(value& v, std::size_t depth) {
    check_depth(depth);
    ++pos_;
    skip_space();
    if (pos_ < s_.size() && s_[pos_] == '}') {
      ++pos_;
      return;
    }
    while (true) {
      skip_space();
      if (pos_ >= s_.size() || s_[pos_] != '"') fail("expected a string key");
      std::string key = parse_string();
      skip_space();
      if (pos_ >= s_.size() || s_[pos_] != ':') fail("expected ':' after the key \"" + key + "\"");
      ++pos_;
      v.object.emplace_back(std::move(key), parse_value(depth));
      skip_space();
      if (pos_ < s_.size() && s_[pos_] == ',') {
        ++pos_;
        continue;
      }
      if (pos_ < s_.size() && s_[pos_] == '}') break;
      fail("expected ',' or '}' in an object");
    }
    // Duplicates found by sorting (not a pairwise scan: a header may hold many thousand keys).
    std::vector<const std::string*> keys;
    keys.reserve(v.object.size());
    for (const auto& kv : v.object) keys.push_back(&kv.first);
    std::ranges::sort(keys, [](const std::string* a, const std::string* b) { return *a < *b; });
    for (std::size_t i = 1; i < keys.size(); ++i) {
      if (*keys[i] == *keys[i - 1]) fail("duplicate key \"" + *keys[i] + "\" in the object ending");
    }
    ++pos_;
  }

  void parse_array(value& v, std::size_t depth) {
    check_depth(depth);
    ++pos_;
    skip_space();
    if (pos_ < s_.size() && s_[pos_] == ']') {
      ++pos_;
      return;
    }
    while (true) {
      v.array.push_back(parse_value(depth));
      skip_space();
      if (pos_ < s_.size() && s_[pos_] == ',') {
        ++pos_;
        continue;
      }
      if (pos_ < s_.size() && s_[pos_] == ']') break;
      fail("expected ',' or ']' in an array");
    }
    ++pos_;
  }

  std::uint64_t parse_integer() {
    const std::size_t start = pos_;
    std::size_t end = pos_;
    while (end < s_.size() && (s_[end] == '-' || s_[end] == '+' || s_[end] == '.' || s_[end] == 'e' || s_[end] == 'E' ||
                               (s_[end] >= '0' && s_[end] <= '9'))) {
      ++end;
    }
    const std::string_view text = s_.substr(start, end - start);
    if (text.empty()) fail("unexpected '" + shown(s_[pos_]) + "'");
    if (text.find_first_not_of("0123456789") != std::string_view::npos) {
      fail("the number " + std::string(text) + " is not a non-negative integer (the only numbers read here)");
    }
    if (text.size() > 1 && text[0] == '0') fail("the number " + std::string(text) + " has a leading zero");
    std::uint64_t n = 0;
    for (const char c : text) {
      const auto d = static_cast<std::uint64_t>(c - '0');
      if (n > (UINT64_MAX - d) / 10) fail("the number " + std::string(text) + " is larger than 2^64 - 1");
      n = n * 10 + d;
    }
    pos_ = end;
    return n;
  }

  std::uint32_t hex4() {
    if (s_.size() - pos_ < 4) fail("a \\u escape needs 4 hex digits");
    std::uint32_t cp = 0;
    for (int i = 0; i < 4; ++i) {
      const char c = s_[pos_++];
      cp <<= 4;
      if (c >= '0' && c <= '9') cp |= static_cast<std::uint32_t>(c - '0');
      else if (c >= 'a' && c <= 'f') cp |= static_cast<std::uint32_t>(c - 'a' + 10);
      else if (c >= 'A' && c <= 'F') cp |= static_cast<std::uint32_t>(c - 'A' + 10);
      else fail("'" + shown(c) + "' is not a hex digit in a \\u escape");
    }
    return cp;
  }

  // One UTF-8 sequence starting at pos_ (its first byte >= 0x80), checked and copied.
  void copy_utf8(std::string& out) {
    const auto b0 = static_cast<unsigned char>(s_[pos_]);
    std::size_t n = 0;
    std::uint32_t cp = 0, min = 0;
    if (b0 >= 0xc2 && b0 <= 0xdf) {
      n = 1;
      cp = b0 & 0x1fu;
      min = 0x80;
    } else if (b0 >= 0xe0 && b0 <= 0xef) {
      n = 2;
      cp = b0 & 0x0fu;
      min = 0x800;
    } else if (b0 >= 0xf0 && b0 <= 0xf4) {
      n = 3;
      cp = b0 & 0x07u;
      min = 0x10000;
    } else {
      fail("invalid UTF-8 byte " + shown(s_[pos_]));
    }
    if (s_.size() - pos_ <= n) fail("truncated UTF-8 sequence");
    for (std::size_t i = 1; i <= n; ++i) {
      const auto b = static_cast<unsigned char>(s_[pos_ + i]);
      if ((b & 0xc0) != 0x80) fail("invalid UTF-8 sequence");
      cp = (cp << 6) | (b & 0x3fu);
    }
    if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) fail("invalid UTF-8 sequence");
    out.append(s_.substr(pos_, n + 1));
    pos_ += n + 1;
  }

  std::string parse_string() {
    ++pos_;  // the opening quote
    std::string out;
    while (true) {
      if (pos_ >= s_.size()) fail("unterminated string");
      const char c = s_[pos_];
      const auto u = static_cast<unsigned char>(c);
      if (c == '"') {
        ++pos_;
        return out;
      }
      if (u < 0x20) fail("control character " + shown(c) + " in a string (it must be escaped)");
      if (u >= 0x80) {
        copy_utf8(out);
        continue;
      }
      if (c != '\\') {
        out += c;
        ++pos_;
        continue;
      }
      if (++pos_ >= s_.size()) fail("unterminated escape");
      const char e = s_[pos_++];
      switch (e) {
        case '"': out += '"'; break;
        case '\\': out += '\\'; break;
        case '/': out += '/'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'n': out += '\n'; break;
        case 'r': out += '\r'; break;
        case 't': out += '\t'; break;
        case 'u': {
          std::uint32_t cp = hex4();
          if (cp >= 0xdc00 && cp <= 0xdfff) fail("a lone low surrogate \\u escape");
          if (cp >= 0xd800 && cp <= 0xdbff) {
            if (s_.substr(pos_, 2) != "\\u") fail("a high surrogate \\u escape without its low half");
            pos_ += 2;
            const std::uint32_t lo = hex4();
            if (lo < 0xdc00 || lo > 0xdfff) fail("a high surrogate \\u escape without its low half");
            cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
          }
          append_utf8(out, cp);
          break;
        }
        default: --pos_; fail("unknown escape '\\" + shown(e) + "'");
      }
    }
  }

  std::string_view s_;
  std::string_view what_;
  std::size_t max_depth_;
  std::size_t pos_ = 0;
};

// The value `text` holds; throws Error naming `what` (e.g. "safetensors header of 'm.st'").
template <class Error>
[[nodiscard]] value parse(std::string_view text, std::string_view what, std::size_t max_depth = 64) {
  return parser<Error>(text, what, max_depth).parse_document();
}

}  // namespace partrain::inline v0::detail::json
