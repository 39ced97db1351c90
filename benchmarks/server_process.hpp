#pragma once
// A store server in a process of its own, for the benchmarks that measure one: ddprun-rendezvous,
// or LibTorch's server through `store_bench serve torch`. It prints its port on its first line.

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "common/system.hpp"

namespace ddprun::bench {

// Started at construction; its first stdout line holds the port (its last number).
struct ServerProcess {
  pid_t pid = -1;
  int stdin_fd = -1;
  uint16_t port = 0;
  uint64_t idle_rss_kib = 0;

  // `argv[0]` is the program's path. `quiet`: its stderr goes to /dev/null.
  explicit ServerProcess(std::vector<std::string> argv, bool quiet = true) {
    int in[2], out[2];
    if (::pipe2(in, O_CLOEXEC) != 0 || ::pipe2(out, O_CLOEXEC) != 0) throw std::runtime_error("pipe");
    std::vector<char*> args;
    for (auto& a : argv) args.push_back(a.data());
    args.push_back(nullptr);
    pid = ::fork();
    if (pid == 0) {
      ::dup2(in[0], STDIN_FILENO);
      ::dup2(out[1], STDOUT_FILENO);
      if (quiet) ::dup2(::open("/dev/null", O_WRONLY), STDERR_FILENO);
      ::execv(args[0], args.data());
      ::_exit(127);
    }
    ::close(in[0]);
    ::close(out[1]);
    stdin_fd = in[1];
    std::string line;
    char c;
    while (::read(out[0], &c, 1) == 1 && c != '\n') line.push_back(c);
    ::close(out[0]);
    const auto digits = line.find_last_not_of("0123456789");
    if (line.empty() || digits == line.size() - 1) throw std::runtime_error("server did not print its port: " + line);
    port = static_cast<uint16_t>(std::stoi(line.substr(digits + 1)));
    idle_rss_kib = rss_kib();
  }
  ~ServerProcess() {
    ::close(stdin_fd);  // `store_bench serve` stops when its stdin closes, the daemon at SIGTERM
    ::kill(pid, SIGTERM);
    int status;
    ::waitpid(pid, &status, 0);
  }
  std::chrono::microseconds cpu() const { return ddprun::process_cpu_time(pid); }
  uint64_t rss_kib() const {
    FILE* f = std::fopen(("/proc/" + std::to_string(pid) + "/status").c_str(), "r");
    char line[256];
    uint64_t v = 0;
    while (f && std::fgets(line, sizeof line, f)) {
      if (std::strncmp(line, "VmRSS:", 6) == 0) v = std::strtoull(line + 6, nullptr, 10);
    }
    if (f) std::fclose(f);
    return v;
  }
};

}  // namespace ddprun::bench
