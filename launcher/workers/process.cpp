#include "launcher/workers/process.hpp"

#include <fcntl.h>
#include <signal.h>
#include <linux/close_range.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <set>
#include <system_error>

#include "common/errors.hpp"
#include "common/system.hpp"

namespace ddprun::launcher {
namespace {

void pipe_cloexec(int fds[2], const std::string& program) {
  if (::pipe2(fds, O_CLOEXEC) == 0) return;
  const int err = errno;
  throw ProcessError("cannot start '" + program + "': pipe2: " + std::strerror(err) +
                     (err == EMFILE || err == ENFILE ? " (out of file descriptors: raise the limit, ulimit -n)" : ""));
}

// In the child between fork and exec: only async-signal-safe calls.
[[noreturn]] void exec_child(const SpawnRequest& req, char* const* argv, char* const* envp, int out_w, int err_w,
                             int status_w, pid_t parent) {
  ::setpgid(0, 0);
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (::getppid() != parent) ::_exit(127);  // the launcher died before the death signal was armed
  // ddprun (and the stack tools it starts) may read this process's stacks under Yama's
  // ptrace_scope=1; without Yama this fails harmlessly.
  ::prctl(PR_SET_PTRACER, parent, 0, 0, 0);
  // ddprun ignores SIGPIPE and blocks signals for its loop; workers start with the defaults.
  struct sigaction dfl{};
  dfl.sa_handler = SIG_DFL;
  for (int s = 1; s < NSIG; ++s) ::sigaction(s, &dfl, nullptr);
  sigset_t none;
  sigemptyset(&none);
  ::sigprocmask(SIG_SETMASK, &none, nullptr);
  ::dup2(out_w, STDOUT_FILENO);
  ::dup2(err_w, STDERR_FILENO);
  // Every descriptor ddprun opens is close-on-exec; this makes sure of it for any a library may
  // have opened without (Linux 5.11+; an older kernel refuses and changes nothing).
  ::close_range(3, ~0U, CLOSE_RANGE_CLOEXEC);
  ::execvpe(argv[0], argv, envp);
  const int err = errno;
  [[maybe_unused]] auto n = ::write(status_w, &err, sizeof err);
  ::_exit(127);
}

}  // namespace

SpawnedProcess spawn_process(const SpawnRequest& req) {
  if (req.argv.empty()) throw ProcessError("no program to run");
  // Everything the child needs is prepared before fork: no allocation after it.
  std::vector<char*> argv, envp;
  for (const auto& a : req.argv) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  for (const auto& e : req.envp) envp.push_back(const_cast<char*>(e.c_str()));
  envp.push_back(nullptr);
  int out[2] = {-1, -1}, err[2] = {-1, -1}, status[2] = {-1, -1};
  try {
    pipe_cloexec(out, req.argv[0]);
    pipe_cloexec(err, req.argv[0]);
    pipe_cloexec(status, req.argv[0]);
  } catch (const ProcessError&) {
    for (int fd : {out[0], out[1], err[0], err[1], status[0], status[1]}) {
      if (fd >= 0) ::close(fd);
    }
    throw;
  }
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid < 0) {
    const int e = errno;
    for (int fd : {out[0], out[1], err[0], err[1], status[0], status[1]}) ::close(fd);
    throw ProcessError("cannot start '" + req.argv[0] + "': fork failed: " + std::strerror(e));
  }
  if (pid == 0) exec_child(req, argv.data(), envp.data(), out[1], err[1], status[1], parent);
  // Also set the group from the parent, so it exists before anyone signals it (no race with exec).
  ::setpgid(pid, pid);
  ::close(out[1]);
  ::close(err[1]);
  ::close(status[1]);
  int exec_errno = 0;
  const ssize_t n = retry_eintr([&] { return ::read(status[0], &exec_errno, sizeof exec_errno); });
  ::close(status[0]);
  if (n == sizeof exec_errno) {
    // exec failed: the child has exited with 127; collect it now.
    int st;
    retry_eintr([&] { return ::waitpid(pid, &st, 0); });
    ::close(out[0]);
    ::close(err[0]);
    std::string hint;
    if (exec_errno == ENOENT) hint = " (check the path, or PATH for a bare name)";
    if (exec_errno == EACCES) hint = " (is it executable? chmod +x, or run a script through its interpreter)";
    throw ProcessError("cannot run '" + req.argv[0] + "': " + std::strerror(exec_errno) + hint);
  }
  return SpawnedProcess{pid, out[0], err[0]};
}

void become_subreaper() { ::prctl(PR_SET_CHILD_SUBREAPER, 1); }

OrphanGuard::OrphanGuard() {
  int fds[2];
  pipe_cloexec(fds, "the orphan guard");
  const pid_t pid = ::fork();
  if (pid < 0) throw std::system_error(errno, std::generic_category(), "fork (orphan guard)");
  if (pid == 0) {
    // The guard: own session (terminal signals do not reach it), nothing inherited kept open.
    ::setsid();
    ::prctl(PR_SET_NAME, "ddprun-guard");
    struct sigaction ign{};
    ign.sa_handler = SIG_IGN;
    for (int s : {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGPIPE, SIGUSR1, SIGUSR2}) ::sigaction(s, &ign, nullptr);
    const int devnull = ::open("/dev/null", O_RDWR);
    for (int fd = 0; fd < 3; ++fd) ::dup2(devnull, fd);
    const long max_fd = ::sysconf(_SC_OPEN_MAX);
    for (int fd = 3; fd < max_fd && fd < 65536; ++fd) {
      if (fd != fds[0]) ::close(fd);
    }
    std::set<pid_t> groups;
    bool goodbye = false;
    for (;;) {
      char rec[1 + sizeof(pid_t)];
      size_t got = 0;
      while (got < sizeof rec) {
        const ssize_t r = ::read(fds[0], rec + got, sizeof rec - got);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) break;
        got += static_cast<size_t>(r);
      }
      if (got < sizeof rec) break;  // EOF: ddprun is gone
      pid_t pg;
      std::memcpy(&pg, rec + 1, sizeof pg);
      if (rec[0] == '+') groups.insert(pg);
      if (rec[0] == '-') groups.erase(pg);
      if (rec[0] == 'q') goodbye = true;
    }
    if (!goodbye) {
      for (pid_t pg : groups) ::kill(-pg, SIGKILL);
    }
    ::_exit(0);
  }
  ::close(fds[0]);
  fd_ = fds[1];
  pid_ = pid;
}

OrphanGuard::~OrphanGuard() {
  if (fd_ < 0) return;
  send('q', 0);
  ::close(fd_);
  int st;
  retry_eintr([&] { return ::waitpid(pid_, &st, 0); });
}

void OrphanGuard::send(char op, pid_t pgid) {
  char rec[1 + sizeof(pid_t)];
  rec[0] = op;
  std::memcpy(rec + 1, &pgid, sizeof pgid);
  write_all(fd_, std::string_view(rec, sizeof rec));  // a dead guard only loses its protection; the job goes on
}

void OrphanGuard::watch_group(pid_t pgid) { send('+', pgid); }
void OrphanGuard::forget_group(pid_t pgid) { send('-', pgid); }

}  // namespace ddprun::launcher
