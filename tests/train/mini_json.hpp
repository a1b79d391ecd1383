// tests/train/mini_json.hpp: a small strict JSON parser (RFC 8259) for checking what the
// metrics and trace writers emit. Throws std::runtime_error with the offset of the first error.
#pragma once

#include <cstddef>
#include <cstdlib>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

namespace mini_json {

struct value;
using object = std::map<std::string, value>;
using array = std::vector<value>;

struct value {
  std::variant<std::nullptr_t, bool, double, std::string, std::shared_ptr<array>, std::shared_ptr<object>> v;

  [[nodiscard]] bool is_null() const { return std::holds_alternative<std::nullptr_t>(v); }
  [[nodiscard]] bool is_number() const { return std::holds_alternative<double>(v); }
  [[nodiscard]] bool is_string() const { return std::holds_alternative<std::string>(v); }
  [[nodiscard]] bool is_object() const { return std::holds_alternative<std::shared_ptr<object>>(v); }
  [[nodiscard]] bool is_array() const { return std::holds_alternative<std::shared_ptr<array>>(v); }
  [[nodiscard]] double num() const { return std::get<double>(v); }
  [[nodiscard]] bool boolean() const { return std::get<bool>(v); }
  [[nodiscard]] const std::string& str() const { return std::get<std::string>(v); }
  [[nodiscard]] const array& arr() const { return *std::get<std::shared_ptr<array>>(v); }
  [[nodiscard]] const object& obj() const { return *std::get<std::shared_ptr<object>>(v); }
  [[nodiscard]] bool has(const std::string& k) const { return is_object() && obj().count(k) != 0; }
  [[nodiscard]] const value& operator[](const std::string& k) const {
    auto it = obj().find(k);
    if (it == obj().end()) throw std::runtime_error("json: no key '" + k + "'");
    return it->second;
  }
};

class parser {
 public:
  explicit parser(std::string_view s) : s_(s) {}
  value parse_document() {
    value v = parse_value();
    ws();
    if (i_ != s_.size()) fail("trailing characters");
    return v;
  }

 private:
  [[noreturn]] void fail(const std::string& what) const {
    throw std::runtime_error("json: " + what + " at offset " + std::to_string(i_));
  }
  void ws() {
    while (i_ < s_.size() && (s_[i_] == ' ' || s_[i_] == '\t' || s_[i_] == '\n' || s_[i_] == '\r')) ++i_;
  }
  bool eat(char c) {
    ws();
    if (i_ < s_.size() && s_[i_] == c) {
      ++i_;
      return true;
    }
    return false;
  }
  void expect(char c) {
    if (!eat(c)) fail(std::string("expected '") + c + "'");
  }
  bool literal(std::string_view w) {
    if (s_.substr(i_, w.size()) == w) {
      i_ += w.size();
      return true;
    }
    return false;
  }
  value parse_value() {
    ws();
    if (i_ >= s_.size()) fail("unexpected end");
    const char c = s_[i_];
    if (c == '{') return parse_object();
    if (c == '[') return parse_array();
    if (c == '"') return value{parse_string()};
    if (literal("null")) return value{nullptr};
    if (literal("true")) return value{true};
    if (literal("false")) return value{false};
    return value{parse_number()};
  }
  value parse_object() {
    expect('{');
    auto o = std::make_shared<object>();
    if (eat('}')) return value{o};
    do {
      ws();
      std::string k = parse_string();
      expect(':');
      (*o)[k] = parse_value();
    } while (eat(','));
    expect('}');
    return value{o};
  }
  value parse_array() {
    expect('[');
    auto a = std::make_shared<array>();
    if (eat(']')) return value{a};
    do a->push_back(parse_value());
    while (eat(','));
    expect(']');
    return value{a};
  }
  std::string parse_string() {
    if (i_ >= s_.size() || s_[i_] != '"') fail("expected a string");
    ++i_;
    std::string out;
    while (true) {
      if (i_ >= s_.size()) fail("unterminated string");
      const auto c = static_cast<unsigned char>(s_[i_++]);
      if (c == '"') return out;
      if (c < 0x20) fail("raw control character in a string");
      if (c != '\\') {
        out += static_cast<char>(c);
        continue;
      }
      if (i_ >= s_.size()) fail("unterminated escape");
      const char e = s_[i_++];
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
          if (i_ + 4 > s_.size()) fail("short \\u escape");
          const unsigned long cp = std::strtoul(std::string(s_.substr(i_, 4)).c_str(), nullptr, 16);
          i_ += 4;
          if (cp < 0x80) out += static_cast<char>(cp);
          else out += '?';  // enough for these tests: only control characters are \u escaped
          break;
        }
        default: fail("bad escape");
      }
    }
  }
  double parse_number() {
    const std::size_t start = i_;
    if (i_ < s_.size() && s_[i_] == '-') ++i_;
    if (i_ >= s_.size() || !(s_[i_] >= '0' && s_[i_] <= '9')) fail("expected a value");
    if (s_[i_] == '0') ++i_;
    else while (i_ < s_.size() && s_[i_] >= '0' && s_[i_] <= '9') ++i_;
    if (i_ < s_.size() && s_[i_] == '.') {
      ++i_;
      if (i_ >= s_.size() || !(s_[i_] >= '0' && s_[i_] <= '9')) fail("digit expected after '.'");
      while (i_ < s_.size() && s_[i_] >= '0' && s_[i_] <= '9') ++i_;
    }
    if (i_ < s_.size() && (s_[i_] == 'e' || s_[i_] == 'E')) {
      ++i_;
      if (i_ < s_.size() && (s_[i_] == '+' || s_[i_] == '-')) ++i_;
      if (i_ >= s_.size() || !(s_[i_] >= '0' && s_[i_] <= '9')) fail("digit expected in exponent");
      while (i_ < s_.size() && s_[i_] >= '0' && s_[i_] <= '9') ++i_;
    }
    return std::strtod(std::string(s_.substr(start, i_ - start)).c_str(), nullptr);
  }

  std::string_view s_;
  std::size_t i_ = 0;
};

[[nodiscard]] inline value parse(std::string_view s) { return parser(s).parse_document(); }

}  // namespace mini_json
