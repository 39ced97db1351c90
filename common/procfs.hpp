#pragma once
// What /proc tells about a process: its CPU time, memory and start (for the benchmarks and the
// store's metrics) and, for the hang watchdog, its process tree, the CPU time that tree has used,
// its scheduler state and its TCP connections. Each call reads a few small files; a process that is
// gone reads as absent, never as an error.

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace ddprun::procfs {

struct ProcStat {
  char state = '?';  // R, S, D, T, Z, ...
  pid_t pgid = -1;
  uint64_t cpu_ticks = 0;    // utime + stime of all its threads
  uint64_t child_ticks = 0;  // cutime + cstime: children it has reaped
  uint64_t start_ticks = 0;  // when it started, in ticks since boot
  uint64_t virtual_bytes = 0;
  uint64_t rss_pages = 0;
};

// /proc/<pid>/stat (pid 0: this process); nullopt if the process is gone.
std::optional<ProcStat> read_stat(pid_t pid);
// Clock ticks per second (for cpu_ticks).
long ticks_per_second();
// "running", "sleeping", "disk sleep (uninterruptible)", "stopped", "zombie", ...
std::string state_name(char state);
// The kernel function the main thread sleeps in (/proc/<pid>/wchan), e.g. "futex_wait_queue";
// "" when running or unknown.
std::string wait_channel(pid_t pid);

// `root` and every descendant that is still its descendant (through /proc/<pid>/task/*/children),
// at most `limit` processes, parents before children.
std::vector<pid_t> process_tree(pid_t root, size_t limit = 4096);
// CPU ticks used by the tree (its live members and the children they reaped).
uint64_t tree_cpu_ticks(const std::vector<pid_t>& tree);

struct TcpConnection {
  std::string local;  // "10.0.0.1:41234", "[fe80::1]:41234" (IPv4-mapped IPv6 shown as IPv4)
  std::string remote;
  uint16_t remote_port = 0;
};
// The established TCP connections held open by any of `pids` (read in the first pid's network
// namespace).
std::vector<TcpConnection> tcp_connections(const std::vector<pid_t>& pids);

// An address and port from a kernel table line ("0100007F:1F90", or 32 hex digits for IPv6) as
// text; nullopt if malformed. Exposed for tests.
std::optional<std::string> decode_proc_endpoint(const std::string& hex, uint16_t* port = nullptr);
// "::ffff:1.2.3.4:80" / "[::ffff:1.2.3.4]:80" -> "1.2.3.4:80"; other text unchanged.
std::string normalize_endpoint(const std::string& endpoint);

}  // namespace ddprun::procfs
