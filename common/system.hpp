#pragma once
// Small process-level helpers shared by the daemon, the launcher and the benchmarks.

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <string>

namespace ddprun {

// Raises the soft open-file limit to the hard limit (a store serving thousands of clients needs
// more than the usual 1024). Returns the new soft limit.
uint64_t raise_open_file_limit();

// CPU time (user + system) a process has used so far, from /proc/<pid>/stat; pid 0 = this process.
std::chrono::microseconds process_cpu_time(pid_t pid = 0);

// Peak resident set size (VmHWM) of a process in KiB, from /proc/<pid>/status; pid 0 = this process.
uint64_t peak_rss_kib(pid_t pid = 0);

// A duration for messages: "30s", or "250ms" when not a whole number of seconds.
std::string seconds_text(std::chrono::milliseconds d);

// "SIGTERM", or "signal 42" for a number without a name.
std::string signal_name(int signo);

}  // namespace ddprun
