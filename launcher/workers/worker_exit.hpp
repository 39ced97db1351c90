#pragma once
// How a worker ended: the record the supervisor makes, the rendezvous backends share between nodes
// and the failure report formats.

#include <sys/types.h>

#include <chrono>
#include <optional>
#include <string>
#include <vector>

namespace ddprun::launcher::workers {

struct WorkerExit {
  int rank = 0;
  int local_rank = 0;
  std::string host;
  int node_rank = -1;  // multi-node jobs
  pid_t pid = -1;
  int exit_code = 0;  // valid when signal == 0
  int signal = 0;     // the signal that killed it, or 0
  std::chrono::system_clock::time_point time;
  std::vector<std::string> stderr_tail;
  std::string error_file;  // path given to the worker
  // The error file's contents when read elsewhere (a failure reported by another node).
  std::optional<std::string> error_text;
  // What ddprun's watchdog saw before the end (a torchelastic timer that expired, with the
  // worker's stacks); "" if nothing.
  std::string diagnosis;
};

// The shell convention: the exit code, or 128 + N for death by signal N.
int shell_exit_code(const WorkerExit& e);
// "exit code 3" or "signal 9 (SIGKILL)".
std::string describe_exit(const WorkerExit& e);

// Whether the worker says it failed because a connection to a peer broke (Gloo's "Connection closed
// by peer", "Connection reset by peer", a broken pipe, NCCL's remote error): the peer's node may be
// the cause, not this rank. Looks at the error file's text and the stderr tail.
bool lost_a_peer(const WorkerExit& e);

// Reads a torchrun-format error file ({"message": {"message": ..., "extraInfo": {"py_callstack": ...}}}
// or {"message": "..."}); nullopt if absent or unreadable.
std::optional<std::string> read_error_file(const std::string& path);

}  // namespace ddprun::launcher::workers
