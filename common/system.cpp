#include "common/system.hpp"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <string.h>  // sigabbrev_np
#include <unistd.h>

#include <cstdio>
#include <ctime>
#include <set>
#include <fstream>
#include <sstream>
#include <string>

#include "common/procfs.hpp"

namespace ddprun {

uint64_t raise_open_file_limit() {
  rlimit lim{};
  if (::getrlimit(RLIMIT_NOFILE, &lim) != 0) return 0;
  if (lim.rlim_cur < lim.rlim_max) {
    lim.rlim_cur = lim.rlim_max;
    ::setrlimit(RLIMIT_NOFILE, &lim);
    ::getrlimit(RLIMIT_NOFILE, &lim);
  }
  return lim.rlim_cur;
}

std::chrono::microseconds process_cpu_time(pid_t pid) {
  const auto st = procfs::read_stat(pid);
  if (!st) return std::chrono::microseconds(0);
  return std::chrono::microseconds(st->cpu_ticks * 1'000'000ULL / static_cast<uint64_t>(procfs::ticks_per_second()));
}

uint64_t peak_rss_kib(pid_t pid) {
  const std::string path = pid == 0 ? "/proc/self/status" : "/proc/" + std::to_string(pid) + "/status";
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmHWM:", 0) == 0) return std::stoull(line.substr(6));
  }
  return 0;
}

std::string seconds_text(std::chrono::milliseconds d) {
  return d.count() % 1000 == 0 ? std::to_string(d.count() / 1000) + "s" : std::to_string(d.count()) + "ms";
}

int64_t now_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::string utc_timestamp(std::chrono::system_clock::time_point t) {
  using namespace std::chrono;
  const std::time_t secs = system_clock::to_time_t(t);
  const auto millis = duration_cast<milliseconds>(t.time_since_epoch()).count() % 1000;
  std::tm tm{};
  ::gmtime_r(&secs, &tm);
  char stamp[64];
  std::snprintf(stamp, sizeof stamp, "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", tm.tm_year + 1900, tm.tm_mon + 1,
                tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, static_cast<int>(millis < 0 ? 0 : millis));
  return stamp;
}

std::string signal_name(int signo) {
  const char* abbrev = sigabbrev_np(signo);
  return abbrev ? std::string("SIG") + abbrev : "signal " + std::to_string(signo);
}

namespace {

std::string numeric_address(const sockaddr* sa) {
  char text[INET6_ADDRSTRLEN] = {};
  if (sa->sa_family == AF_INET) {
    ::inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(sa)->sin_addr, text, sizeof text);
  } else if (sa->sa_family == AF_INET6) {
    ::inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6*>(sa)->sin6_addr, text, sizeof text);
  }
  return text;
}

}  // namespace

std::string fully_qualified_host_name() {
  char name[256] = {};
  if (::gethostname(name, sizeof name - 1) != 0 || name[0] == '\0') return "";
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_CANONNAME;
  addrinfo* self = nullptr;
  std::string canonical;
  if (::getaddrinfo(name, nullptr, &hints, &self) == 0) {
    if (self->ai_canonname != nullptr) canonical = self->ai_canonname;
    ::freeaddrinfo(self);
  }
  return canonical.empty() ? name : canonical;
}

bool names_this_machine(const std::string& host) {
  if (host.empty()) return false;
  if (host == "localhost" || host.rfind("127.", 0) == 0 || host == "::1") return true;
  char name[256] = {};
  if (::gethostname(name, sizeof name - 1) == 0 && host == name) return true;
  if (host == fully_qualified_host_name()) return true;
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  std::set<std::string> local;
  ifaddrs* interfaces = nullptr;
  if (::getifaddrs(&interfaces) != 0) return false;
  for (const ifaddrs* i = interfaces; i != nullptr; i = i->ifa_next) {
    if (i->ifa_addr != nullptr) local.insert(numeric_address(i->ifa_addr));
  }
  ::freeifaddrs(interfaces);
  addrinfo* found = nullptr;
  hints.ai_flags = 0;
  if (::getaddrinfo(host.c_str(), nullptr, &hints, &found) != 0) return false;
  bool match = false;
  for (const addrinfo* a = found; a != nullptr && !match; a = a->ai_next) {
    const std::string text = numeric_address(a->ai_addr);
    match = text.rfind("127.", 0) == 0 || text == "::1" || local.count(text) != 0;
  }
  ::freeaddrinfo(found);
  return match;
}

}  // namespace ddprun
