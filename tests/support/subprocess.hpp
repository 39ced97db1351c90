#pragma once
// Test helper: run a program with captured stdout/stderr and a deadline, or start it and talk to it
// (signals, reading output as it comes). Header-only; POSIX.

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace ddprun::test {

// The children of every thread of `pid` (/proc/<pid>/task/*/children).
inline std::vector<pid_t> children_of(pid_t pid) {
  std::vector<pid_t> out;
  std::error_code ec;
  for (const auto& task : std::filesystem::directory_iterator("/proc/" + std::to_string(pid) + "/task", ec)) {
    std::ifstream in(task.path() / "children");
    for (pid_t child; in >> child;) out.push_back(child);
  }
  return out;
}

struct Finished {
  int exit_code = -1;  // -1 when killed by a signal or timed out
  int signal = 0;
  bool timed_out = false;
  std::string out;
  std::string err;
};

class Subprocess {
 public:
  // env_overrides: VAR=value to set; VAR= with an empty value removes VAR.
  Subprocess(const std::vector<std::string>& argv, const std::map<std::string, std::string>& env_overrides = {}) {
    int out[2], err[2];
    if (::pipe2(out, O_CLOEXEC) != 0 || ::pipe2(err, O_CLOEXEC) != 0) throw std::runtime_error("pipe");
    std::vector<std::string> env_strings;
    for (char** e = environ; *e; ++e) {
      std::string kv = *e;
      if (env_overrides.count(kv.substr(0, kv.find('=')))) continue;
      env_strings.push_back(kv);
    }
    for (const auto& [k, v] : env_overrides) {
      if (!v.empty()) env_strings.push_back(k + "=" + v);
    }
    std::vector<char*> args, envp;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    for (const auto& e : env_strings) envp.push_back(const_cast<char*>(e.c_str()));
    envp.push_back(nullptr);
    pid_ = ::fork();
    if (pid_ == 0) {
      ::dup2(out[1], 1);
      ::dup2(err[1], 2);
      // Only stdio: descriptors the test runner left open are not the program's.
      ::close_range(3, ~0U, 0);
      ::execve(args[0], args.data(), envp.data());
      ::_exit(127);
    }
    ::close(out[1]);
    ::close(err[1]);
    out_fd_ = out[0];
    err_fd_ = err[0];
  }
  ~Subprocess() {
    if (!reaped_) {
      ::kill(pid_, SIGKILL);
      wait(std::chrono::seconds(10));
    }
    if (out_fd_ >= 0) ::close(out_fd_);
    if (err_fd_ >= 0) ::close(err_fd_);
  }

  pid_t pid() const { return pid_; }
  void signal(int signo) { ::kill(pid_, signo); }
  const std::string& out() const { return out_; }
  const std::string& err() const { return err_; }

  // Reads output until `needle` appears in stdout+stderr or the deadline passes.
  bool wait_for_output(const std::string& needle, std::chrono::milliseconds timeout) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (out_.find(needle) == std::string::npos && err_.find(needle) == std::string::npos) {
      if (!pump(deadline)) return false;
    }
    return true;
  }

  // Reads output while `pred` does not hold, until `timeout`: for waiting on a fact (a process, a
  // port, a file) rather than on a sentence of the log.
  bool wait_for(const std::function<bool()>& pred, std::chrono::milliseconds timeout) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (!pred()) {
      const auto now = std::chrono::steady_clock::now();
      if (now >= deadline) return false;
      const auto slice = std::min(deadline, now + std::chrono::milliseconds(20));
      if (!pump(slice) && out_fd_ < 0 && err_fd_ < 0) {
        std::this_thread::sleep_until(slice);  // sleep override: output closed, the fact still polled
      }
    }
    return true;
  }

  // The workers this ddprun runs now (without --preload): its children that lead a process group
  // of their own within its session (ddprun starts each worker so; its orphan guard has a session
  // of its own).
  size_t worker_count() const {
    size_t n = 0;
    for (pid_t child : children_of(pid_)) n += ::getpgid(child) == child && ::getsid(child) != child ? 1 : 0;
    return n;
  }
  bool wait_for_workers(size_t n, std::chrono::milliseconds timeout) {
    return wait_for([&] { return worker_count() >= n; }, timeout);
  }

  // Reads everything until EOF and reaps; on timeout kills it.
  Finished wait(std::chrono::milliseconds timeout) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    Finished f;
    while (out_fd_ >= 0 || err_fd_ >= 0) {
      if (!pump(deadline)) {
        f.timed_out = true;
        ::kill(pid_, SIGKILL);
        break;
      }
    }
    int status = 0;
    if (!reaped_) {
      while (::waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
      }
      reaped_ = true;
      if (WIFEXITED(status)) f.exit_code = WEXITSTATUS(status);
      if (WIFSIGNALED(status)) f.signal = WTERMSIG(status);
    }
    f.out = out_;
    f.err = err_;
    return f;
  }

 private:
  // One poll round; false on deadline.
  bool pump(std::chrono::steady_clock::time_point deadline) {
    if (out_fd_ < 0 && err_fd_ < 0) return false;
    pollfd fds[2] = {{out_fd_, POLLIN, 0}, {err_fd_, POLLIN, 0}};
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return false;
    const int rc = ::poll(fds, 2, static_cast<int>(left.count()));
    if (rc == 0) return false;
    if (rc < 0) return errno == EINTR;
    drain(fds[0], out_fd_, out_);
    drain(fds[1], err_fd_, err_);
    return true;
  }
  static void drain(const pollfd& p, int& fd, std::string& into) {
    if (fd < 0 || !(p.revents & (POLLIN | POLLHUP | POLLERR))) return;
    char buf[8192];
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n > 0) {
      into.append(buf, static_cast<size_t>(n));
    } else if (n == 0 || errno != EINTR) {
      ::close(fd);
      fd = -1;
    }
  }

  pid_t pid_ = -1;
  int out_fd_ = -1;
  int err_fd_ = -1;
  bool reaped_ = false;
  std::string out_;
  std::string err_;
};

// The rest of the first line of `log` after `marker` (e.g. "MASTER_PORT=" in ddprun's log), or "".
inline std::string logged_value(const std::string& log, const std::string& marker) {
  const auto pos = log.find(marker);
  if (pos == std::string::npos) return "";
  return log.substr(pos, log.find('\n', pos) - pos);
}

// True when `pid` no longer runs (gone, or a zombie waiting for its reaper).
inline bool process_gone(pid_t pid) {
  if (::kill(pid, 0) != 0) return true;
  char path[64];
  std::snprintf(path, sizeof path, "/proc/%d/stat", pid);
  FILE* f = std::fopen(path, "r");
  if (!f) return true;
  char buf[512] = {};
  const size_t n = std::fread(buf, 1, sizeof buf - 1, f);
  std::fclose(f);
  const std::string stat(buf, n);
  const auto close_paren = stat.rfind(')');
  return close_paren != std::string::npos && close_paren + 2 < stat.size() && stat[close_paren + 2] == 'Z';
}

}  // namespace ddprun::test
