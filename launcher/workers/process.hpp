#pragma once
// Starting one worker process: fork + exec with its own process group, close-on-exec pipes for
// stdout and stderr, and PR_SET_PDEATHSIG(SIGKILL) so the worker dies if the launcher does.
//
// PR_SET_PDEATHSIG fires when the *thread* that forked exits, so spawn() must be called from a
// thread that lives as long as the launcher (ddprun calls it from its main thread).

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "common/unique_fd.hpp"

namespace ddprun::launcher::workers {

struct SpawnRequest {
  std::vector<std::string> argv;  // argv[0] is looked up in PATH when it has no '/'
  std::vector<std::string> envp;  // KEY=VALUE
  std::set<int> cpus;             // the CPU affinity it starts with; empty = ddprun's own
  int preferred_numa_node = -1;   // memory policy MPOL_PREFERRED on that node (best effort); -1 = default
};

struct SpawnedProcess {
  pid_t pid = -1;      // also the process group id
  UniqueFd stdout_fd;  // the read ends of its stdout and stderr
  UniqueFd stderr_fd;
};

// A close-on-exec pipe. make_pipe throws ProcessError saying what it was for and why it failed
// (out of file descriptors: which limit to raise).
struct Pipe {
  UniqueFd read, write;
};
Pipe make_pipe(const std::string& what);

// Throws ProcessError when the program cannot be executed (not found, not executable, ...); the
// message names the program and the OS error.
SpawnedProcess spawn_process(const SpawnRequest& request);

// Makes this process the reaper of orphaned descendants (grandchildren whose worker exited), so
// waitpid(-1) collects them instead of init.
void become_subreaper();

// In a child between fork and exec (async-signal-safe): every signal back to its default and none
// blocked, as a program expects at its start. ddprun ignores SIGPIPE and blocks signals for its loop,
// and the fork inherits both.
void default_signals_in_child() noexcept;

// A small process that outlives ddprun by design: it learns the process group of every worker and,
// when its pipe from ddprun closes without a clean goodbye (ddprun was SIGKILLed or crashed), kills
// those groups, so no worker or grandchild is orphaned. Start it before opening sockets or threads.
//
// It also fences a node that the others may count as lost: once armed with a window, every
// renew() (ddprun calls it after each heartbeat the rendezvous took) opens a new window; when one
// passes without a renewal (ddprun was stopped with SIGSTOP, frozen, or cut off from the
// rendezvous) it kills the workers' groups, before the other nodes re-form a group without this
// node, so two groups never run side by side.
class OrphanGuard {
 public:
  OrphanGuard();
  ~OrphanGuard();  // clean goodbye: the guard exits without killing anything
  OrphanGuard(const OrphanGuard&) = delete;
  OrphanGuard& operator=(const OrphanGuard&) = delete;

  void watch_group(pid_t pgid);
  void forget_group(pid_t pgid);
  // Arms the fence (a window of 0 disarms it); each renew() starts a new window. Thread-safe.
  void arm_fence(std::chrono::milliseconds window);
  void renew();
  // The window that passed when the guard last fenced this node's workers (once per fence);
  // nullopt if it has not since the last call.
  std::optional<std::chrono::milliseconds> take_fenced();
  // Whether the guard fenced the workers since the last take_fenced(), without taking it.
  bool fenced() const;
  pid_t pid() const { return pid_; }

 private:
  void send(char op, int32_t value);
  UniqueFd fd_;
  pid_t pid_ = -1;
  struct Shared;
  Shared* shared_ = nullptr;  // a page shared with the guard process
};

}  // namespace ddprun::launcher::workers
