#include "launcher/watchdog/stacks.hpp"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <thread>

#include "common/errors.hpp"
#include "common/unique_fd.hpp"
#include "launcher/workers/process.hpp"
#include "common/procfs.hpp"
#include "launcher/workers/worker_env.hpp"

#ifndef P_PIDFD
#define P_PIDFD 3
#endif

namespace ddprun::launcher::watchdog {

using workers::current_environment;
using workers::Environment;
using workers::spawn_process;
using workers::SpawnedProcess;
using workers::SpawnRequest;
using workers::to_envp;
namespace {

constexpr size_t kMaxToolOutput = size_t{512} << 10;

std::string read_from(const std::string& path, std::streamoff offset) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return "";
  in.seekg(offset);
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

off_t file_size(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 ? st.st_size : -1;
}

// The executable `name` on PATH, or "".
std::string find_on_path(const std::string& name) {
  const char* path = std::getenv("PATH");
  std::istringstream dirs(path ? path : "/usr/bin:/bin");
  std::string dir;
  while (std::getline(dirs, dir, ':')) {
    std::string candidate = (dir.empty() ? "." : dir) + "/" + name;
    if (::access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  for (const char* d : {"/usr/bin/", "/usr/local/bin/"}) {
    std::string candidate = std::string(d) + name;
    if (::access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  return "";
}

// Runs `argv` and returns what it printed (stdout, then stderr), killing it at `deadline`.
std::string run_bounded(const std::vector<std::string>& argv, std::chrono::steady_clock::time_point deadline,
                        bool& timed_out) {
  timed_out = false;
  SpawnRequest req;
  req.argv = argv;
  Environment env = current_environment();
  env["LC_ALL"] = "C";
  env.erase("DEBUGINFOD_URLS");  // never wait on the network for symbols
  req.envp = to_envp(env);
  SpawnedProcess p = spawn_process(req);
  // A pidfd: the process may be reaped by ddprun's SIGCHLD handler at any moment, and a pid alone
  // could then name another process.
  const UniqueFd pidfd(static_cast<int>(::syscall(SYS_pidfd_open, p.pid, 0)));
  std::string out, err;
  UniqueFd* pipes[2] = {&p.stdout_fd, &p.stderr_fd};
  pollfd fds[2] = {{p.stdout_fd.get(), POLLIN, 0}, {p.stderr_fd.get(), POLLIN, 0}};
  int open_count = 2;
  char buf[16384];
  while (open_count > 0) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      timed_out = true;
      break;
    }
    const int r = ::poll(fds, 2, static_cast<int>(std::min<int64_t>(left.count(), 1000)));
    if (r < 0 && errno != EINTR) break;
    for (int i = 0; i < 2; ++i) {
      if (fds[i].fd < 0 || !(fds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      const ssize_t n = ::read(fds[i].fd, buf, sizeof buf);
      if (n > 0) {
        std::string& dst = i == 0 ? out : err;
        if (dst.size() < kMaxToolOutput) dst.append(buf, static_cast<size_t>(n));
      } else if (n == 0 || (errno != EINTR && errno != EAGAIN)) {
        pipes[i]->reset();
        fds[i].fd = -1;
        --open_count;
      }
    }
  }
  p.stdout_fd.reset();
  p.stderr_fd.reset();
  if (pidfd) {
    if (timed_out) ::syscall(SYS_pidfd_send_signal, pidfd.get(), SIGKILL, nullptr, 0);
    siginfo_t info{};
    // Collected here unless ddprun's reaper got it first (then ECHILD at once).
    ::waitid(static_cast<idtype_t>(P_PIDFD), static_cast<id_t>(pidfd.get()), &info, WEXITED);
  }
  if (!err.empty()) out += (out.empty() || out.back() == '\n' ? "" : "\n") + err;
  return out;
}

}  // namespace

int stack_signal() { return SIGRTMIN + 7; }

namespace {

// Python: signal every armed process of the worker's tree (faulthandler writes its tracebacks to
// its file in the stack directory), then collect what each wrote.
void python_stacks(pid_t group, const std::vector<pid_t>& tree, const std::string& stack_dir,
                   std::chrono::milliseconds limit, RankStacks& s) {
  struct Armed {
    pid_t pid;
    std::string file;
    off_t before;
  };
  std::vector<Armed> armed;
  for (pid_t p : tree) {
    const std::string file = stack_dir + "/python." + std::to_string(p) + ".txt";
    const off_t size = file_size(file);
    if (size < 0) continue;
    auto st = procfs::read_stat(p);
    if (!st || st->pgid != group) continue;  // not (or no longer) a process of this worker
    if (::kill(p, stack_signal()) == 0) armed.push_back({p, file, size});
  }
  if (armed.empty()) return;
  // faulthandler writes from its signal handler, in one go: wait until every file has grown and
  // stopped growing.
  const auto deadline = std::chrono::steady_clock::now() + limit;
  std::vector<off_t> last(armed.size(), -1);
  int stable_rounds = 0;
  while (std::chrono::steady_clock::now() < deadline && stable_rounds < 2) {
    std::this_thread::sleep_for(
        std::chrono::milliseconds(50));  // sleep override: polling a file another process writes
    bool all_grown = true, unchanged = true;
    for (size_t i = 0; i < armed.size(); ++i) {
      const off_t now = file_size(armed[i].file);
      all_grown = all_grown && now > armed[i].before;
      unchanged = unchanged && now == last[i];
      last[i] = now;
    }
    stable_rounds = all_grown && unchanged ? stable_rounds + 1 : 0;
  }
  for (const Armed& a : armed) {
    std::string text = read_from(a.file, a.before);
    if (text.empty()) {
      s.problems.push_back("Python process " + std::to_string(a.pid) + " did not write its tracebacks within " +
                           std::to_string(static_cast<double>(limit.count()) / 1000.0).substr(0, 4) +
                           " s (busy in code that holds off signals?)");
      continue;
    }
    if (armed.size() > 1 || a.pid != group) s.python += "Process " + std::to_string(a.pid) + ":\n";
    s.python += text;
  }
}

// Native frames of the worker's main process, by eu-stack or else gdb, bounded by `limit`.
void native_stacks(pid_t pid, std::chrono::milliseconds limit, RankStacks& s) {
  std::vector<std::string> argv;
  if (std::string tool = find_on_path("eu-stack"); !tool.empty()) {
    s.native_tool = "eu-stack";
    argv = {tool, "-p", std::to_string(pid)};
  } else if (std::string gdb = find_on_path("gdb"); !gdb.empty()) {
    s.native_tool = "gdb";
    argv = {gdb, "-nx", "-batch", "-p", std::to_string(pid), "-ex", "thread apply all bt"};
  } else {
    s.problems.push_back("no native stacks: neither eu-stack (apt install elfutils) nor gdb is installed");
    return;
  }
  try {
    bool timed_out = false;
    s.native = run_bounded(argv, std::chrono::steady_clock::now() + limit, timed_out);
    if (timed_out) {
      s.problems.push_back(s.native_tool + " did not finish within " + std::to_string(limit.count() / 1000) +
                           " s: its output is partial");
    }
  } catch (const std::exception& e) {
    s.problems.push_back(s.native_tool + ": " + e.what());
  }
}

}  // namespace

RankStacks capture_stacks(pid_t pid, pid_t group, const std::vector<pid_t>& tree, const std::string& stack_dir,
                          std::chrono::milliseconds limit) {
  RankStacks s;
  if (!stack_dir.empty()) python_stacks(group, tree, stack_dir, limit, s);
  native_stacks(pid, limit, s);
  return s;
}

std::string first_lines(const std::string& text, size_t max_lines) {
  size_t pos = 0, lines = 0;
  while (pos < text.size() && lines < max_lines) {
    const auto nl = text.find('\n', pos);
    pos = nl == std::string::npos ? text.size() : nl + 1;
    ++lines;
  }
  if (pos >= text.size()) return text;
  size_t rest = 0;
  for (size_t i = pos; i < text.size(); ++i) rest += text[i] == '\n' ? 1 : 0;
  return text.substr(0, pos) + "... (" + std::to_string(rest + (text.back() == '\n' ? 0 : 1)) + " more lines)\n";
}

bool write_stacks_file(const std::string& path, const std::string& heading, const RankStacks& stacks) {
  {
    std::ofstream out(path, std::ios::trunc);
    out << heading << "\n";
    for (const auto& p : stacks.problems) out << "note: " << p << "\n";
    if (!stacks.python.empty()) out << "\n== Python (faulthandler, all threads) ==\n" << stacks.python;
    if (!stacks.native.empty()) out << "\n== native (" << stacks.native_tool << ", all threads) ==\n" << stacks.native;
    out.close();
    if (!out) return false;
  }
  ::chmod(path.c_str(), 0600);
  return true;
}

}  // namespace ddprun::launcher::watchdog
