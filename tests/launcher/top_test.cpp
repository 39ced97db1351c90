// ddprun-top against a server that lies: a real socket on 127.0.0.1 (a kernel-picked port) that
// answers /api/job with what a hostile or broken peer sends (bodies far too large, however they
// are framed; a Content-Length no memory holds; JSON nested 100,000 deep; fields of the wrong
// types; escape sequences in the texts; a huge error body). ddprun-top, run as a user runs it
// (`ddprun-top --once HOST:PORT`), must end with a clear error or show sanitized text, in bounded
// memory (its peak RSS, from wait4), and never crash.
#include <netinet/in.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fcntl.h>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <thread>

#include "tests/support/temp_dir.hpp"
#include "tests/support/wait_until.hpp"

namespace ddprun::test {
namespace {

using namespace std::chrono_literals;

// DDPRUN_TEST_DDPRUN_TOP_BIN runs the tests against another build (as DDPRUN_TEST_DDPRUN_BIN does
// for ddprun).
std::string top_bin() {
  const char* other = std::getenv("DDPRUN_TEST_DDPRUN_TOP_BIN");
  return other && *other ? other : DDPRUN_TOP_BIN;
}

// Sends all of `bytes`; false once the peer is gone.
bool send_all(int fd, std::string_view bytes) {
  while (!bytes.empty()) {
    const ssize_t n = ::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    bytes.remove_prefix(static_cast<size_t>(n));
  }
  return true;
}

// A server on 127.0.0.1 that reads each request's header and answers it with `answer(fd)`, then
// closes the connection.
class LyingServer {
 public:
  explicit LyingServer(std::function<void(int fd)> answer) : answer_(std::move(answer)) {
    fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof addr;
    if (fd_ < 0 || ::bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 || ::listen(fd_, 8) != 0 ||
        ::getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
      throw std::runtime_error(std::string("LyingServer: ") + std::strerror(errno));
    }
    port_ = ntohs(addr.sin_port);
    thread_ = std::thread([this] { serve(); });
  }
  ~LyingServer() {
    stop_ = true;
    ::shutdown(fd_, SHUT_RDWR);  // wakes the accept
    thread_.join();
    ::close(fd_);
  }
  uint16_t port() const { return port_; }

 private:
  void serve() {
    while (!stop_) {
      const int c = ::accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC);
      if (c < 0) {
        if (errno == EINTR) continue;
        return;
      }
      std::string request;
      char buf[4096];
      pollfd p{c, POLLIN, 0};
      while (request.find("\r\n\r\n") == std::string::npos && request.size() < 65536 && ::poll(&p, 1, 5000) == 1) {
        const ssize_t n = ::recv(c, buf, sizeof buf, 0);
        if (n <= 0) break;
        request.append(buf, static_cast<size_t>(n));
      }
      if (request.find("\r\n\r\n") != std::string::npos) answer_(c);
      ::close(c);
    }
  }

  std::function<void(int)> answer_;
  int fd_ = -1;
  uint16_t port_ = 0;
  std::thread thread_;
  std::atomic<bool> stop_{false};
};

// An answer of `header` followed by `size` bytes of `fill`, the header and the body's start in one
// write (as servers send them), the rest as fast as the client takes it.
std::function<void(int)> body_of(std::string header, uint64_t size, char fill) {
  return [header = std::move(header), size, fill](int fd) {
    const std::string chunk(1 << 16, fill);
    uint64_t left = size;
    const uint64_t first = std::min<uint64_t>(left, chunk.size());
    if (!send_all(fd, header + chunk.substr(0, first))) return;
    left -= first;
    while (left > 0) {
      const uint64_t n = std::min<uint64_t>(left, chunk.size());
      if (!send_all(fd, std::string_view(chunk).substr(0, n))) return;
      left -= n;
    }
  };
}

std::function<void(int)> text_answer(const std::string& status, const std::string& body) {
  return [=](int fd) {
    send_all(fd, "HTTP/1.1 " + status + "\r\nContent-Type: application/json\r\nContent-Length: " +
                     std::to_string(body.size()) + "\r\nConnection: close\r\n\r\n" + body);
  };
}

struct TopRun {
  int exit_code = -1;  // -1: killed by a signal (signo) or timed out
  int signo = 0;
  long max_rss_kib = 0;
  std::string out, err;
};

// `ddprun-top --once 127.0.0.1:PORT` under a 1 GiB address-space limit (a runaway fails here
// rather than swapping the machine), its output to files.
TopRun run_top(uint16_t port) {
  TempDir dir;
  const std::string out = (dir.path / "out").string(), err = (dir.path / "err").string();
  const std::string target = "127.0.0.1:" + std::to_string(port);
  const std::string bin = top_bin();
  const pid_t pid = ::fork();
  if (pid == 0) {
    const rlimit as{rlim_t{1} << 30, rlim_t{1} << 30};
    ::setrlimit(RLIMIT_AS, &as);
    const int o = ::open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    const int e = ::open(err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    ::dup2(o, 1);
    ::dup2(e, 2);
    ::execl(bin.c_str(), bin.c_str(), "--once", target.c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
  TopRun r;
  int status = 0;
  rusage usage{};
  const bool ended = wait_until([&] { return ::wait4(pid, &status, WNOHANG, &usage) == pid; }, 60s);
  if (!ended) {
    ::kill(pid, SIGKILL);
    ::wait4(pid, &status, 0, &usage);
  }
  if (ended && WIFEXITED(status)) r.exit_code = WEXITSTATUS(status);
  if (WIFSIGNALED(status)) r.signo = WTERMSIG(status);
  r.max_rss_kib = usage.ru_maxrss;
  std::stringstream o, e;
  o << std::ifstream(out).rdbuf();
  e << std::ifstream(err).rdbuf();
  r.out = o.str();
  r.err = e.str();
  return r;
}

// The control characters in `text` but newlines, as "\xNN ..." ("" when none).
std::string controls_in(const std::string& text) {
  std::string found;
  for (const char c : text) {
    const auto u = static_cast<unsigned char>(c);
    if ((u < 0x20 && c != '\n') || u == 0x7f) {
      char hex[8];
      std::snprintf(hex, sizeof hex, "\\x%02x ", u);
      found += hex;
    }
  }
  return found;
}

// It ended on its own, with a short printable message, in bounded memory.
void expect_clear_error(const TopRun& r, const std::string& what) {
  EXPECT_EQ(r.signo, 0) << what << ": killed by signal " << r.signo << "; stderr: " << r.err.substr(0, 400);
  EXPECT_EQ(r.exit_code, 1) << what << ": " << r.err.substr(0, 400);
  EXPECT_FALSE(r.err.empty()) << what;
  EXPECT_LT(r.err.size(), 1024u) << what << ": " << r.err.substr(0, 400);
  EXPECT_EQ(controls_in(r.err), "") << what;
  EXPECT_LT(r.max_rss_kib, 64 * 1024) << what << ": peak RSS " << r.max_rss_kib << " KiB";
}

constexpr const char* kView = R"j({"schema": "ddprun-job-view/1", "run_id": "job7", "nodes": 1, "round": 0,
  "phase": {"name": "running", "detail": "2 workers, round 0 (restart 0)", "ok": true, "seconds": 3},
  "restarts": 0, "world_size": 2, "ranks_here": 2, "workers_alive": 2, "stragglers": 0,
  "ranks": [{"rank": 1, "node": -1, "alive": true, "step": 41, "idle_s": 0.1, "waiting": false,
             "straggler": false, "steps_per_s": 20.5, "step_ms": 12.5},
            {"rank": 0, "node": -1, "alive": true, "step": 42, "idle_s": 0.1, "waiting": true,
             "straggler": false, "steps_per_s": 20.5, "step_ms": 1.5}],
  "ranks_not_listed": 0})j";

TEST(TopTest, AnHonestJobViewIsShown) {
  LyingServer server(text_answer("200 OK", kView));
  const TopRun r = run_top(server.port());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("ddprun job job7 at 127.0.0.1:"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("12.5 ms"), std::string::npos) << r.out;
  EXPECT_LT(r.max_rss_kib, 64 * 1024);
}

TEST(TopTest, AnAnswerLargerThanAnyViewEndsWithAnErrorWhateverItsFraming) {
  const std::string ok = "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n";
  const uint64_t mb = 1000 * 1000;
  struct Case {
    const char* what;
    std::function<void(int)> answer;
  };
  const Case cases[] = {
      {"200 MB, with its Content-Length", body_of(ok + "Content-Length: 200000000\r\n\r\n", 200 * mb, 'x')},
      {"100 MB of '[', with its Content-Length", body_of(ok + "Content-Length: 100000000\r\n\r\n", 100 * mb, '[')},
      {"100 MB of '[', to the end of the connection", body_of(ok + "Connection: close\r\n\r\n", 100 * mb, '[')},
      {"100 MB of '[' in one chunk", body_of(ok + "Transfer-Encoding: chunked\r\n\r\n5f5e100\r\n", 100 * mb, '[')},
      {"Content-Length: 1000000000000", body_of(ok + "Content-Length: 1000000000000\r\n\r\n", 100 * mb, '[')},
      {"Content-Length: 1e12", body_of(ok + "Content-Length: 1e12\r\n\r\n", 10 * mb, '[')},
  };
  for (const Case& c : cases) {
    LyingServer server(c.answer);
    expect_clear_error(run_top(server.port()), c.what);
  }
}

TEST(TopTest, JsonNestedTooDeepOrOfTooManyValuesEndsWithAnError) {
  const std::string deep(100000, '[');
  const std::string closed(100000, ']');
  std::string tiny = "[";
  while (tiny.size() < (size_t{7} << 20)) tiny += "[],";
  tiny += "[]]";
  struct Case {
    const char* what;
    std::string body;
  };
  const Case cases[] = {
      {"100,000 nested arrays in a rank's step time",
       R"j({"schema": "ddprun-job-view/1", "ranks": [{"rank": 0, "step_ms": )j" + deep + closed + "}]}"},
      {"100,000 nested arrays, not closed", R"j({"schema": "ddprun-job-view/1", "ranks": )j" + deep},
      {"7 MiB of empty arrays", R"j({"schema": "ddprun-job-view/1", "ranks": )j" + tiny + "}"},
  };
  for (const Case& c : cases) {
    LyingServer server(text_answer("200 OK", c.body));
    expect_clear_error(run_top(server.port()), c.what);
  }
}

TEST(TopTest, FieldsOfTheWrongTypesAreShownAsAbsent) {
  const char* views[] = {
      R"j({"schema": "ddprun-job-view/1", "run_id": 5, "phase": {"name": [1], "detail": {}, "seconds": "x"},
          "round": "r", "restarts": -4, "nodes": "2", "node": {}, "world_size": 1.5, "workers_alive": null,
          "ranks": [{"rank": "a", "node": 1e300, "step": -1, "alive": "yes", "idle_s": "z", "step_ms": "q",
                     "steps_per_s": true, "straggler": 1},
                    {"rank": 1e300, "step": 1.5, "alive": true, "idle_s": 1e300, "step_ms": -1e300}, 7, null, "x"],
          "ranks_not_listed": -3, "stragglers": "many"})j",
      R"j({"schema": "ddprun-job-view/1", "phase": "running", "ranks": {"rank": 0}, "ranks_not_listed": 1e30})j",
      R"j({"schema": "ddprun-job-view/1", "ranks": [[], [[]], {"rank": 18446744073709551615}]})j",
  };
  for (const char* view : views) {
    LyingServer server(text_answer("200 OK", view));
    const TopRun r = run_top(server.port());
    EXPECT_EQ(r.signo, 0) << view << "\n" << r.err;
    EXPECT_EQ(r.exit_code, 0) << view << "\n" << r.err;
    EXPECT_NE(r.out.find("RANK"), std::string::npos) << r.out;
  }
}

TEST(TopTest, TheServersTextsAreShownWithTheirControlCharactersVisible) {
  LyingServer server(text_answer("200 OK", R"j({"schema": "ddprun-job-view/1", "run_id": "\u001b]0;pwned\u0007",
      "phase": {"name": "\u001b[2J", "detail": "\u009b31m red \u001b[8m hidden \u202etxt.exe", "seconds": 1},
      "ranks": []})j"));
  const TopRun r = run_top(server.port());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(controls_in(r.out), "") << r.out;
  EXPECT_EQ(r.out.find("\xc2\x9b"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("\\x1b]0;pwned\\x07"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("\\x1b[8m hidden"), std::string::npos) << r.out;
  // A right-to-left override would show the rest of the line reversed.
  EXPECT_EQ(r.out.find("\xe2\x80\xae"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("\\xe2\\x80\\xaetxt.exe"), std::string::npos) << r.out;
}

TEST(TopTest, AnErrorsBodyReachesTheMessageCutAndPrintable) {
  std::string huge;
  while (huge.size() < (size_t{7} << 20)) huge += "\x1b[2J\x1b]0;pwned\x07 ";
  LyingServer server(text_answer("500 Internal Server Error", huge));
  const TopRun r = run_top(server.port());
  expect_clear_error(r, "a 7 MiB error body");
  EXPECT_NE(r.err.find("500"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace ddprun::test
