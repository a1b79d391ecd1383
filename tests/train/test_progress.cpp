// The progress line: stable key=value lines when not on a terminal, a live '\r' line under a
// pseudo-terminal, silence on other ranks.
#include <catch2/catch.hpp>

#include <chrono>
#include <fcntl.h>
#include <poll.h>
#include <pty.h>
#include <regex>
#include <sstream>
#include <streambuf>
#include <string>
#include <unistd.h>
#include <vector>

#include <partrain/train/progress.hpp>

using namespace partrain;
using namespace std::chrono_literals;

namespace {

// A clock the test moves by hand.
std::chrono::steady_clock::time_point fake_now_value{};
std::chrono::steady_clock::time_point fake_now() { return fake_now_value; }

std::vector<std::string> lines_of(const std::string& s) {
  std::vector<std::string> out;
  std::istringstream in(s);
  for (std::string l; std::getline(in, l);) out.push_back(l);
  return out;
}

// Writes straight to a file descriptor (here: a pty's slave side).
class fd_buf : public std::streambuf {
 public:
  explicit fd_buf(int fd) : fd_(fd) {}

 protected:
  int_type overflow(int_type c) override {
    if (c == traits_type::eof()) return traits_type::not_eof(c);
    const char ch = static_cast<char>(c);
    return ::write(fd_, &ch, 1) == 1 ? c : traits_type::eof();
  }
  std::streamsize xsputn(const char* s, std::streamsize n) override {
    std::streamsize done = 0;
    while (done < n) {
      const auto k = ::write(fd_, s + done, static_cast<std::size_t>(n - done));
      if (k <= 0) break;
      done += k;
    }
    return done;
  }

 private:
  int fd_;
};

std::string drain(int fd) {
  std::string out;
  char buf[4096];
  pollfd p{fd, POLLIN, 0};
  while (::poll(&p, 1, 200) > 0 && (p.revents & POLLIN)) {
    const auto k = ::read(fd, buf, sizeof buf);
    if (k <= 0) break;
    out.append(buf, static_cast<std::size_t>(k));
  }
  return out;
}

}  // namespace

TEST_CASE("plain progress lines are stable and parseable", "[train][progress]") {
  std::ostringstream out;
  fake_now_value = {};
  progress_options o;
  o.out = &out;
  o.mode = progress_mode::plain;
  o.epochs = 2;
  o.steps_per_epoch = 5;
  o.world_size = 2;
  o.plain_interval = 0ms;
  o.plain_every_steps = 2;
  o.now = &fake_now;
  {
    progress p(0, o);
    CHECK_FALSE(p.terminal());
    for (int e = 0; e < 2; ++e) {
      for (int s = 0; s < 5; ++s) {
        p.update(e, s, 1.0 / (1 + e * 5 + s), 10);  // 10 samples per rank and step
        fake_now_value += 500ms;
      }
    }
  }
  const auto lines = lines_of(out.str());
  // The first update, every 2nd step, and each epoch's last step.
  REQUIRE(lines.size() == 7);
  CHECK(out.str().find('\r') == std::string::npos);
  const std::regex re(R"(^progress rank=0 epoch=(\d+)/2 step=(\d+)/5 loss=(\S+) samples/s=(\S+) eta=(\S+)$)");
  const std::vector<std::pair<int, int>> expected{{1, 1}, {1, 2}, {1, 4}, {1, 5}, {2, 2}, {2, 4}, {2, 5}};
  for (std::size_t i = 0; i < lines.size(); ++i) {
    std::smatch m;
    INFO(lines[i]);
    REQUIRE(std::regex_match(lines[i], m, re));
    CHECK(std::stoi(m[1]) == expected[i].first);
    CHECK(std::stoi(m[2]) == expected[i].second);
    if (i == 0) {
      CHECK(m[4] == "-");  // no rate or ETA from one point
      CHECK(m[5] == "-");
    } else {
      CHECK(std::stod(m[4]) == Approx(40.0));  // 10 samples x 2 ranks per 0.5 s
    }
  }
  // After the 2nd update: 8 steps left at 0.5 s each.
  CHECK(lines[1].find("eta=0:00:04") != std::string::npos);
  CHECK(lines.back().find("eta=0:00:00") != std::string::npos);
  CHECK(lines[0].find("loss=1 ") != std::string::npos);
}

TEST_CASE("other ranks print nothing unless asked", "[train][progress]") {
  std::ostringstream quiet, loud;
  progress_options o;
  o.mode = progress_mode::plain;
  o.out = &quiet;
  {
    progress p(1, o);
    CHECK_FALSE(p.active());
    p.update(0, 0, 1.0, 8);
  }
  CHECK(quiet.str().empty());
  o.out = &loud;
  o.all_ranks = true;
  {
    progress p(1, o);
    p.update(0, 0, 1.0, 8);
  }
  CHECK(loud.str().rfind("progress rank=1 ", 0) == 0);
}

TEST_CASE("automatic mode is plain when the descriptor is not a terminal", "[train][progress]") {
  const int fd = ::open("/dev/null", O_WRONLY | O_CLOEXEC);
  REQUIRE(fd >= 0);
  std::ostringstream out;
  progress_options o;
  o.out = &out;
  o.terminal_fd = fd;
  CHECK_FALSE(progress(0, o).terminal());
  ::close(fd);
}

TEST_CASE("on a pseudo-terminal the progress line is redrawn in place", "[train][progress]") {
  int master = -1, slave = -1;
  REQUIRE(::openpty(&master, &slave, nullptr, nullptr, nullptr) == 0);
  fd_buf buf(slave);
  std::ostream tty(&buf);
  fake_now_value = {};
  progress_options o;
  o.out = &tty;
  o.terminal_fd = slave;  // automatic mode must find the terminal by itself
  o.epochs = 1;
  o.steps_per_epoch = 100;
  o.terminal_interval = 100ms;
  o.now = &fake_now;
  {
    progress p(0, o);
    CHECK(p.terminal());
    for (int s = 0; s < 100; ++s) {
      p.update(0, s, 0.5, 4);
      fake_now_value += 10ms;  // 10 updates per redraw interval
    }
  }
  const std::string got = drain(master);
  ::close(slave);
  ::close(master);
  std::size_t draws = 0;
  for (std::size_t at = got.find("\rprogress"); at != std::string::npos; at = got.find("\rprogress", at + 1)) ++draws;
  CHECK(draws >= 10);  // throttled to the interval (plus the last step), not one per update
  CHECK(draws <= 12);
  CHECK(got.find("\x1b[K") != std::string::npos);   // clears what a longer previous line left
  CHECK(got.find("step=100/100") != std::string::npos);
  // The live line stays one line: the only newline is the epoch's end (the pty shows it as \r\n).
  std::size_t newlines = 0;
  for (char c : got) newlines += c == '\n';
  CHECK(newlines == 1);
}
