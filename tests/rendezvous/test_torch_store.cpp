// The client of PyTorch's TCPStore (rendezvous/torch_store.hpp). One scenario drives every
// command: against a recorded exchange with PyTorch's real server (torch_store_exchange.txt,
// replayed by a server thread here that checks every byte the client sends), and, in the hidden
// [.torch] case that tests/rendezvous/torch_interop.sh runs where PyTorch is installed, against
// the real server itself (torch_store_peer.py), which also reads back what the client set.
// Re-record with:
//   tests/rendezvous/torch_interop.sh --record build/peers-venv/bin/python build
// Also: env:// under torchrun reads the agent-store flag and the restart count, and the client
// refuses a server that is not a TCPStore within its timeout.
#include <catch2/catch.hpp>

#include <partrain/rendezvous/detail/socket.hpp>
#include <partrain/rendezvous/rendezvous.hpp>
#include <partrain/rendezvous/tcp_store_server.hpp>
#include <partrain/rendezvous/torch_store.hpp>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

using namespace partrain;
using namespace std::chrono_literals;

namespace {

std::vector<std::byte> bytes(const std::string& s) {
  const auto* p = reinterpret_cast<const std::byte*>(s.data());
  return {p, p + s.size()};
}
std::string text(const std::vector<std::byte>& v) { return {reinterpret_cast<const char*>(v.data()), v.size()}; }

// Every command, in an order whose replies are the same on every run.
void run_scenario(torch_tcp_store& s) {
  CHECK(s.get_string("from_torch", 5s) == "hello");  // set by PyTorch before we connected
  s.set("k1", "v1");
  CHECK(s.get_string("k1", 5s) == "v1");
  CHECK(s.add("n", 5) == 5);
  CHECK(s.add("n", -2) == 3);
  CHECK(s.get_string("n", 5s) == "3");  // PyTorch keeps counters as decimal text
  CHECK(s.check({"k1", "n"}));
  CHECK_FALSE(s.check({"k1", "absent"}));
  CHECK_THROWS_WITH(s.wait({"k1", "absent"}, 300ms),
                    Catch::Contains("store wait timed out after 300 ms") && Catch::Contains("still missing 'absent'") &&
                        !Catch::Contains("'k1'"));
  CHECK(text(s.compare_set("cas", {}, bytes("a"))) == "a");   // absent and expected empty: set
  CHECK(text(s.compare_set("cas", bytes("x"), bytes("b"))) == "a");  // not as expected: unchanged
  CHECK(text(s.compare_set("cas", bytes("a"), bytes("c"))) == "c");
  s.multi_set({"m1", "m2"}, {bytes("1"), bytes("22")});
  const auto m = s.multi_get({"m1", "m2"}, 5s);
  REQUIRE(m.size() == 2);
  CHECK((text(m[0]) == "1" && text(m[1]) == "22"));
  CHECK(s.delete_key("k1"));
  CHECK_FALSE(s.delete_key("k1"));
  CHECK(s.num_keys() >= 5);  // from_torch, n, cas, m1, m2 (the server may keep its own too)
  s.set("from_partrain", "xyz");
  s.set("bye", "1");
}

// A server thread that plays back a recorded exchange: it reads each client turn and compares it
// byte for byte, and sends each server turn. What differed is kept for the test to report.
class replay_server {
 public:
  explicit replay_server(const std::string& path) : listener_(detail::listen_tcp("127.0.0.1", 0, 1)) {
    std::ifstream in(path);
    REQUIRE(in.good());
    for (std::string line; std::getline(in, line);) {
      if (line.empty() || line[0] == '#') continue;
      REQUIRE((line.size() > 2 && (line[0] == '>' || line[0] == '<') && line[1] == ' '));
      turns_.push_back({line[0] == '>', unhex(line.substr(2))});
    }
    REQUIRE(turns_.size() > 10);
    port_ = detail::local_port(listener_.get());
    thread_ = std::thread([this] { serve(); });
  }
  ~replay_server() {
    if (thread_.joinable()) thread_.join();
  }
  [[nodiscard]] std::uint16_t port() const noexcept { return port_; }
  // Joins the thread; empty when every client byte was as recorded and every turn was played.
  std::string finish() {
    thread_.join();
    return problem_;
  }

 private:
  static std::vector<std::byte> unhex(const std::string& h) {
    std::vector<std::byte> out;
    for (std::size_t i = 0; i + 1 < h.size(); i += 2) out.push_back(static_cast<std::byte>(std::stoi(h.substr(i, 2), nullptr, 16)));
    return out;
  }
  void serve() {
    const auto deadline = detail::deadline_clock::now() + 30s;
    try {
      detail::unique_fd fd;
      while (!fd) {
        if (!detail::wait_fd(listener_.get(), POLLIN, deadline)) throw std::runtime_error("no client connected");
        fd = detail::unique_fd(::accept4(listener_.get(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK));
      }
      for (std::size_t i = 0; i < turns_.size(); ++i) {
        const auto& [from_client, data] = turns_[i];
        if (from_client) {
          std::vector<std::byte> got(data.size());
          detail::recv_all(fd.get(), got, deadline, "replay");
          if (got != data) {
            problem_ = "client turn " + std::to_string(i) + " differs from the recording";
            return;
          }
        } else {
          detail::send_all(fd.get(), data, deadline, "replay");
        }
      }
    } catch (const std::exception& e) {
      problem_ = std::string("replay stopped: ") + e.what();
    }
  }

  detail::unique_fd listener_;
  std::uint16_t port_ = 0;
  std::vector<std::pair<bool, std::vector<std::byte>>> turns_;
  std::string problem_;
  std::thread thread_;
};

}  // namespace

TEST_CASE("torch_tcp_store speaks the exchange PyTorch's TCPStore answered", "[rendezvous][torch_store]") {
  replay_server server(PARTRAIN_TORCH_STORE_EXCHANGE);
  {
    torch_tcp_store s({.port = server.port(), .timeout = 10s, .who = "rank 0", .rank = 0});
    run_scenario(s);
  }
  CHECK(server.finish().empty());
}

TEST_CASE("torch_tcp_store refuses what is not a PyTorch TCPStore, within its timeout", "[rendezvous][torch_store]") {
  CHECK_THROWS_WITH(torch_tcp_store({.port = 0}), Catch::Contains("needs the server's port"));
  CHECK_THROWS_WITH(torch_tcp_store({.port = 1, .timeout = 0ms}), Catch::Contains("timeout must be positive"));
  // A listener that accepts and never answers: the PING goes unanswered until the timeout.
  auto silent = detail::listen_tcp("127.0.0.1", 0, 4);
  const auto port = detail::local_port(silent.get());
  const auto start = std::chrono::steady_clock::now();
  try {
    torch_tcp_store s({.port = port, .timeout = 1500ms, .who = "rank 2", .rank = 2});
    FAIL("connected to a server that never answered");
  } catch (const timeout_error& e) {
    CHECK(e.rank() == 2);
    CHECK_THAT(e.what(), Catch::Contains("rank 2") && Catch::Contains("store connect"));
  }
  CHECK(std::chrono::steady_clock::now() - start < 10s);
  // partrain's own store answers with its framing, not the nonce: refused at connect, named.
  tcp_store_server ours({.host = "127.0.0.1", .port = 0});
  CHECK_THROWS_WITH(torch_tcp_store({.port = ours.port(), .timeout = 3s}),
                    Catch::Contains("127.0.0.1:" + std::to_string(ours.port())));
}

TEST_CASE("env:// under torchrun: every rank a client of the agent's TCPStore", "[rendezvous][torch_store]") {
  std::map<std::string, std::string> vars{{"RANK", "1"},
                                          {"WORLD_SIZE", "2"},
                                          {"LOCAL_RANK", "1"},
                                          {"LOCAL_WORLD_SIZE", "2"},
                                          {"MASTER_ADDR", "127.0.0.1"},
                                          {"MASTER_PORT", "29511"},
                                          {"TORCHELASTIC_USE_AGENT_STORE", "True"},
                                          {"TORCHELASTIC_RESTART_COUNT", "2"},
                                          {"TORCHELASTIC_RUN_ID", "none"}};
  auto env = [&](const std::string& k) -> std::optional<std::string> {
    auto it = vars.find(k);
    return it == vars.end() ? std::nullopt : std::optional(it->second);
  };
  auto info = parse_rendezvous("env://", {}, env);
  CHECK((info.agent_store && info.torch_agent_store));
  CHECK(info.restart_count == 2);
  CHECK(info.token.empty());  // the agent's store is the job's: no token, and no warning
  vars["TORCHELASTIC_USE_AGENT_STORE"] = "False";
  vars["PARTRAIN_STORE_TOKEN"] = "t";  // rank 0 would host a store of its own: give the job an identity
  info = parse_rendezvous("env://", {}, env);
  CHECK_FALSE(info.agent_store);
  vars.erase("PARTRAIN_STORE_TOKEN");
  vars["TORCHELASTIC_USE_AGENT_STORE"] = "True";
  vars["PARTRAIN_USE_AGENT_STORE"] = "1";  // partrun's own store wins
  vars["PARTRAIN_RESTART_COUNT"] = "4";
  info = parse_rendezvous("env://", {}, env);
  CHECK((info.agent_store && !info.torch_agent_store));
  CHECK(info.restart_count == 4);
}

// Against PyTorch itself: run by tests/rendezvous/torch_interop.sh where torch imports.
TEST_CASE("torch_tcp_store against PyTorch's own TCPStore", "[.torch]") {
  const char* python = std::getenv("PARTRAIN_TORCH_PYTHON");
  REQUIRE(python);  // the script sets it; this case is hidden from plain runs
  std::string cmd = std::string(python) + " " + PARTRAIN_TORCH_STORE_PEER;
  if (const char* record = std::getenv("PARTRAIN_TORCH_RECORD")) cmd += std::string(" --record ") + record;
  FILE* peer = ::popen(cmd.c_str(), "r");
  REQUIRE(peer);
  char line[256] = {};
  REQUIRE(std::fgets(line, sizeof line, peer));
  const int port = std::atoi(line);
  REQUIRE(port > 0);
  {
    torch_tcp_store s({.port = static_cast<std::uint16_t>(port), .timeout = 20s, .who = "rank 0", .rank = 0});
    run_scenario(s);
  }
  std::string rest;
  while (std::fgets(line, sizeof line, peer)) rest += line;
  CHECK(::pclose(peer) == 0);
  CHECK_THAT(rest, Catch::Contains("from_partrain=xyz"));
}
