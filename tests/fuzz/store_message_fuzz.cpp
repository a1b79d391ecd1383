// libFuzzer target for the TCP store's wire format: the input is what a peer might send on a
// connection, a stream of frames. Every frame either parses or is rejected with a reason;
// nothing may crash, read out of bounds or allocate past the frame, and what parses must
// re-encode to exactly the bytes it came from (the encoding is canonical, so the parser
// cannot accept two spellings of one message). Build and run: see tests/fuzz/store.cmake.
// With PARTRAIN_FUZZ_REPLAY_MAIN it is a plain program that replays files (the seed corpus in
// the normal test suite, where clang's libFuzzer is not used).
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>
#include <variant>
#include <vector>

#include <partrain/rendezvous/detail/store_protocol.hpp>

namespace {

namespace d = partrain::detail::kvstore;

void check_frame(std::span<const std::byte> frame, std::span<const std::byte> payload) {
  auto req = d::parse_request(payload);
  if (auto* r = std::get_if<d::request>(&req)) {
    const auto again = d::encode(*r);
    if (!std::equal(again.begin(), again.end(), frame.begin(), frame.end())) __builtin_trap();
  } else if (std::get<d::protocol_error>(req).what.empty()) {
    __builtin_trap();  // a rejection always says why
  }
  auto resp = d::parse_response(payload);
  if (auto* r = std::get_if<d::response>(&resp)) {
    const auto again = d::encode(*r);
    if (!std::equal(again.begin(), again.end(), frame.begin(), frame.end())) __builtin_trap();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  std::span<const std::byte> stream(reinterpret_cast<const std::byte*>(data), size);
  // The authenticated limit is lowered so that "oversized" is reachable with small inputs.
  constexpr std::size_t limit = 1 << 16;
  while (!stream.empty()) {
    const auto f = d::peek_frame(stream, limit);
    if (f.status != d::frame_status::ready) break;  // the server waits for more, or closes
    const auto frame = stream.first(d::frame_header_bytes + f.payload_bytes);
    check_frame(frame, frame.subspan(d::frame_header_bytes));
    stream = stream.subspan(frame.size());
  }
  const auto head = std::string_view(reinterpret_cast<const char*>(data), std::min<std::size_t>(size, 16));
  if (d::constant_time_equal(head, head) != true) __builtin_trap();
  return 0;
}

#include "replay_main.hpp"
