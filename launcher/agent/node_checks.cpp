#include "launcher/agent/node_checks.hpp"

#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>

#include "common/errors.hpp"
#include "common/system.hpp"
#include "launcher/workers/contained_command.hpp"
#include "launcher/workers/worker_env.hpp"

namespace ddprun::launcher::agent {

namespace {

// "0 B", "512 KiB", "1.5 GiB": the unit that keeps the figure below 1024.
std::string size_text(uint64_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  double v = static_cast<double>(bytes);
  size_t u = 0;
  while (v >= 1024.0 && u + 1 < std::size(units)) {
    v /= 1024.0;
    ++u;
  }
  char text[32];
  std::snprintf(text, sizeof text, v == static_cast<double>(static_cast<uint64_t>(v)) ? "%.0f %s" : "%.1f %s", v,
                units[u]);
  return text;
}

// What a finished script says, cut to its last non-empty line (the reason scripts print last).
std::string last_line(const std::string& output) {
  size_t end = output.find_last_not_of(" \t\r\n");
  if (end == std::string::npos) return "";
  const size_t begin = output.rfind('\n', end);
  std::string line =
      output.substr(begin == std::string::npos ? 0 : begin + 1, end + 1 - (begin == std::string::npos ? 0 : begin + 1));
  if (line.size() > 300) line = line.substr(0, 300) + "...";
  return line;
}

struct ScriptRun {
  bool finished = false;  // false: killed at the timeout
  int status = 0;
  std::string output;  // stdout and stderr, the last 4 KiB
};

// Runs `argv` with the node's environment until its process exits or `timeout` passes; whatever it
// started (a child left holding its output, one that called setsid) is killed then
// (contained_command.hpp); a stop request ends it too (StopRequested).
ScriptRun run_bounded(const std::vector<std::string>& argv, std::chrono::milliseconds timeout, const StopSignal& stop) {
  const workers::ContainedRun c =
      workers::run_contained(argv, workers::to_envp(workers::current_environment()), timeout, stop);
  if (c.end == workers::ContainedRun::End::Stopped) throw StopRequested(stop.signo());
  ScriptRun run;
  run.finished = c.end == workers::ContainedRun::End::Exited;
  run.status = c.status;
  run.output = c.output;
  return run;
}

std::string exit_text(int status) {
  if (WIFSIGNALED(status)) return "was killed by " + signal_name(WTERMSIG(status));
  return "exited with " + std::to_string(WEXITSTATUS(status));
}

}  // namespace

std::optional<std::string> check_free_space(const cli::FreeSpaceCheck& c) {
  struct statvfs st {};
  if (::statvfs(c.path.c_str(), &st) != 0) {
    return "--check_free_space: cannot read the free space of " + c.path + ": " + std::strerror(errno);
  }
  const uint64_t free_bytes = static_cast<uint64_t>(st.f_bavail) * st.f_frsize;
  if (free_bytes >= c.bytes) return std::nullopt;
  return "--check_free_space: " + c.path + " has " + size_text(free_bytes) + " free, " + size_text(c.bytes) + " needed";
}

std::optional<std::string> check_interface(const std::string& name, const std::string& sys_class_net) {
  const std::string dir = sys_class_net + "/" + name;
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0) return "--check_interface: this host has no network interface " + name;
  std::ifstream in(dir + "/operstate");
  std::string state;
  std::getline(in, state);
  // "unknown" is what loopback and many virtual interfaces say when they are up.
  if (state == "up" || state == "unknown") {
    std::ifstream flags_in(dir + "/flags");
    std::string flags;
    std::getline(flags_in, flags);
    const unsigned long f = flags.empty() ? 0 : std::strtoul(flags.c_str(), nullptr, 16);
    if (state == "up" || (f & 0x1) != 0) return std::nullopt;  // IFF_UP
  }
  return "--check_interface: network interface " + name + " is " + (state.empty() ? "in an unknown state" : state);
}

std::optional<std::string> check_gpu(const std::string& id, std::chrono::milliseconds timeout, const StopSignal& stop) {
  std::string what = "--check_gpus: GPU " + id;
  ScriptRun run;
  try {
    run = run_bounded({"nvidia-smi", "--query-gpu=index,name", "--format=csv,noheader", "-i", id}, timeout, stop);
  } catch (const ProcessError& e) {
    return what + ": cannot run nvidia-smi to ask it (" + e.what() + ")";
  }
  if (!run.finished) return what + " did not answer nvidia-smi within " + seconds_text(timeout);
  if (!WIFEXITED(run.status) || WEXITSTATUS(run.status) != 0) {
    const std::string said = last_line(run.output);
    return what + " is not there or does not answer: nvidia-smi " + exit_text(run.status) +
           (said.empty() ? "" : ": " + said);
  }
  return std::nullopt;
}

std::optional<std::string> check_script(const std::string& script, std::chrono::milliseconds timeout,
                                        const StopSignal& stop) {
  const std::string what = "--node_check '" + script + "'";
  ScriptRun run;
  try {
    run = run_bounded({"/bin/sh", "-c", script}, timeout, stop);
  } catch (const ProcessError& e) {
    return what + " could not start: " + e.what();
  }
  if (!run.finished) return what + " did not finish within " + seconds_text(timeout) + " (--node_check_timeout)";
  if (WIFEXITED(run.status) && WEXITSTATUS(run.status) == 0) return std::nullopt;
  const std::string said = last_line(run.output);
  return what + " " + exit_text(run.status) + (said.empty() ? "" : ": " + said);
}

std::optional<std::string> run_node_checks(const NodeCheckSettings& s, const StopSignal& stop) {
  for (const auto& c : s.free_space) {
    if (auto why = check_free_space(c)) return why;
  }
  for (const auto& name : s.interfaces) {
    if (auto why = check_interface(name)) return why;
  }
  for (const auto& id : s.gpus) {
    if (auto why = check_gpu(id, s.timeout, stop)) return why;
  }
  if (!s.script.empty()) return check_script(s.script, s.timeout, stop);
  return std::nullopt;
}

}  // namespace ddprun::launcher::agent
