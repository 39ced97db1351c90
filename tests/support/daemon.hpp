#pragma once
// Test helper: a ddprun-rendezvous daemon in its own process (so that a crash is seen as one), on a
// kernel-picked port, with its output in a file that the test can read at any time. Killed (SIGKILL)
// at scope exit if still running.

#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "common/system.hpp"
#include "tests/support/temp_dir.hpp"
#include "tests/support/wait_until.hpp"

namespace ddprun::test {

struct DaemonOptions {
  std::vector<std::string> args;        // extra command-line arguments
  std::optional<rlim_t> nofile;         // RLIMIT_NOFILE (soft and hard) for the daemon
  std::optional<rlim_t> address_space;  // RLIMIT_AS for the daemon (see kAddressSpaceLimitWorks)
};

// Whether RLIMIT_AS can bound a daemon of this build: AddressSanitizer and ThreadSanitizer reserve
// terabytes of address space for their shadow memory at start, so under a limit of a few GiB a
// daemon built with them cannot start at all.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
inline constexpr bool kAddressSpaceLimitWorks = false;
#else
inline constexpr bool kAddressSpaceLimitWorks = true;
#endif

// Whether a daemon of this build can be run out of descriptors: UBSan's vptr check probes memory
// through a pipe, and in a process with no descriptor left it fails falsely, ending the daemon
// ("member call on address ... which does not point to an object of type ...: invalid vptr").
// DDPRUN_UBSAN_VPTR comes from tests/CMakeLists.txt.
#ifdef DDPRUN_UBSAN_VPTR
inline constexpr bool kDescriptorExhaustionWorks = false;
#else
inline constexpr bool kDescriptorExhaustionWorks = true;
#endif

class Daemon {
 public:
  // `binary`: the daemon to run (DDPRUN_TEST_DAEMON_BIN in the environment overrides it, to run
  // the same tests against another build).
  Daemon(const std::string& binary, DaemonOptions options = {}) {
    const char* override_bin = std::getenv("DDPRUN_TEST_DAEMON_BIN");
    const std::string bin = override_bin && *override_bin ? override_bin : binary;
    const std::string port_file = (dir_.path / "port").string();
    log_path_ = (dir_.path / "daemon.log").string();
    std::vector<std::string> argv{bin, "--host", "127.0.0.1", "--port", "0", "--port-file", port_file};
    argv.insert(argv.end(), options.args.begin(), options.args.end());
    std::vector<char*> cargv;
    for (auto& a : argv) cargv.push_back(a.data());
    cargv.push_back(nullptr);
    pid_ = ::fork();
    if (pid_ == 0) {
      const int log = ::open(log_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
      ::dup2(log, 1);
      ::dup2(log, 2);
      if (log > 2) ::close(log);
      if (options.nofile) {
        rlimit lim{*options.nofile, *options.nofile};
        ::setrlimit(RLIMIT_NOFILE, &lim);
      }
      if (options.address_space) {
        rlimit lim{*options.address_space, *options.address_space};
        ::setrlimit(RLIMIT_AS, &lim);
      }
      ::execv(cargv[0], cargv.data());
      ::_exit(127);
    }
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (std::chrono::steady_clock::now() < deadline) {
      std::ifstream in(port_file);
      int port = 0;
      if (in >> port && port > 0) {
        port_ = static_cast<uint16_t>(port);
        return;
      }
      if (!alive()) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));  // sleep override: polling a file
    }
    throw std::runtime_error("ddprun-rendezvous did not start: " + log());
  }
  ~Daemon() {
    if (!reaped_) {
      ::kill(pid_, SIGKILL);
      int st;
      ::waitpid(pid_, &st, 0);
    }
  }
  Daemon(const Daemon&) = delete;
  Daemon& operator=(const Daemon&) = delete;

  uint16_t port() const { return port_; }
  pid_t pid() const { return pid_; }
  std::string log() const {
    std::ifstream in(log_path_);
    std::stringstream s;
    s << in.rdbuf();
    return s.str();
  }
  // The log once it holds `text` (the daemon logs some lines after writing its port file), or
  // the log as it is after `limit`.
  std::string log_with(const std::string& text, std::chrono::milliseconds limit = std::chrono::seconds(10)) const {
    std::string l;
    wait_until([&] { return (l = log()).find(text) != std::string::npos; }, limit);
    return l;
  }
  // With --metrics-port: the line the daemon prints, "metrics on HOST:PORT" ([v6]:PORT for IPv6),
  // once it has printed it, or "".
  std::string metrics_line() const {
    const std::string l = log_with("metrics on ");
    for (size_t at = l.find("metrics on "); at != std::string::npos; at = l.find("metrics on ", at + 1)) {
      const std::string line = l.substr(at, l.find('\n', at) - at);
      if (line.find("://") == std::string::npos) return line;  // not the log's "metrics on http://..."
    }
    return "";
  }
  // The port of --metrics-port 0, from metrics_line(), or 0.
  uint16_t metrics_port() const {
    const std::string line = metrics_line();
    const auto colon = line.rfind(':');
    return colon == std::string::npos ? 0 : static_cast<uint16_t>(std::stoi(line.substr(colon + 1)));
  }
  // Still running (not exited, not a zombie).
  bool alive() {
    if (reaped_) return false;
    int st;
    if (::waitpid(pid_, &st, WNOHANG) == pid_) {
      reaped_ = true;
      exit_status_ = st;
      return false;
    }
    return true;
  }
  int exit_status() const { return exit_status_; }
  // VmRSS (or VmHWM for `peak`) in KiB, from /proc.
  uint64_t rss_kib(bool peak = false) const {
    std::ifstream in("/proc/" + std::to_string(pid_) + "/status");
    std::string line;
    const std::string field = peak ? "VmHWM:" : "VmRSS:";
    while (std::getline(in, line)) {
      if (line.rfind(field, 0) == 0) return std::stoull(line.substr(field.size()));
    }
    return 0;
  }
  // User + system CPU time in seconds, from /proc.
  double cpu_seconds() const { return static_cast<double>(ddprun::process_cpu_time(pid_).count()) / 1e6; }
  // How many times `needle` appears in the log.
  size_t log_count(const std::string& needle) const {
    const std::string text = log();
    size_t n = 0;
    for (size_t pos = text.find(needle); pos != std::string::npos; pos = text.find(needle, pos + 1)) ++n;
    return n;
  }
  // Sends `signo` and waits for the exit; returns the wait status.
  int stop(int signo = SIGTERM) {
    if (reaped_) return exit_status_;
    ::kill(pid_, signo);
    ::waitpid(pid_, &exit_status_, 0);
    reaped_ = true;
    return exit_status_;
  }

 private:
  TempDir dir_;
  std::string log_path_;
  pid_t pid_ = -1;
  uint16_t port_ = 0;
  bool reaped_ = false;
  int exit_status_ = 0;
};

}  // namespace ddprun::test
