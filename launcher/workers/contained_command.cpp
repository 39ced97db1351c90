#include "launcher/workers/contained_command.hpp"

#include <fcntl.h>
#include <linux/close_range.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "common/errors.hpp"
#include "common/system.hpp"
#include "common/unique_fd.hpp"
#include "launcher/workers/process.hpp"

namespace ddprun::launcher::workers {
namespace {

using Clock = std::chrono::steady_clock;

// What the runner (and the command's child before its exec) tells ddprun: 8 bytes, one write each
// (below PIPE_BUF: never mixed).
struct Record {
  int32_t kind;  // kExecFailed: value is errno; kExited: value is the command's waitpid status
  int32_t value;
};
constexpr int32_t kExecFailed = 1;
constexpr int32_t kExited = 2;

// ---- In the runner and the command's child, after fork: async-signal-safe calls only. ----

void tell(int fd, int32_t kind, int32_t value) {
  const Record r{kind, value};
  [[maybe_unused]] auto n = ::write(fd, &r, sizeof r);
}

// SIGKILLs every child of the runner (read from /proc/self/task/<pid>/children); the number found.
int kill_children() {
  char path[64] = "/proc/self/task/";
  size_t at = std::strlen(path);
  char digits[16];
  size_t nd = 0;
  for (pid_t p = ::getpid(); p > 0; p /= 10) digits[nd++] = static_cast<char>('0' + p % 10);
  while (nd > 0) path[at++] = digits[--nd];
  std::memcpy(path + at, "/children", sizeof "/children");
  const int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return 0;
  int found = 0;
  pid_t pid = 0;
  char buf[512];
  for (ssize_t n; (n = ::read(fd, buf, sizeof buf)) > 0;) {
    for (ssize_t i = 0; i < n; ++i) {
      if (buf[i] >= '0' && buf[i] <= '9') {
        pid = pid * 10 + (buf[i] - '0');
      } else if (pid > 0) {
        ::kill(pid, SIGKILL);
        ++found;
        pid = 0;
      }
    }
  }
  if (pid > 0) {
    ::kill(pid, SIGKILL);
    ++found;
  }
  ::close(fd);
  return found;
}

// Everything under the runner dies: its children first; their children, orphaned, become the
// runner's (it is their subreaper) and go in the next pass, until none is left.
void kill_everything(pid_t command) {
  ::kill(-command, SIGKILL);  // the command's group, in one call
  for (;;) {
    kill_children();
    int status = 0;
    if (::waitpid(-1, &status, 0) < 0 && errno == ECHILD) return;
  }
}

[[noreturn]] void exec_command(char* const* argv, char* const* envp, int out_w, int err_w, int report_w, pid_t runner) {
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (::getppid() != runner) ::_exit(127);
  default_signals_in_child();
  ::dup2(out_w, STDOUT_FILENO);
  ::dup2(err_w, STDERR_FILENO);
  ::close_range(3, ~0U, CLOSE_RANGE_CLOEXEC);
  ::execvpe(argv[0], argv, envp);
  tell(report_w, kExecFailed, errno);
  ::_exit(127);
}

// Closes every descriptor from 3 up but `a` and `b`.
void close_all_but(int a, int b) {
  if (a > b) std::swap(a, b);
  ::close_range(3, static_cast<unsigned>(a - 1), 0);
  ::close_range(static_cast<unsigned>(a + 1), static_cast<unsigned>(b - 1), 0);
  ::close_range(static_cast<unsigned>(b + 1), ~0U, 0);
}

[[noreturn]] void runner_main(char* const* argv, char* const* envp, int out_w, int err_w, int report_w, int ctl_r) {
  // A group of its own (the command shares it), the subreaper of all it starts, and the defaults
  // for signals: ddprun's handlers (its event loop's self-pipe) are not the runner's.
  ::setpgid(0, 0);
  ::prctl(PR_SET_CHILD_SUBREAPER, 1);
  ::prctl(PR_SET_NAME, "ddprun-check");
  default_signals_in_child();
  struct sigaction ign {};
  ign.sa_handler = SIG_IGN;
  for (int s : {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGPIPE}) ::sigaction(s, &ign, nullptr);
  const pid_t runner = ::getpid();
  const pid_t command = ::fork();
  if (command < 0) {
    tell(report_w, kExecFailed, errno);
    ::_exit(127);
  }
  if (command == 0) exec_command(argv, envp, out_w, err_w, report_w, runner);
  // Nothing of ddprun's stays open here (its sockets, the command's output): only the two pipes.
  const int devnull = ::open("/dev/null", O_RDWR | O_CLOEXEC);
  for (int fd = 0; fd < 3; ++fd) ::dup2(devnull, fd);
  close_all_but(report_w, ctl_r);
  // The command's exit, without polling where the kernel has pidfds (Linux 5.3+).
  const int pidfd = static_cast<int>(::syscall(SYS_pidfd_open, command, 0));
  for (;;) {
    pollfd fds[2] = {{ctl_r, POLLIN, 0}, {pidfd, POLLIN, 0}};
    const int rc = ::poll(fds, pidfd >= 0 ? 2 : 1, pidfd >= 0 ? -1 : 20);
    if (rc < 0 && errno != EINTR) break;
    if (rc > 0 && fds[0].revents != 0) break;  // ddprun asks, or has gone
    int status = 0;
    if (::waitpid(command, &status, WNOHANG) == command) {
      tell(report_w, kExited, status);
      break;
    }
  }
  kill_everything(command);
  ::_exit(0);
}

// ---- In ddprun. ----

void append_kept(std::string& out, const char* data, size_t n, size_t keep) {
  out.append(data, n);
  if (out.size() > keep) out.erase(0, out.size() - keep);
}

// Reads what is there on `fds` (POLLIN set by poll); a descriptor at EOF is set to -1.
void read_ready(std::vector<pollfd>& fds, std::string& out, size_t keep) {
  for (pollfd& f : fds) {
    if (f.fd < 0 || f.revents == 0) continue;
    char buf[4096];
    const ssize_t n = ::read(f.fd, buf, sizeof buf);
    if (n > 0) append_kept(out, buf, static_cast<size_t>(n), keep);
    else if (n == 0 || errno != EINTR) f.fd = -1;
  }
}

int ms_until(Clock::time_point t) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(t - Clock::now()).count();
  return static_cast<int>(std::clamp<int64_t>(left, 0, 250));
}

}  // namespace

ContainedRun run_contained(const std::vector<std::string>& args, const std::vector<std::string>& env,
                           std::chrono::milliseconds timeout, const StopSignal& stop, size_t keep_output) {
  if (args.empty()) throw ProcessError("no program to run");
  // Everything the runner needs is prepared before fork: no allocation after it.
  std::vector<char*> argv, envp;
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  for (const auto& e : env) envp.push_back(const_cast<char*>(e.c_str()));
  envp.push_back(nullptr);
  const std::string what = "'" + args[0] + "'";
  Pipe out = make_pipe(what), err = make_pipe(what), report = make_pipe(what), ctl = make_pipe(what);
  const pid_t runner = ::fork();
  if (runner < 0) throw ProcessError("cannot start " + what + ": fork failed: " + std::strerror(errno));
  if (runner == 0) {
    runner_main(argv.data(), envp.data(), out.write.get(), err.write.get(), report.write.get(), ctl.read.get());
  }
  ::setpgid(runner, runner);  // from here too: the group exists before anyone signals it
  out.write.reset();
  err.write.reset();
  report.write.reset();
  ctl.read.reset();

  ContainedRun run;
  // Ends the runner and everything under it, and collects it (bounded: a process the kernel
  // cannot kill at once must not hold ddprun; the runner is then reaped later, as an orphan).
  auto finish = [&](bool ask) {
    if (ask) ctl.write.reset();  // EOF: the runner kills everything and exits
    const auto give_up = Clock::now() + std::chrono::seconds(5);
    int status = 0;
    while (retry_eintr([&] { return ::waitpid(runner, &status, WNOHANG); }) == 0) {
      if (Clock::now() >= give_up) {
        ::kill(-runner, SIGKILL);
        return;
      }
      std::vector<pollfd> fds{{out.read.get(), POLLIN, 0}, {err.read.get(), POLLIN, 0}};
      ::poll(fds.data(), fds.size(), 20);  // output still coming is read meanwhile
      read_ready(fds, run.output, keep_output);
      if (fds[0].fd < 0) out.read.reset();
      if (fds[1].fd < 0) err.read.reset();
    }
  };
  const auto deadline = Clock::now() + timeout;
  std::vector<pollfd> fds{{out.read.get(), POLLIN, 0}, {err.read.get(), POLLIN, 0}, {report.read.get(), POLLIN, 0}};
  int exec_errno = 0;
  for (;;) {
    if (Clock::now() >= deadline || stop.requested()) {
      finish(true);
      run.end = stop.requested() ? ContainedRun::End::Stopped : ContainedRun::End::TimedOut;
      return run;
    }
    if (::poll(fds.data(), fds.size(), ms_until(deadline)) < 0 && errno != EINTR) {
      throw ProcessError("cannot watch " + what + ": poll: " + std::strerror(errno));
    }
    if (fds[2].fd >= 0 && fds[2].revents != 0) {
      Record r{};
      const ssize_t n = retry_eintr([&] { return ::read(fds[2].fd, &r, sizeof r); });
      if (n == sizeof r && r.kind == kExecFailed) {
        exec_errno = r.value;
      } else if (n == sizeof r && r.kind == kExited) {
        run.status = r.value;
        break;
      } else {
        // The runner has ended: after an exec that failed (or a fork), or killed by someone.
        fds[2].fd = -1;
        if (exec_errno != 0) break;
        finish(false);
        throw ProcessError(what + " ended without its exit status: its runner process was killed");
      }
    }
    fds[2].revents = 0;
    read_ready(fds, run.output, keep_output);
  }
  if (exec_errno != 0) {
    finish(true);
    std::string hint;
    if (exec_errno == ENOENT) hint = " (check the path, or PATH for a bare name)";
    if (exec_errno == EACCES) hint = " (is it executable? chmod +x, or run a script through its interpreter)";
    throw ProcessError("cannot run " + what + ": " + std::strerror(exec_errno) + hint);
  }
  // The command has exited: what it wrote is read while the runner kills what it left behind
  // (a child still holding the output, a daemon it started); then the output is at its end.
  finish(false);
  for (const auto drain_until = Clock::now() + std::chrono::seconds(1); Clock::now() < drain_until;) {
    std::vector<pollfd> rest{{out.read.get(), POLLIN, 0}, {err.read.get(), POLLIN, 0}};
    if (rest[0].fd < 0 && rest[1].fd < 0) break;
    ::poll(rest.data(), rest.size(), ms_until(drain_until));
    read_ready(rest, run.output, keep_output);
    if (rest[0].fd < 0) out.read.reset();
    if (rest[1].fd < 0) err.read.reset();
  }
  run.end = ContainedRun::End::Exited;
  return run;
}

}  // namespace ddprun::launcher::workers
