#include "launcher/workers/process.hpp"

#include <fcntl.h>
#include <linux/mempolicy.h>
#include <sched.h>
#include <sys/syscall.h>
#include <signal.h>
#include <linux/close_range.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <climits>
#include <cstring>
#include <new>
#include <set>
#include <system_error>
#include <vector>

#include "common/errors.hpp"
#include "common/system.hpp"

namespace ddprun::launcher::workers {
namespace {

// The placement a worker starts with (--numa_binding), prepared before fork.
struct Placement {
  cpu_set_t* cpus = nullptr;
  size_t cpus_bytes = 0;
  std::vector<unsigned long> nodemask;
  explicit Placement(const SpawnRequest& req) {
    if (!req.cpus.empty()) {
      const int count = *req.cpus.rbegin() + 1;
      cpus = CPU_ALLOC(count);
      cpus_bytes = CPU_ALLOC_SIZE(count);
      CPU_ZERO_S(cpus_bytes, cpus);
      for (int c : req.cpus) CPU_SET_S(c, cpus_bytes, cpus);
    }
    if (req.preferred_numa_node >= 0) {
      constexpr size_t kBits = 8 * sizeof(unsigned long);
      const auto node = static_cast<size_t>(req.preferred_numa_node);
      nodemask.assign(node / kBits + 1, 0);
      nodemask[node / kBits] |= 1UL << (node % kBits);
    }
  }
  ~Placement() {
    if (cpus) CPU_FREE(cpus);
  }
  Placement(const Placement&) = delete;
  Placement& operator=(const Placement&) = delete;
  // In the child: affinity and memory policy are kept across exec. A refused memory policy (a
  // container's seccomp filter, say) leaves the default, which is only slower.
  void apply() const {
    if (cpus) ::sched_setaffinity(0, cpus_bytes, cpus);
    if (!nodemask.empty()) {
      ::syscall(SYS_set_mempolicy, MPOL_PREFERRED, nodemask.data(), nodemask.size() * 8 * sizeof(unsigned long) + 1);
    }
  }
};

// In the child between fork and exec: only async-signal-safe calls.
[[noreturn]] void exec_child(const SpawnRequest& req, const Placement& placement, char* const* argv, char* const* envp,
                             int out_w, int err_w, int status_w, pid_t parent) {
  ::setpgid(0, 0);
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (::getppid() != parent) ::_exit(127);  // the launcher died before the death signal was armed
  // ddprun (and the stack tools it starts) may read this process's stacks under Yama's
  // ptrace_scope=1; without Yama this fails harmlessly.
  ::prctl(PR_SET_PTRACER, parent, 0, 0, 0);
  default_signals_in_child();
  ::dup2(out_w, STDOUT_FILENO);
  ::dup2(err_w, STDERR_FILENO);
  // Every descriptor ddprun opens is close-on-exec; this makes sure of it for any a library may
  // have opened without (Linux 5.11+; an older kernel refuses and changes nothing).
  ::close_range(3, ~0U, CLOSE_RANGE_CLOEXEC);
  placement.apply();
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
  const std::string what = "'" + req.argv[0] + "'";
  Pipe out = make_pipe(what), err = make_pipe(what), status = make_pipe(what);
  const Placement placement(req);
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid < 0) throw ProcessError("cannot start '" + req.argv[0] + "': fork failed: " + std::strerror(errno));
  // (the child execs or _exits: the parent's descriptors are not closed there by destructors)
  if (pid == 0) {
    exec_child(req, placement, argv.data(), envp.data(), out.write.get(), err.write.get(), status.write.get(), parent);
  }
  // Also set the group from the parent, so it exists before anyone signals it (no race with exec).
  ::setpgid(pid, pid);
  out.write.reset();
  err.write.reset();
  status.write.reset();
  int exec_errno = 0;
  const ssize_t n = retry_eintr([&] { return ::read(status.read.get(), &exec_errno, sizeof exec_errno); });
  status.read.reset();
  if (n == sizeof exec_errno) {
    // exec failed: the child has exited with 127; collect it now.
    int st;
    retry_eintr([&] { return ::waitpid(pid, &st, 0); });
    std::string hint;
    if (exec_errno == ENOENT) hint = " (check the path, or PATH for a bare name)";
    if (exec_errno == EACCES) hint = " (is it executable? chmod +x, or run a script through its interpreter)";
    throw ProcessError("cannot run '" + req.argv[0] + "': " + std::strerror(exec_errno) + hint);
  }
  return SpawnedProcess{pid, std::move(out.read), std::move(err.read)};
}

Pipe make_pipe(const std::string& what) {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) == 0) return Pipe{UniqueFd(fds[0]), UniqueFd(fds[1])};
  const int err = errno;
  throw ProcessError("cannot start " + what + ": pipe2: " + std::strerror(err) +
                     (err == EMFILE || err == ENFILE ? " (out of file descriptors: raise the limit, ulimit -n)" : ""));
}

void become_subreaper() { ::prctl(PR_SET_CHILD_SUBREAPER, 1); }

void default_signals_in_child() noexcept {
  struct sigaction dfl {};
  dfl.sa_handler = SIG_DFL;
  for (int s = 1; s < NSIG; ++s) ::sigaction(s, &dfl, nullptr);
  sigset_t none;
  sigemptyset(&none);
  ::sigprocmask(SIG_SETMASK, &none, nullptr);
}

struct OrphanGuard::Shared {
  std::atomic<int64_t> fenced_window_ms{-1};  // set by the guard when it fenced
};

namespace {

int64_t monotonic_ms() {
  timespec ts{};
  ::clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000 + ts.tv_nsec / 1'000'000;
}

// The guard's loop: records of one op byte and an int32 from ddprun, until EOF.
[[noreturn]] void guard_main(int fd, std::atomic<int64_t>& fenced_window_ms) {
  std::set<pid_t> groups;
  bool goodbye = false;
  int64_t window_ms = 0;  // 0: the fence is not armed
  int64_t deadline_ms = 0;
  constexpr size_t kRecord = 1 + sizeof(int32_t);
  char buf[64 * kRecord];
  size_t have = 0;
  for (;;) {
    int timeout = -1;
    if (window_ms > 0 && !groups.empty())
      timeout = static_cast<int>(std::max<int64_t>(0, deadline_ms - monotonic_ms()));
    pollfd p{fd, POLLIN, 0};
    const int rc = ::poll(&p, 1, timeout);
    if (rc < 0 && errno == EINTR) continue;
    if (rc == 0) {
      // No renewal within the window: the other nodes may count this node as lost and re-form
      // without it. Its workers must not run on beside them.
      // Said first: ddprun, reaping the workers, then knows who killed them.
      fenced_window_ms.store(window_ms);
      for (pid_t pg : groups) ::kill(-pg, SIGKILL);
      groups.clear();
      window_ms = 0;
      continue;
    }
    const ssize_t r = ::read(fd, buf + have, sizeof buf - have);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) break;  // EOF: ddprun is gone
    have += static_cast<size_t>(r);
    size_t at = 0;
    for (; have - at >= kRecord; at += kRecord) {
      int32_t v;
      std::memcpy(&v, buf + at + 1, sizeof v);
      switch (buf[at]) {
        case '+':
          // ddprun starting a worker is alive now: a lapse before it does not count.
          groups.insert(static_cast<pid_t>(v));
          deadline_ms = monotonic_ms() + window_ms;
          break;
        case '-': groups.erase(static_cast<pid_t>(v)); break;
        case 'q': goodbye = true; break;
        case 'f': window_ms = v; [[fallthrough]];
        case 'r': deadline_ms = monotonic_ms() + window_ms; break;
        default: break;
      }
    }
    std::memmove(buf, buf + at, have - at);
    have -= at;
  }
  if (!goodbye) {
    for (pid_t pg : groups) ::kill(-pg, SIGKILL);
  }
  ::_exit(0);
}

}  // namespace

OrphanGuard::OrphanGuard() {
  void* page = ::mmap(nullptr, sizeof(Shared), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (page == MAP_FAILED) throw std::system_error(errno, std::generic_category(), "mmap (orphan guard)");
  shared_ = new (page) Shared();
  Pipe pipe = make_pipe("the orphan guard");
  const pid_t pid = ::fork();
  if (pid < 0) throw std::system_error(errno, std::generic_category(), "fork (orphan guard)");
  if (pid == 0) {
    // The guard: own session (terminal signals do not reach it), nothing inherited kept open.
    ::setsid();
    ::prctl(PR_SET_NAME, "ddprun-guard");
    struct sigaction ign {};
    ign.sa_handler = SIG_IGN;
    for (int s : {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGPIPE, SIGUSR1, SIGUSR2}) ::sigaction(s, &ign, nullptr);
    const int devnull = ::open("/dev/null", O_RDWR);
    for (int fd = 0; fd < 3; ++fd) ::dup2(devnull, fd);
    const long max_fd = ::sysconf(_SC_OPEN_MAX);
    for (int fd = 3; fd < max_fd && fd < 65536; ++fd) {
      if (fd != pipe.read.get()) ::close(fd);
    }
    guard_main(pipe.read.get(), shared_->fenced_window_ms);
  }
  pipe.read.reset();
  fd_ = std::move(pipe.write);
  pid_ = pid;
}

OrphanGuard::~OrphanGuard() {
  if (fd_) {
    send('q', 0);
    fd_.reset();
    int st;
    retry_eintr([&] { return ::waitpid(pid_, &st, 0); });
  }
  if (shared_) ::munmap(shared_, sizeof(Shared));
}

void OrphanGuard::send(char op, int32_t value) {
  char rec[1 + sizeof(int32_t)];
  rec[0] = op;
  std::memcpy(rec + 1, &value, sizeof value);
  // One write of 5 bytes (under PIPE_BUF): atomic, so threads may send at once.
  write_all(fd_.get(), std::string_view(rec, sizeof rec));  // a dead guard only loses its protection; the job goes on
}

void OrphanGuard::watch_group(pid_t pgid) { send('+', static_cast<int32_t>(pgid)); }
void OrphanGuard::forget_group(pid_t pgid) { send('-', static_cast<int32_t>(pgid)); }

void OrphanGuard::arm_fence(std::chrono::milliseconds window) {
  send('f', static_cast<int32_t>(std::clamp<int64_t>(window.count(), 0, INT32_MAX)));
}

void OrphanGuard::renew() { send('r', 0); }

bool OrphanGuard::fenced() const { return shared_ && shared_->fenced_window_ms.load() >= 0; }

std::optional<std::chrono::milliseconds> OrphanGuard::take_fenced() {
  const int64_t w = shared_ ? shared_->fenced_window_ms.exchange(-1) : -1;
  if (w < 0) return std::nullopt;
  return std::chrono::milliseconds(w);
}

}  // namespace ddprun::launcher::workers
