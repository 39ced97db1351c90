#pragma once
// Where a rank is, read from the stacks its node captured (hang_report.hpp's RankState): the
// heuristics that turn eu-stack, gdb and faulthandler text into "in torch.distributed all_reduce
// (train.py:42)". Pure.

#include <sys/types.h>

#include <string>
#include <vector>

#include "launcher/watchdog/hang_report.hpp"

namespace ddprun::launcher::watchdog {

// One line where the rank is: the collective it waits in and the program's call of it, else its
// innermost Python frame, else its first native communication or non-waiting frame, else its
// process state.
std::string rank_location(const RankState& r);
// Whether the rank waits in a collective (its progress page says so, or a frame of
// torch.distributed, c10d, Gloo or NCCL is on its main thread).
bool rank_in_collective(const RankState& r);
// The function names of the main thread (its TID is `pid`) in eu-stack's or gdb's text,
// innermost first.
std::vector<std::string> native_main_functions(const std::string& stack, pid_t pid);
// `text` split at newlines.
std::vector<std::string> lines_of(const std::string& text);

}  // namespace ddprun::launcher::watchdog
