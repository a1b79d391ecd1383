// partrain/rendezvous/detail/store_protocol.hpp: the TCP store's wire format, as pure functions
// (bytes in, parsed message or error out) so the server, the client and the libFuzzer target
// all go through the same code and nothing here touches a socket.
//
// Frame:    u32 payload length (little endian), then the payload.
// Payload:  u8 type, then the fields of that type:
//   string = u32 length + bytes; bytes = u32 length + bytes; int = i64 little endian;
//   list   = u32 count + count strings.
// Requests:  auth(string token) set(string key, bytes value) get(string key, int timeout_ms)
//            add(string key, int delta) wait(list keys, int timeout_ms) check(list keys)
//            delete_key(string key) num_keys()
// Responses: ok() value(bytes) integer(int) boolean(u8 0|1) timeout(list missing) error(string)
// A payload must be consumed exactly: trailing bytes are an error, like any other malformation.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

namespace partrain::inline v0::detail::kvstore {

// Default bound on one message; a larger length prefix closes the connection unread.
inline constexpr std::size_t default_max_message = std::size_t{64} << 20;
// Before a connection has authenticated, only this much is accepted (an auth frame is tiny),
// so an unauthenticated peer cannot make the server allocate a large buffer.
inline constexpr std::size_t max_unauthenticated_message = 4096;
inline constexpr std::size_t frame_header_bytes = 4;

enum class request_type : std::uint8_t {
  auth = 1,
  set = 2,
  get = 3,
  add = 4,
  wait = 5,
  check = 6,
  delete_key = 7,
  num_keys = 8,
};

enum class response_type : std::uint8_t {
  ok = 0x80,
  value = 0x81,
  integer = 0x82,
  boolean = 0x83,
  timeout = 0x84,
  error = 0x85,
};

[[nodiscard]] constexpr std::string_view to_string(request_type t) noexcept {
  switch (t) {
    case request_type::auth: return "auth";
    case request_type::set: return "set";
    case request_type::get: return "get";
    case request_type::add: return "add";
    case request_type::wait: return "wait";
    case request_type::check: return "check";
    case request_type::delete_key: return "delete_key";
    case request_type::num_keys: return "num_keys";
  }
  return "unknown";
}

struct request {
  request_type type = request_type::num_keys;
  std::string key{};              // auth: the token
  std::vector<std::byte> value{}; // set
  std::vector<std::string> keys{};  // wait, check
  std::int64_t number = 0;        // add: delta; get, wait: timeout in ms
  friend bool operator==(const request&, const request&) = default;
};

struct response {
  response_type type = response_type::ok;
  std::vector<std::byte> value{};   // value
  std::int64_t number = 0;        // integer, boolean
  std::vector<std::string> keys{};  // timeout: the keys still missing
  std::string message{};           // error
  friend bool operator==(const response&, const response&) = default;
};

struct protocol_error {
  std::string what;
};

template <class T>
using parse_result = std::variant<T, protocol_error>;

// ---- framing ----

enum class frame_status { incomplete, ready, oversized };

struct frame_view {
  frame_status status = frame_status::incomplete;
  std::size_t payload_bytes = 0;  // ready/oversized: the announced payload length
};

// Looks at the front of buf: is a whole frame there, and may it be read at all?
[[nodiscard]] inline frame_view peek_frame(std::span<const std::byte> buf, std::size_t max_payload) noexcept {
  if (buf.size() < frame_header_bytes) return {};
  std::uint32_t len = 0;
  for (std::size_t i = 0; i < 4; ++i) len |= std::uint32_t(std::to_integer<std::uint8_t>(buf[i])) << (8 * i);
  if (len > max_payload) return {frame_status::oversized, len};
  if (buf.size() - frame_header_bytes < len) return {frame_status::incomplete, len};
  return {frame_status::ready, len};
}

// ---- encoding ----

class byte_writer {
 public:
  byte_writer() { out_.resize(frame_header_bytes); }  // room for the length prefix
  void u8(std::uint8_t v) { out_.push_back(std::byte{v}); }
  void u32(std::uint32_t v) {
    for (int i = 0; i < 4; ++i) out_.push_back(std::byte(static_cast<std::uint8_t>(v >> (8 * i))));
  }
  void i64(std::int64_t v) {
    const auto u = static_cast<std::uint64_t>(v);
    for (int i = 0; i < 8; ++i) out_.push_back(std::byte(static_cast<std::uint8_t>(u >> (8 * i))));
  }
  void bytes(std::span<const std::byte> b) {
    u32(static_cast<std::uint32_t>(b.size()));
    out_.insert(out_.end(), b.begin(), b.end());
  }
  void str(std::string_view s) { bytes(std::as_bytes(std::span(s.data(), s.size()))); }
  void list(const std::vector<std::string>& l) {
    u32(static_cast<std::uint32_t>(l.size()));
    for (const auto& s : l) str(s);
  }
  // The finished frame, length prefix filled in.
  [[nodiscard]] std::vector<std::byte> finish() && {
    const auto len = static_cast<std::uint32_t>(out_.size() - frame_header_bytes);
    for (std::size_t i = 0; i < 4; ++i) out_[i] = std::byte(static_cast<std::uint8_t>(len >> (8 * i)));
    return std::move(out_);
  }

 private:
  std::vector<std::byte> out_;
};

// A whole frame (length prefix included) for a request.
[[nodiscard]] inline std::vector<std::byte> encode(const request& r) {
  byte_writer w;
  w.u8(static_cast<std::uint8_t>(r.type));
  switch (r.type) {
    case request_type::auth: w.str(r.key); break;
    case request_type::set: w.str(r.key); w.bytes(r.value); break;
    case request_type::get: w.str(r.key); w.i64(r.number); break;
    case request_type::add: w.str(r.key); w.i64(r.number); break;
    case request_type::wait: w.list(r.keys); w.i64(r.number); break;
    case request_type::check: w.list(r.keys); break;
    case request_type::delete_key: w.str(r.key); break;
    case request_type::num_keys: break;
  }
  return std::move(w).finish();
}

[[nodiscard]] inline std::vector<std::byte> encode(const response& r) {
  byte_writer w;
  w.u8(static_cast<std::uint8_t>(r.type));
  switch (r.type) {
    case response_type::ok: break;
    case response_type::value: w.bytes(r.value); break;
    case response_type::integer: w.i64(r.number); break;
    case response_type::boolean: w.u8(r.number != 0 ? 1 : 0); break;
    case response_type::timeout: w.list(r.keys); break;
    case response_type::error: w.str(r.message); break;
  }
  return std::move(w).finish();
}

// ---- decoding ----

// Bounds-checked reads from a payload; every getter returns false instead of reading past the end.
class byte_reader {
 public:
  explicit byte_reader(std::span<const std::byte> in) noexcept : in_(in) {}
  [[nodiscard]] bool u8(std::uint8_t& v) noexcept {
    if (in_.empty()) return false;
    v = std::to_integer<std::uint8_t>(in_[0]);
    in_ = in_.subspan(1);
    return true;
  }
  [[nodiscard]] bool u32(std::uint32_t& v) noexcept {
    if (in_.size() < 4) return false;
    v = 0;
    for (std::size_t i = 0; i < 4; ++i) v |= std::uint32_t(std::to_integer<std::uint8_t>(in_[i])) << (8 * i);
    in_ = in_.subspan(4);
    return true;
  }
  [[nodiscard]] bool i64(std::int64_t& v) noexcept {
    if (in_.size() < 8) return false;
    std::uint64_t u = 0;
    for (std::size_t i = 0; i < 8; ++i) u |= std::uint64_t(std::to_integer<std::uint8_t>(in_[i])) << (8 * i);
    v = static_cast<std::int64_t>(u);
    in_ = in_.subspan(8);
    return true;
  }
  [[nodiscard]] bool bytes(std::vector<std::byte>& v) {
    std::uint32_t n = 0;
    if (!u32(n) || in_.size() < n) return false;
    v.assign(in_.begin(), in_.begin() + n);
    in_ = in_.subspan(n);
    return true;
  }
  [[nodiscard]] bool str(std::string& s) {
    std::uint32_t n = 0;
    if (!u32(n) || in_.size() < n) return false;
    s.assign(reinterpret_cast<const char*>(in_.data()), n);
    in_ = in_.subspan(n);
    return true;
  }
  [[nodiscard]] bool list(std::vector<std::string>& l) {
    std::uint32_t n = 0;
    // Each string needs at least its 4-byte length: a count the payload cannot hold is
    // rejected before anything is reserved.
    if (!u32(n) || n > in_.size() / 4) return false;
    l.clear();
    l.reserve(n);
    for (std::uint32_t i = 0; i < n; ++i) {
      if (!str(l.emplace_back())) return false;
    }
    return true;
  }
  [[nodiscard]] bool done() const noexcept { return in_.empty(); }
  [[nodiscard]] std::size_t left() const noexcept { return in_.size(); }

 private:
  std::span<const std::byte> in_;
};

// Parses one request payload (the bytes after the length prefix).
[[nodiscard]] inline parse_result<request> parse_request(std::span<const std::byte> payload) {
  byte_reader rd(payload);
  std::uint8_t type = 0;
  if (!rd.u8(type)) return protocol_error{"empty message"};
  request r;
  r.type = static_cast<request_type>(type);
  bool ok = false;
  switch (r.type) {
    case request_type::auth: ok = rd.str(r.key); break;
    case request_type::set: ok = rd.str(r.key) && rd.bytes(r.value); break;
    case request_type::get: ok = rd.str(r.key) && rd.i64(r.number) && r.number >= 0; break;
    case request_type::add: ok = rd.str(r.key) && rd.i64(r.number); break;
    case request_type::wait: ok = rd.list(r.keys) && rd.i64(r.number) && r.number >= 0; break;
    case request_type::check: ok = rd.list(r.keys); break;
    case request_type::delete_key: ok = rd.str(r.key); break;
    case request_type::num_keys: ok = true; break;
    default: return protocol_error{"unknown request type " + std::to_string(type)};
  }
  if (!ok) return protocol_error{"malformed " + std::string(to_string(r.type)) + " request (truncated field or bad value)"};
  if (!rd.done()) {
    return protocol_error{std::to_string(rd.left()) + " trailing byte(s) after a " + std::string(to_string(r.type)) +
                          " request"};
  }
  return r;
}

[[nodiscard]] inline parse_result<response> parse_response(std::span<const std::byte> payload) {
  byte_reader rd(payload);
  std::uint8_t type = 0;
  if (!rd.u8(type)) return protocol_error{"empty reply"};
  response r;
  r.type = static_cast<response_type>(type);
  bool ok = false;
  switch (r.type) {
    case response_type::ok: ok = true; break;
    case response_type::value: ok = rd.bytes(r.value); break;
    case response_type::integer: ok = rd.i64(r.number); break;
    case response_type::boolean: {
      std::uint8_t b = 0;
      ok = rd.u8(b) && b <= 1;
      r.number = b;
      break;
    }
    case response_type::timeout: ok = rd.list(r.keys); break;
    case response_type::error: ok = rd.str(r.message); break;
    default: return protocol_error{"unknown reply type " + std::to_string(type)};
  }
  if (!ok || !rd.done()) return protocol_error{"malformed reply of type " + std::to_string(type)};
  return r;
}

// Compares secrets in time independent of where they differ (only the length leaks).
[[nodiscard]] inline bool constant_time_equal(std::string_view a, std::string_view b) noexcept {
  unsigned diff = a.size() == b.size() ? 0u : 1u;
  if (b.empty()) return a.empty();
  for (std::size_t i = 0; i < a.size(); ++i) {
    diff |= static_cast<unsigned>(static_cast<unsigned char>(a[i]) ^ static_cast<unsigned char>(b[i % b.size()]));
  }
  return diff == 0;
}

}  // namespace partrain::inline v0::detail::kvstore
