#include <catch2/catch.hpp>

#include <partrain/rendezvous/detail/socket.hpp>
#include <partrain/rendezvous/detail/store_protocol.hpp>
#include <partrain/rendezvous/file_store.hpp>
#include <partrain/rendezvous/prefix_store.hpp>
#include <partrain/rendezvous/tcp_store.hpp>

#include "fifo.hpp"
#include "fork_ranks.hpp"
#include "store_process.hpp"

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <random>
#include <string>
#include <thread>
#include <vector>

using namespace partrain;
using namespace std::chrono_literals;

namespace {

tcp_store_options server_opts(std::string token = {}) {
  tcp_store_options o;
  o.is_server = true;
  o.timeout = 5s;
  o.token = std::move(token);
  o.who = "rank 0";
  return o;
}

tcp_store_options client_opts(std::uint16_t port, std::string token = {}) {
  tcp_store_options o;
  o.port = port;
  o.timeout = 5s;
  o.token = std::move(token);
  o.who = "rank 1";
  o.rank = 1;
  return o;
}

std::vector<std::byte> bytes_of(std::string_view s) {
  const auto* p = reinterpret_cast<const std::byte*>(s.data());
  return {p, p + s.size()};
}

// A raw connection for speaking (or mangling) the protocol by hand.
struct raw_client {
  detail::unique_fd fd;
  explicit raw_client(std::uint16_t port)
      : fd(detail::connect_tcp("127.0.0.1", port, detail::deadline_clock::now() + 5s)) {}
  void send(std::span<const std::byte> b) { detail::send_all(fd.get(), b, detail::deadline_clock::now() + 5s, "raw"); }
  // The next reply frame, or nullopt when the server closed the connection.
  std::optional<detail::kvstore::response> read_reply() {
    std::byte header[4];
    try {
      detail::recv_all(fd.get(), header, detail::deadline_clock::now() + 5s, "raw");
    } catch (const timeout_error&) {
      throw;
    } catch (const communication_error&) {
      return std::nullopt;
    }
    const auto f = detail::kvstore::peek_frame(header, 1 << 20);
    std::vector<std::byte> payload(f.payload_bytes);
    detail::recv_all(fd.get(), payload, detail::deadline_clock::now() + 5s, "raw");
    auto r = detail::kvstore::parse_response(payload);
    REQUIRE(std::holds_alternative<detail::kvstore::response>(r));
    return std::get<detail::kvstore::response>(r);
  }
  // True when the server has closed the connection (EOF within 5 s).
  bool closed_by_server() {
    for (;;) {
      std::byte b[256];
      if (!detail::wait_fd(fd.get(), POLLIN, detail::deadline_clock::now() + 5s)) return false;
      const auto n = ::recv(fd.get(), b, sizeof b, 0);
      if (n == 0) return true;
      if (n < 0 && errno != EINTR && errno != EAGAIN) return true;  // reset also counts
    }
  }
};

}  // namespace

TEST_CASE("store protocol round-trips every message type", "[comm][store][protocol]") {
  using detail::kvstore::request_type;
  std::vector<detail::kvstore::request> reqs = {
      {.type = request_type::auth, .key = "secret"},
      {.type = request_type::set, .key = "k", .value = bytes_of("value\0with nul")},
      {.type = request_type::get, .key = "k", .number = 1500},
      {.type = request_type::add, .key = "counter", .number = -7},
      {.type = request_type::wait, .keys = {"a", "", "ccc"}, .number = 0},
      {.type = request_type::check, .keys = {}},
      {.type = request_type::delete_key, .key = "x"},
      {.type = request_type::num_keys},
  };
  for (const auto& r : reqs) {
    const auto frame = detail::kvstore::encode(r);
    const auto f = detail::kvstore::peek_frame(frame, detail::kvstore::default_max_message);
    REQUIRE(f.status == detail::kvstore::frame_status::ready);
    REQUIRE(f.payload_bytes + 4 == frame.size());
    const auto payload = std::span<const std::byte>(frame).subspan(4);
    auto parsed = detail::kvstore::parse_request(payload);
    REQUIRE(std::holds_alternative<detail::kvstore::request>(parsed));
    CHECK(std::get<detail::kvstore::request>(parsed) == r);
    // Every strict prefix of a payload is malformed (never read past the end, never accepted).
    for (std::size_t cut = 0; cut < payload.size(); ++cut) {
      auto p = detail::kvstore::parse_request(payload.first(cut));
      // A prefix may happen to parse only if it is the whole of a field-less request.
      if (cut > 0 && std::holds_alternative<detail::kvstore::request>(p)) FAIL("prefix of length " << cut << " accepted");
    }
    // A trailing byte is an error too.
    std::vector<std::byte> longer(payload.begin(), payload.end());
    longer.push_back(std::byte{0});
    CHECK(std::holds_alternative<detail::kvstore::protocol_error>(detail::kvstore::parse_request(longer)));
  }
  std::vector<detail::kvstore::response> resps = {
      {.type = detail::kvstore::response_type::ok},
      {.type = detail::kvstore::response_type::value, .value = bytes_of("v")},
      {.type = detail::kvstore::response_type::integer, .number = -42},
      {.type = detail::kvstore::response_type::boolean, .number = 1},
      {.type = detail::kvstore::response_type::timeout, .keys = {"k1", "k2"}},
      {.type = detail::kvstore::response_type::error, .message = "nope"},
  };
  for (const auto& r : resps) {
    const auto frame = detail::kvstore::encode(r);
    auto parsed = detail::kvstore::parse_response(std::span<const std::byte>(frame).subspan(4));
    REQUIRE(std::holds_alternative<detail::kvstore::response>(parsed));
    CHECK(std::get<detail::kvstore::response>(parsed) == r);
  }
}

TEST_CASE("store protocol rejects malformed payloads with a reason", "[comm][store][protocol]") {
  auto err = [](std::vector<std::byte> p) {
    auto r = detail::kvstore::parse_request(p);
    REQUIRE(std::holds_alternative<detail::kvstore::protocol_error>(r));
    return std::get<detail::kvstore::protocol_error>(r).what;
  };
  CHECK_THAT(err({}), Catch::Contains("empty"));
  CHECK_THAT(err({std::byte{99}}), Catch::Contains("unknown request type 99"));
  // wait with a key count of 0xFFFFFFFF in a 9-byte payload: rejected before reserving anything.
  CHECK_THAT(err({std::byte{5}, std::byte{0xFF}, std::byte{0xFF}, std::byte{0xFF}, std::byte{0xFF}, std::byte{0},
                  std::byte{0}, std::byte{0}, std::byte{0}}),
             Catch::Contains("malformed wait"));
  // get with a negative timeout.
  detail::kvstore::request g{.type = detail::kvstore::request_type::get, .key = "k", .number = -1};
  const auto frame = detail::kvstore::encode(g);
  CHECK_THAT(err({frame.begin() + 4, frame.end()}), Catch::Contains("malformed get"));
  // A frame header announcing more than the limit.
  const std::vector<std::byte> big = {std::byte{0}, std::byte{0}, std::byte{0}, std::byte{0x40}};
  CHECK(detail::kvstore::peek_frame(big, detail::kvstore::default_max_message).status == detail::kvstore::frame_status::oversized);
  CHECK(detail::kvstore::constant_time_equal("abc", "abc"));
  CHECK_FALSE(detail::kvstore::constant_time_equal("abc", "abd"));
  CHECK_FALSE(detail::kvstore::constant_time_equal("abc", "abcd"));
  CHECK_FALSE(detail::kvstore::constant_time_equal("abc", ""));
  CHECK_FALSE(detail::kvstore::constant_time_equal("", "abc"));
}

TEST_CASE("tcp_store set/get/add/wait/check", "[comm][store][tcp]") {
  tcp_store master(server_opts());
  REQUIRE(master.port() != 0);
  tcp_store client(client_opts(master.port()));

  master.set("greeting", "hello");
  CHECK(client.get_string("greeting", 1s) == "hello");
  const std::vector<std::byte> binary = {std::byte{0}, std::byte{255}, std::byte{7}};
  client.set("bin", binary);
  CHECK(master.get("bin", 1s) == binary);
  client.set("empty", "");
  CHECK(master.get("empty", 1s).empty());

  CHECK(client.add("n", 5) == 5);
  CHECK(master.add("n", -2) == 3);
  CHECK(client.get_string("n", 1s) == "3");  // counters are decimal text, as in torch
  master.set("text", "abc");
  CHECK_THROWS_WITH(client.add("text", 1), Catch::Contains("non-integer"));

  CHECK(client.check({"greeting", "n"}));
  CHECK_FALSE(client.check({"greeting", "absent"}));
  CHECK(client.check({}));
  client.wait({"greeting", "bin"}, 1s);

  CHECK(client.num_keys() == 5);
  CHECK(client.delete_key("text"));
  CHECK_FALSE(client.delete_key("text"));
  CHECK_FALSE(master.check({"text"}));

  // A wait is answered when another client sets the key.
  std::jthread later([&] {
    std::this_thread::sleep_for(50ms);
    master.set("late", "x");
  });
  CHECK(client.get_string("late", 5s) == "x");
}

TEST_CASE("tcp_store timeouts name the missing keys", "[comm][store][tcp][timeout]") {
  tcp_store master(server_opts());
  tcp_store client(client_opts(master.port()));
  client.set("here", "1");
  const auto t0 = std::chrono::steady_clock::now();
  CHECK_THROWS_AS(client.get("never", 100ms), timeout_error);
  CHECK_THROWS_WITH(client.get("never", 50ms), Catch::Contains("'never'") && Catch::Contains("rank 1"));
  CHECK_THROWS_WITH(client.wait({"here", "gone1", "gone2"}, 50ms),
                    Catch::Contains("'gone1', 'gone2'") && !Catch::Contains("'here'"));
  CHECK(std::chrono::steady_clock::now() - t0 < 4s);  // hang guard only
  // The same facts as fields: who waited, in which operation, for how long.
  try {
    (void)client.get("never", 60ms);
    FAIL("get of a key never set returned");
  } catch (const timeout_error& e) {
    CHECK(e.rank() == 1);
    CHECK(e.operation() == "store get");
    CHECK(e.timeout() == 60ms);
  }
  try {
    client.wait({"here", "gone1"}, 70ms);
    FAIL("wait for a key never set returned");
  } catch (const timeout_error& e) {
    CHECK(e.rank() == 1);
    CHECK(e.operation() == "store wait");
    CHECK(e.timeout() == 70ms);
  }
  // The connection is still usable after a timed-out wait.
  CHECK(client.get_string("here", 1s) == "1");
  CHECK_THROWS_AS(client.get("k", -1ms), invalid_argument_error);
}

TEST_CASE("tcp_store serves many concurrent clients", "[comm][store][tcp]") {
  tcp_store master(server_opts());
  constexpr int clients = 16, adds = 50;
  std::atomic<int> failures{0};
  {
    std::vector<std::jthread> threads;
    for (int i = 0; i < clients; ++i) {
      threads.emplace_back([&, i] {
        try {
          tcp_store c(client_opts(master.port()));
          for (int k = 0; k < adds; ++k) c.add("counter", 1);
          c.set("done/" + std::to_string(i), std::to_string(i));
          std::vector<std::string> all;
          for (int j = 0; j < clients; ++j) all.push_back("done/" + std::to_string(j));
          c.wait(all, 10s);  // a barrier through the store
          if (c.get_string("done/" + std::to_string((i + 1) % clients), 1s) != std::to_string((i + 1) % clients)) ++failures;
        } catch (...) {
          ++failures;
        }
      });
    }
  }
  CHECK(failures == 0);
  CHECK(master.get_string("counter", 1s) == std::to_string(clients * adds));
}

TEST_CASE("tcp_store with a job token refuses peers without it", "[comm][store][tcp][security]") {
  tcp_store master(server_opts("s3cret-token"));
  master.set("job/key", "private");

  tcp_store good(client_opts(master.port(), "s3cret-token"));
  CHECK(good.get_string("job/key", 1s) == "private");

  CHECK_THROWS_WITH(tcp_store(client_opts(master.port(), "wrong-token")), Catch::Contains("wrong job token"));
  // No token at all: refused when connecting.
  CHECK_THROWS_WITH(tcp_store(client_opts(master.port())), Catch::Contains("unauthorized") && Catch::Contains("token"));

  // By hand: a set before auth is answered with an error and the connection is closed.
  raw_client raw(master.port());
  raw.send(detail::kvstore::encode(detail::kvstore::request{.type = detail::kvstore::request_type::set, .key = "job/key", .value = bytes_of("x")}));
  auto reply = raw.read_reply();
  REQUIRE(reply);
  CHECK(reply->type == detail::kvstore::response_type::error);
  CHECK(raw.closed_by_server());
  CHECK(good.get_string("job/key", 1s) == "private");
  // Unauthenticated peers may not even announce a large message.
  raw_client big(master.port());
  big.send(std::vector<std::byte>{std::byte{0}, std::byte{0}, std::byte{1}, std::byte{0}});  // 64 KiB
  CHECK(big.closed_by_server());
  CHECK(master.server()->rejected_connections() >= 3);
}

TEST_CASE("tcp_store_server closes connections that never authenticate", "[comm][store][tcp][security]") {
  tcp_store_server server({.host = "127.0.0.1", .port = 0, .token = "t", .auth_timeout = 200ms});
  raw_client idle(server.port());
  const auto t0 = std::chrono::steady_clock::now();
  CHECK(idle.closed_by_server());
  CHECK(std::chrono::steady_clock::now() - t0 >= 150ms);
  // An authenticated one stays.
  tcp_store_options o = client_opts(server.port(), "t");
  tcp_store c(o);
  std::this_thread::sleep_for(300ms);
  CHECK(c.add("still", 1) == 1);
  CHECK(server.rejected_connections() == 1);
}

TEST_CASE("tcp_store survives garbage, truncated and oversized messages", "[comm][store][tcp][robustness]") {
  tcp_store_options so = server_opts();
  so.max_message_bytes = 1 << 16;
  tcp_store master(so);
  master.set("k", "v");

  SECTION("garbage") {
    std::mt19937 rng(42);
    for (int round = 0; round < 20; ++round) {
      raw_client raw(master.port());
      std::vector<std::byte> junk(64 + rng() % 512);
      for (auto& b : junk) b = std::byte(static_cast<std::uint8_t>(rng()));
      junk[0] = std::byte{32};  // a small length, so the body is parsed (and rejected) at once
      junk[1] = junk[2] = junk[3] = std::byte{0};
      junk[4] = std::byte{200};  // no such request type
      raw.send(junk);
      CHECK(raw.closed_by_server());
    }
  }
  SECTION("oversized") {
    raw_client raw(master.port());
    raw.send(std::vector<std::byte>{std::byte{0xFF}, std::byte{0xFF}, std::byte{0xFF}, std::byte{0x7F}});
    auto reply = raw.read_reply();
    REQUIRE(reply);
    CHECK(reply->type == detail::kvstore::response_type::error);
    CHECK_THAT(reply->message, Catch::Contains("exceeds the limit"));
    CHECK(raw.closed_by_server());
    // The client refuses to send one too.
    tcp_store_options co = client_opts(master.port());
    co.max_message_bytes = 1 << 16;
    tcp_store c(co);
    CHECK_THROWS_AS(c.set("huge", std::string(1 << 17, 'x')), invalid_argument_error);
  }
  SECTION("truncated, then the peer leaves") {
    for (int i = 0; i < 5; ++i) {
      raw_client raw(master.port());
      auto frame = detail::kvstore::encode(detail::kvstore::request{.type = detail::kvstore::request_type::set, .key = "t", .value = bytes_of("abc")});
      frame.resize(frame.size() - 2);
      raw.send(frame);
    }
    // A request followed at once by EOF still counts.
    {
      raw_client raw(master.port());
      raw.send(detail::kvstore::encode(detail::kvstore::request{.type = detail::kvstore::request_type::set, .key = "t2", .value = bytes_of("y")}));
    }
    tcp_store c(client_opts(master.port()));
    CHECK(c.get_string("t2", 2s) == "y");
    CHECK_FALSE(c.check({"t"}));
  }
  SECTION("a waiter whose peer vanished") {
    raw_client raw(master.port());
    raw.send(detail::kvstore::encode(detail::kvstore::request{.type = detail::kvstore::request_type::get, .key = "later", .number = 60'000}));
    raw.fd.reset();
    std::this_thread::sleep_for(20ms);
    master.set("later", "x");  // answers a waiter that is gone: the server must not fall over
    CHECK(master.check({"later"}));
  }
  // Whatever happened above, the server keeps serving well-formed clients.
  tcp_store c(client_opts(master.port()));
  CHECK(c.get_string("k", 1s) == "v");
  CHECK(c.add("after", 1) == 1);
}

TEST_CASE("tcp_store reports a port in use and an unreachable master", "[comm][store][tcp][errors]") {
  tcp_store master(server_opts());
  tcp_store_options again = server_opts();
  again.port = master.port();
  CHECK_THROWS_WITH(tcp_store(again), Catch::Contains("port " + std::to_string(master.port())) &&
                                          Catch::Contains("already in use"));

  const std::uint16_t nobody = detail::find_free_port();
  tcp_store_options co = client_opts(nobody);
  co.timeout = 300ms;
  const auto t0 = std::chrono::steady_clock::now();
  CHECK_THROWS_AS(tcp_store(co), timeout_error);
  CHECK_THROWS_WITH(tcp_store(co), Catch::Contains("127.0.0.1:" + std::to_string(nobody)) && Catch::Contains("rank 1"));
  CHECK(std::chrono::steady_clock::now() - t0 < 5s);

  tcp_store_options zero = client_opts(0);
  CHECK_THROWS_AS(tcp_store(zero), config_error);
  tcp_store_options bad_host = client_opts(1234);
  bad_host.host = "no.such.host.invalid";
  bad_host.timeout = 200ms;
  CHECK_THROWS_WITH(tcp_store(bad_host), Catch::Contains("no.such.host.invalid"));
}

TEST_CASE("tcp_store client connects to a server that comes up later", "[comm][store][tcp]") {
  const std::uint16_t port = detail::find_free_port();
  std::jthread server_thread;
  std::unique_ptr<tcp_store_server> server;
  std::mutex m;
  server_thread = std::jthread([&] {
    std::this_thread::sleep_for(100ms);
    std::lock_guard lock(m);
    server = std::make_unique<tcp_store_server>(tcp_store_server_options{.port = port});
  });
  tcp_store c(client_opts(port));
  c.set("k", "v");
  CHECK(c.get_string("k", 1s) == "v");
  server_thread.join();
}

TEST_CASE("tcp_store client whose server vanished fails within the reconnect window, not its timeout",
          "[comm][store][tcp][errors]") {
  auto server = std::make_unique<tcp_store_server>(tcp_store_server_options{});
  tcp_store_options co = client_opts(server->port());
  co.timeout = 60s;
  co.reconnect_timeout = 500ms;
  tcp_store c(co);
  c.set("k", "v");
  server.reset();  // node 0's agent, or rank 0, is gone
  const auto t0 = std::chrono::steady_clock::now();
  CHECK_THROWS_AS(c.set("k", "w"), communication_error);  // the broken connection
  CHECK_THROWS_WITH(c.check({"k"}), Catch::Contains("lost the connection to the store at 127.0.0.1:" + std::to_string(co.port)) &&
                                        Catch::Contains("did not come back within 500 ms"));
  try {
    c.add("k", 1);
    FAIL("add on a store whose server is gone returned");
  } catch (const timeout_error&) {
    FAIL("a lost connection is not a timeout");
  } catch (const communication_error& e) {
    CHECK(e.rank() == 1);
    CHECK(e.operation() == "store add");
  }
  CHECK(std::chrono::steady_clock::now() - t0 < 5s);
  tcp_store_options bad = client_opts(co.port);
  bad.reconnect_timeout = 0ms;
  CHECK_THROWS_WITH(tcp_store(bad), Catch::Contains("reconnect_timeout 0 ms"));
}

TEST_CASE("prefix_store keeps key spaces apart", "[comm][store][prefix]") {
  auto base = std::make_shared<tcp_store>(server_opts());
  prefix_store a("attempt_0", base), b("attempt_1", base);
  a.set("k", "from a");
  b.set("k", "from b");
  CHECK(a.get_string("k", 1s) == "from a");
  CHECK(b.get_string("k", 1s) == "from b");
  CHECK(base->get_string("attempt_0/k", 1s) == "from a");
  CHECK(a.add("c", 2) == 2);
  CHECK(b.add("c", 5) == 5);
  CHECK(a.check({"k", "c"}));
  CHECK_FALSE(a.check({"only_b"}));
  b.set("only_b", "1");
  CHECK_FALSE(a.check({"only_b"}));
  CHECK_THROWS_WITH(a.wait({"only_b"}, 50ms), Catch::Contains("attempt_0/only_b"));
  CHECK_THROWS_AS(prefix_store("p", nullptr), invalid_argument_error);
}

namespace {
std::string temp_path(const std::string& name) {
  auto dir = std::filesystem::temp_directory_path() / ("partrain_rdzv_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  auto p = dir / name;
  std::filesystem::remove(p);
  return p.string();
}
}  // namespace

TEST_CASE("file_store set/get/add/wait/check in one process", "[comm][store][file]") {
  const auto path = temp_path("basic");
  file_store s(path, 5s);
  s.set("a", "1");
  CHECK(s.get_string("a", 1s) == "1");
  s.set("a", "2");  // last write wins
  CHECK(s.get_string("a", 1s) == "2");
  CHECK(s.add("n", 3) == 3);
  CHECK(s.add("n", 4) == 7);
  CHECK(s.check({"a", "n"}));
  CHECK_FALSE(s.check({"zzz"}));
  CHECK_THROWS_WITH(s.get("zzz", 50ms), Catch::Contains("'zzz'") && Catch::Contains(path));
  CHECK_THROWS_WITH(s.wait({"a", "y1"}, 50ms), Catch::Contains("'y1'") && !Catch::Contains("'a'"));
  CHECK(s.num_keys() == 2);
  CHECK(s.delete_key("a"));
  CHECK_FALSE(s.check({"a"}));
  // A second handle on the same file (a second "rank") sees the same keys.
  file_store other(path, 5s);
  CHECK(other.get_string("n", 1s) == "7");
  CHECK(other.add("n", 1) == 8);
  CHECK(s.get_string("n", 1s) == "8");

  // A record torn by a writer that died mid-append is ignored, then overwritten.
  {
    const int fd = ::open(path.c_str(), O_WRONLY | O_APPEND);
    REQUIRE(fd >= 0);
    const unsigned char torn[] = {5, 0, 0, 0, 'h', 'a'};
    CHECK(::write(fd, torn, sizeof torn) == static_cast<ssize_t>(sizeof torn));
    ::close(fd);
  }
  CHECK(s.check({"n"}));
  s.set("after", "ok");
  CHECK(other.get_string("after", 1s) == "ok");
  CHECK(other.get_string("n", 1s) == "8");
  CHECK_THROWS_AS(file_store("/nonexistent-dir/x/y"), config_error);
  // A timed-out get carries the caller's rank, the operation and the deadline.
  file_store ranked(path, 5s, "rank 2", 2);
  try {
    (void)ranked.get("never", 30ms);
    FAIL("get of a key never set returned");
  } catch (const timeout_error& e) {
    CHECK_THAT(e.what(), Catch::Contains("rank 2: file_store get('never')"));
    CHECK(e.rank() == 2);
    CHECK(e.operation() == "store get");
    CHECK(e.timeout() == 30ms);
  }
  std::filesystem::remove(path);
}

TEST_CASE("file_store refuses a FIFO or a device by name", "[comm][store][file][hostile]") {
  const auto fifo = partrain::testing::make_fifo(std::filesystem::temp_directory_path() /
                                                 ("partrain_store_fifo_" + std::to_string(::getpid())));
  CHECK_THROWS_AS(file_store(fifo.string()), config_error);
  CHECK_THROWS_WITH(file_store(fifo.string()), Catch::Contains("'" + fifo.string() + "' is a FIFO, expected a regular file"));
  std::filesystem::remove(fifo);
  CHECK_THROWS_WITH(file_store("/dev/zero"), Catch::Contains("'/dev/zero' is a character device, expected a regular file"));
}

TEST_CASE("file_store works across processes", "[comm][store][file][processes]") {
  const auto path = temp_path("procs");
  constexpr int ranks = 3, adds = 40;
  auto outcomes = partrain::testing::fork_ranks(ranks, [&](int rank) {
    file_store s(path, 10s);
    for (int i = 0; i < adds; ++i) s.add("counter", 1);
    s.set("rank/" + std::to_string(rank), std::to_string(rank * 10));
    s.wait({"rank/0", "rank/1", "rank/2"}, 10s);
    const int peer = (rank + 1) % ranks;
    if (s.get_string("rank/" + std::to_string(peer), 1s) != std::to_string(peer * 10)) {
      throw std::runtime_error("rank " + std::to_string(rank) + " read a wrong value");
    }
  }, 30s);
  for (int r = 0; r < ranks; ++r) {
    INFO("rank " << r << ": " << outcomes[static_cast<std::size_t>(r)].message);
    CHECK(outcomes[static_cast<std::size_t>(r)].ok);
  }
  file_store s(path, 5s);
  CHECK(s.get_string("counter", 1s) == std::to_string(ranks * adds));
  std::filesystem::remove(path);
}

TEST_CASE("tcp_store works across processes", "[comm][store][tcp][processes]") {
  partrain::testing::store_process server({.token = "tok"});  // no server thread here while forking
  const auto port = server.port();
  auto outcomes = partrain::testing::fork_ranks(2, [&](int rank) {
    tcp_store c(client_opts(port, "tok"));
    c.add("arrived", 1);
    c.set("from/" + std::to_string(rank), "hi");
    c.wait({"from/0", "from/1"}, 10s);
  }, 30s);
  for (const auto& o : outcomes) {
    INFO(o.message);
    CHECK(o.ok);
  }
  tcp_store reader(client_opts(port, "tok"));
  CHECK(reader.get_string("arrived", 1s) == "2");
}
