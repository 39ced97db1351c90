#include "common/procfs.hpp"

#include <arpa/inet.h>
#include <dirent.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <set>
#include <sstream>

#include "common/numbers.hpp"

namespace ddprun::procfs {
namespace {

std::string read_small_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) return "";
  std::ostringstream buf;
  buf << in.rdbuf();
  return buf.str();
}

std::vector<std::string> list_dir(const std::string& path) {
  std::vector<std::string> out;
  DIR* d = ::opendir(path.c_str());
  if (!d) return out;
  while (dirent* e = ::readdir(d)) {
    if (e->d_name[0] != '.') out.emplace_back(e->d_name);
  }
  ::closedir(d);
  return out;
}

bool parse_u32_hex(const std::string& s, uint32_t& out) {
  if (s.empty() || s.size() > 8) return false;
  uint32_t v = 0;
  for (char c : s) {
    int d;
    if (c >= '0' && c <= '9') d = c - '0';
    else if (c >= 'A' && c <= 'F') d = c - 'A' + 10;
    else if (c >= 'a' && c <= 'f') d = c - 'a' + 10;
    else return false;
    v = v << 4 | static_cast<uint32_t>(d);
  }
  out = v;
  return true;
}

}  // namespace

std::optional<ProcStat> read_stat(pid_t pid) {
  const std::string text = read_small_file(pid == 0 ? "/proc/self/stat" : "/proc/" + std::to_string(pid) + "/stat");
  // The command name (field 2) may hold spaces and parentheses: fields resume after the last ')'.
  const auto close = text.rfind(')');
  if (close == std::string::npos) return std::nullopt;
  std::istringstream in(text.substr(close + 1));
  std::string f[22];
  for (auto& x : f) {
    if (!(in >> x)) return std::nullopt;
  }
  // f[i] is field i + 3: f[0] state (3), f[2] pgrp (5), f[11..14] utime, stime, cutime, cstime
  // (14..17), f[19] starttime (22), f[20] vsize (23), f[21] rss (24).
  ProcStat st;
  st.state = f[0].empty() ? '?' : f[0][0];
  const auto pgid = to_int(f[2]);
  const auto utime = to_uint(f[11]), stime = to_uint(f[12]), cutime = to_uint(f[13]), cstime = to_uint(f[14]);
  const auto start = to_uint(f[19]), vsize = to_uint(f[20]);
  const auto rss = to_int(f[21]);
  if (!pgid || !utime || !stime || !cutime || !cstime || !start || !vsize || !rss) return std::nullopt;
  st.pgid = static_cast<pid_t>(*pgid);
  st.cpu_ticks = *utime + *stime;
  st.child_ticks = *cutime + *cstime;
  st.start_ticks = *start;
  st.virtual_bytes = *vsize;
  st.rss_pages = *rss > 0 ? static_cast<uint64_t>(*rss) : 0;
  return st;
}

long ticks_per_second() {
  static const long hz = [] {
    const long v = ::sysconf(_SC_CLK_TCK);
    return v > 0 ? v : 100;
  }();
  return hz;
}

std::string state_name(char state) {
  switch (state) {
    case 'R': return "running";
    case 'S': return "sleeping";
    case 'D': return "disk sleep (uninterruptible)";
    case 'T': return "stopped";
    case 't': return "stopped by a tracer";
    case 'Z': return "zombie";
    case 'X': return "dead";
    case 'I': return "idle";
    default: return std::string("state ") + state;
  }
}

std::string wait_channel(pid_t pid) {
  std::string w = read_small_file("/proc/" + std::to_string(pid) + "/wchan");
  if (w == "0") return "";
  return w;
}

std::vector<pid_t> process_tree(pid_t root, size_t limit) {
  std::vector<pid_t> out;
  if (!read_stat(root)) return out;
  out.push_back(root);
  std::set<pid_t> seen{root};
  for (size_t i = 0; i < out.size() && out.size() < limit; ++i) {
    const std::string task_dir = "/proc/" + std::to_string(out[i]) + "/task";
    for (const std::string& tid : list_dir(task_dir)) {
      std::istringstream children(read_small_file(task_dir + "/" + tid + "/children"));
      pid_t child;
      while (children >> child && out.size() < limit) {
        if (seen.insert(child).second) out.push_back(child);
      }
    }
  }
  return out;
}

uint64_t tree_cpu_ticks(const std::vector<pid_t>& tree) {
  uint64_t total = 0;
  for (pid_t p : tree) {
    if (auto st = read_stat(p)) total += st->cpu_ticks + st->child_ticks;
  }
  return total;
}

std::optional<std::string> decode_proc_endpoint(const std::string& hex, uint16_t* port) {
  const auto colon = hex.find(':');
  if (colon == std::string::npos) return std::nullopt;
  const std::string addr = hex.substr(0, colon);
  uint32_t p = 0;
  if (!parse_u32_hex(hex.substr(colon + 1), p) || p > 65535) return std::nullopt;
  char text[INET6_ADDRSTRLEN] = {};
  std::string host;
  if (addr.size() == 8) {
    in_addr a{};
    uint32_t v;
    if (!parse_u32_hex(addr, v)) return std::nullopt;
    a.s_addr = v;  // printed by the kernel as the raw 32-bit word, in host order
    if (!::inet_ntop(AF_INET, &a, text, sizeof text)) return std::nullopt;
    host = text;
  } else if (addr.size() == 32) {
    in6_addr a{};
    for (int i = 0; i < 4; ++i) {
      uint32_t v;
      if (!parse_u32_hex(addr.substr(static_cast<size_t>(i) * 8, 8), v)) return std::nullopt;
      std::memcpy(&a.s6_addr[static_cast<size_t>(i) * 4], &v, 4);
    }
    if (!::inet_ntop(AF_INET6, &a, text, sizeof text)) return std::nullopt;
    host = std::string("[") + text + "]";
  } else {
    return std::nullopt;
  }
  if (port) *port = static_cast<uint16_t>(p);
  return normalize_endpoint(host + ":" + std::to_string(p));
}

std::string normalize_endpoint(const std::string& endpoint) {
  for (const char* mapped : {"[::ffff:", "::ffff:"}) {
    const size_t n = std::strlen(mapped);
    if (endpoint.compare(0, n, mapped) != 0) continue;
    std::string rest = endpoint.substr(n);
    const bool bracketed = mapped[0] == '[';
    const auto close = bracketed ? rest.find(']') : rest.rfind(':');
    if (close == std::string::npos || rest.substr(0, close).find('.') == std::string::npos) return endpoint;
    return rest.substr(0, close) + ":" + rest.substr(close + (bracketed ? 2 : 1));
  }
  return endpoint;
}

std::vector<TcpConnection> tcp_connections(const std::vector<pid_t>& pids) {
  std::vector<TcpConnection> out;
  if (pids.empty()) return out;
  std::set<std::string> inodes;
  for (pid_t p : pids) {
    const std::string fd_dir = "/proc/" + std::to_string(p) + "/fd";
    for (const std::string& fd : list_dir(fd_dir)) {
      char target[128];
      const ssize_t n = ::readlink((fd_dir + "/" + fd).c_str(), target, sizeof target - 1);
      if (n <= 0) continue;
      const std::string t(target, static_cast<size_t>(n));
      if (t.rfind("socket:[", 0) == 0 && t.back() == ']') inodes.insert(t.substr(8, t.size() - 9));
    }
  }
  if (inodes.empty()) return out;
  for (const char* table : {"tcp", "tcp6"}) {
    std::istringstream lines(read_small_file("/proc/" + std::to_string(pids.front()) + "/net/" + table));
    std::string line;
    std::getline(lines, line);  // header
    while (std::getline(lines, line)) {
      std::istringstream f(line);
      std::string sl, local, remote, st, queues, timer, retr, uid, timeout, inode;
      if (!(f >> sl >> local >> remote >> st >> queues >> timer >> retr >> uid >> timeout >> inode)) continue;
      if (st != "01" || inodes.count(inode) == 0) continue;  // 01: ESTABLISHED
      TcpConnection c;
      auto l = decode_proc_endpoint(local);
      auto r = decode_proc_endpoint(remote, &c.remote_port);
      if (!l || !r) continue;
      c.local = *l;
      c.remote = *r;
      out.push_back(std::move(c));
    }
  }
  return out;
}

}  // namespace ddprun::procfs
