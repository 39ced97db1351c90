#pragma once
// How a worker ended: the record the supervisor makes, the rendezvous backends share between nodes
// and the failure report formats.

#include <sys/types.h>

#include <chrono>
#include <cstddef>
#include <memory>
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
  // What the error file says (its message and Python call stack): read once, when the worker
  // ended (read_error_file), or taken from another node's record.
  std::optional<std::string> error_text;
  // The error file as the worker wrote it, for ddprun's own copy of it (agent/error_file.hpp);
  // null when it was not read on this node. Shared: the records of a job are copied around.
  std::shared_ptr<const std::string> error_document;
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

// What ddprun reads of an error file, and keeps of its message: a worker (or whatever replaced its
// file) decides their size, so both are bounded; a cut says so.
inline constexpr size_t kErrorFileLimit = size_t{1} << 20;
inline constexpr size_t kErrorTextLimit = size_t{64} << 10;

// Reads `e.error_file` into error_document and error_text, once, as the worker ends. Never waits
// and never follows: opened without blocking and without following a link at its end, read only
// if it is a regular file of this user's, its first kErrorFileLimit bytes. Anything else (a FIFO,
// a link, a device, another user's file) is not read, and a warning says what it was. Nothing
// when the worker wrote no file.
void read_error_file(WorkerExit& e);

// The message of a torchrun-format error file's text ({"message": {"message": ..., "extraInfo":
// {"py_callstack": ...}}} or {"message": "..."}), at most kErrorTextLimit bytes; `cut`: the text
// is the first kErrorFileLimit bytes of a longer file. nullopt for an empty text. Pure.
std::optional<std::string> error_message(const std::string& text, bool cut = false);

// The worker's error file is about to be removed with a temporary run directory: its text is kept
// in error_text, and error_file becomes `kept_at` (a copy; "" for none).
void keep_error_text(WorkerExit& e, const std::string& kept_at);

}  // namespace ddprun::launcher::workers
