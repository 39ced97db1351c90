#pragma once
// Where a worker is: its stacks, captured without stopping it for more than a moment.
//
// Python: when stack capture is on, ddprun's Python hook (python_hook.hpp) arms Python's
// faulthandler on DDPRUN_STACK_SIGNAL (SIGRTMIN+7) to write the tracebacks of all threads to
// DDPRUN_STACK_DIR/python.<pid>.txt, in every Python process that is the leader of its process
// group (a worker, not its data loader processes). The signal is only ever sent to a process that
// created its file, so no other program gets it.
//
// Native: eu-stack (Debian's elfutils) -p PID, or gdb in batch mode when eu-stack is missing, with a
// time limit; the frames of every thread. Both need ptrace rights over the worker: ddprun's workers
// name ddprun their tracer (PR_SET_PTRACER), which Yama's ptrace_scope=1 accepts.

#include <sys/types.h>

#include <chrono>
#include <string>
#include <vector>

namespace ddprun::launcher::watchdog {

// The signal that makes an armed Python worker write its tracebacks.
int stack_signal();

struct RankStacks {
  std::string python;                 // faulthandler's output for the worker's Python processes ("" if none)
  std::string native;                 // the tool's output
  std::string native_tool;            // "eu-stack", "gdb" or "" (none installed)
  std::vector<std::string> problems;  // what could not be captured, and why
};

// Captures the stacks of process `pid` of the worker whose process group is `group`: Python
// tracebacks from the armed processes of `tree` (the worker's process tree) through `stack_dir`,
// then native frames of `pid`. Each part is bounded by `limit`. Safe to call from any thread, for
// several workers at once.
RankStacks capture_stacks(pid_t pid, pid_t group, const std::vector<pid_t>& tree, const std::string& stack_dir,
                          std::chrono::milliseconds limit);

// Writes `stacks` to `path`, readable by this user alone: `heading`, what could not be captured,
// then every Python and native thread in full. False when the file could not be written.
bool write_stacks_file(const std::string& path, const std::string& heading, const RankStacks& stacks);

// The first `max_lines` lines of `text`, with a note of how many were left out.
std::string first_lines(const std::string& text, size_t max_lines);

}  // namespace ddprun::launcher::watchdog
