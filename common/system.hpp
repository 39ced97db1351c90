#pragma once
// Small process-level helpers shared by the daemon, the launcher and the benchmarks.

#include <sys/types.h>
#include <unistd.h>

#include <cerrno>

#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>

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

// ISO 8601 in UTC with milliseconds: "2026-11-24T12:00:00.123Z".
std::string utc_timestamp(std::chrono::system_clock::time_point t);

// Wall-clock milliseconds since the epoch (records, heartbeat and publication times).
int64_t now_ms();

// "SIGTERM", or "signal 42" for a number without a name.
std::string signal_name(int signo);

// Makes a system call (a callable returning -1 with errno on failure) again for as long as a
// signal interrupts it (EINTR); returns its last result.
template <typename Call>
auto retry_eintr(Call call) {
  decltype(call()) r;
  do {
    r = call();
  } while (r == -1 && errno == EINTR);
  return r;
}

// write(2) of all of `data`, retrying EINTR and short writes. False if the descriptor failed
// (errno says why; ENOSPC when a write wrote nothing). Async-signal-safe: fit for a forked child.
// Inline: the worker SDK uses it without linking ddprun's common library.
inline bool write_all(int fd, std::string_view data) {
  while (!data.empty()) {
    const ssize_t n = retry_eintr([&] { return ::write(fd, data.data(), data.size()); });
    if (n < 0) return false;
    if (n == 0) {
      errno = ENOSPC;
      return false;
    }
    data.remove_prefix(static_cast<size_t>(n));
  }
  return true;
}

// This host's fully qualified name, as Python's socket.getfqdn() gives torchrun's default local
// address: the canonical name its host name resolves to (a Kubernetes pod's /etc/hosts names it
// <host>.<subdomain>.<namespace>.svc.cluster.local), else the host name itself.
std::string fully_qualified_host_name();

// Whether `host` (a name or an address) is this machine, as torchrun's _matches_machine_hostname
// decides a c10d agent's is_host: "localhost" and loopback addresses; this host's name and its
// canonical (DNS) name; or a name whose addresses include one of this machine's interfaces'. A
// name that does not resolve (yet: a Kubernetes pod's DNS record comes when the pod is ready) is
// not this machine.
bool names_this_machine(const std::string& host);

}  // namespace ddprun
