// A small worker for the launcher tests. Commands run in order, e.g.
//   test_worker env OUT_DIR            write the environment to OUT_DIR/env.<RANK>
//   test_worker exit-if-rank R CODE    rank R exits with CODE at once
//   test_worker exit-if-attempt-below N CODE  exit CODE while TORCHELASTIC_RESTART_COUNT < N
//   test_worker error-file MESSAGE     write TORCHELASTIC_ERROR_FILE (torchrun's JSON) and exit 1
//   test_worker error-file-as KIND [ARG]  put something else at TORCHELASTIC_ERROR_FILE and go on:
//                                      "fifo" (nobody writes it), "link TARGET", "big MB" (torchrun's
//                                      JSON, its message MB megabytes long)
//   test_worker grandchild OUT_DIR     fork a sleeping grandchild; write pids to OUT_DIR/pids.<RANK>
//   test_worker wait-signal            print "ready" and wait; on SIGUSR1 print "got SIGUSR1" and exit 0;
//                                      on SIGTERM print "got SIGTERM" and exit 0
//   test_worker store-barrier          add+wait barrier on the store at MASTER_ADDR:MASTER_PORT
//   test_worker print N                print N numbered lines to stdout and stderr
//   test_worker sleep SECONDS
//   test_worker ready-file PATH        create PATH holding this pid, whole at once (after the commands before it)
//   test_worker wait-file PATH         wait until PATH exists (exit 101 after 60 s without it)
//   test_worker fds OUT_DIR            write this process's open descriptors to OUT_DIR/fds.<RANK>
//   test_worker flood MB               print MB megabytes of 100-byte lines to stdout, fast
//   test_worker ignore-term            ignore SIGTERM from now on
//   test_worker membership             print "membership_ms=N": ms until the progress page's
//                                      membership_until_ns ("none" when 0, "no-page" without a page)
//   test_worker exclude-node REASON    ask that this node leave the job (DDPRUN_EXCLUDE_NODE_FILE)
//   test_worker iterations BASE STEP   report BASE + STEP x TORCHELASTIC_RESTART_COUNT iterations
//                                      completed on the progress page (as a program in any language would)
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <string>
#include <thread>

#include "rendezvous/client/client.hpp"

extern char** environ;

namespace {

std::string env(const char* name, const std::string& fallback = "") {
  const char* v = std::getenv(name);
  return v ? v : fallback;
}

volatile sig_atomic_t g_signal = 0;
void on_signal(int s) { g_signal = s; }

}  // namespace

int main(int argc, char** argv) {
  const std::string rank = env("RANK", "0");
  for (int i = 1; i < argc; ++i) {
    const std::string cmd = argv[i];
    auto arg = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::cerr << "test_worker: " << cmd << " needs an argument\n";
        std::exit(100);
      }
      return argv[++i];
    };
    if (cmd == "env") {
      std::ofstream out(arg() + "/env." + rank);
      for (char** e = environ; *e; ++e) out << *e << "\n";
    } else if (cmd == "exit-if-rank") {
      const std::string r = arg();
      const int code = std::stoi(arg());
      if (r == rank) {
        std::cerr << "rank " << rank << " exiting with " << code << "\n";
        return code;
      }
    } else if (cmd == "exit-if-attempt-below") {
      const int n = std::stoi(arg());
      const int code = std::stoi(arg());
      if (std::stoi(env("TORCHELASTIC_RESTART_COUNT", "0")) < n) {
        std::cerr << "attempt " << env("TORCHELASTIC_RESTART_COUNT") << " failing\n";
        return code;
      }
    } else if (cmd == "error-file") {
      const std::string msg = arg();
      std::ofstream out(env("TORCHELASTIC_ERROR_FILE"));
      out << R"({"message": {"message": "RuntimeError: )" << msg
          << R"(", "extraInfo": {"py_callstack": "Traceback: train.py line 42", "timestamp": "0"}}})";
      out.close();
      return 1;
    } else if (cmd == "error-file-as") {
      const std::string kind = arg();
      const std::string path = env("TORCHELASTIC_ERROR_FILE");
      ::unlink(path.c_str());
      if (kind == "fifo") {
        if (::mkfifo(path.c_str(), 0600) != 0) return 102;
      } else if (kind == "link") {
        if (::symlink(arg().c_str(), path.c_str()) != 0) return 102;
      } else if (kind == "big") {
        std::ofstream out(path);
        out << R"({"message": {"message": "RuntimeError: )" << std::string(std::stoul(arg()) << 20, 'x')
            << R"(", "extraInfo": {"py_callstack": "", "timestamp": "0"}}})";
      } else {
        std::cerr << "test_worker: error-file-as " << kind << "?\n";
        return 100;
      }
    } else if (cmd == "grandchild") {
      const std::string dir = arg();
      const pid_t child = ::fork();
      if (child == 0) {
        for (;;) ::pause();
      }
      std::ofstream(dir + "/pids." + rank) << ::getpid() << " " << child << "\n";
    } else if (cmd == "wait-signal") {
      struct sigaction sa {};
      sa.sa_handler = on_signal;
      ::sigaction(SIGUSR1, &sa, nullptr);
      ::sigaction(SIGTERM, &sa, nullptr);
      // Blocked until sigsuspend unblocks them and waits in one step: a signal that came between
      // a check of g_signal and pause() would be handled, then waited for in vain.
      sigset_t both, before;
      ::sigemptyset(&both);
      ::sigaddset(&both, SIGUSR1);
      ::sigaddset(&both, SIGTERM);
      ::sigprocmask(SIG_BLOCK, &both, &before);
      std::cout << "ready" << std::endl;
      while (g_signal == 0) ::sigsuspend(&before);
      std::cout << "got " << (g_signal == SIGUSR1 ? "SIGUSR1" : "SIGTERM") << std::endl;
      return 0;
    } else if (cmd == "store-barrier") {
      ddprun::rdzv::client::ClientOptions o;
      o.host = env("MASTER_ADDR");
      o.port = static_cast<uint16_t>(std::stoi(env("MASTER_PORT")));
      o.timeout = std::chrono::seconds(60);
      ddprun::rdzv::client::Client c(o);
      const int world = std::stoi(env("WORLD_SIZE"));
      if (c.add("barrier", 1) == world) c.set("barrier/done", "1");
      c.wait({"barrier/done"});
    } else if (cmd == "print") {
      const int n = std::stoi(arg());
      for (int k = 0; k < n; ++k) {
        std::cout << "out line " << k << "\n";
        std::cerr << "err line " << k << "\n";
      }
      std::cout.flush();
    } else if (cmd == "busy-if-rank") {
      // Rank R computes (spins on a core) for SECONDS; the others sleep as long, using no CPU.
      const std::string r = arg();
      const auto span = std::chrono::milliseconds(static_cast<int>(std::stod(arg()) * 1000));
      if (r == rank) {
        const auto until = std::chrono::steady_clock::now() + span;
        volatile uint64_t x = 0;
        while (std::chrono::steady_clock::now() < until) {
          for (int k = 0; k < 100000; ++k) x = x + static_cast<uint64_t>(k);
        }
      } else {
        std::this_thread::sleep_for(span);
      }
    } else if (cmd == "sleep") {
      std::this_thread::sleep_for(std::chrono::milliseconds(static_cast<int>(std::stod(arg()) * 1000)));
    } else if (cmd == "fds") {
      std::string listing;  // taken before the output file is opened
      for (const auto& e : std::filesystem::directory_iterator("/proc/self/fd")) {
        std::error_code ec;
        const auto target = std::filesystem::read_symlink(e.path(), ec);
        if (target.string().find("/proc/") != std::string::npos && target.string().find("/fd") != std::string::npos) {
          continue;  // the directory being listed
        }
        listing += e.path().filename().string() + " " + target.string() + "\n";
      }
      std::ofstream(arg() + "/fds." + rank) << listing;
    } else if (cmd == "flood") {
      const long mb = std::stol(arg());
      const std::string line(99, 'x');
      for (long n = 0; n < mb * 10000; ++n) std::cout << line << '\n';
      std::cout.flush();
    } else if (cmd == "membership") {
      const char* file = std::getenv("DDPRUN_PROGRESS_FILE");
      const int fd = file ? ::open(file, O_RDONLY | O_CLOEXEC) : -1;
      void* map = fd >= 0 ? ::mmap(nullptr, 4096, PROT_READ, MAP_SHARED, fd, 0) : MAP_FAILED;
      if (fd >= 0) ::close(fd);
      if (map == MAP_FAILED) {
        std::cout << "membership_ms=no-page" << std::endl;
      } else {
        uint64_t until = 0;
        std::memcpy(&until, static_cast<const char*>(map) + 72, sizeof until);  // progress_page.hpp's offset
        timespec ts{};
        ::clock_gettime(CLOCK_MONOTONIC, &ts);
        const int64_t now = static_cast<int64_t>(ts.tv_sec) * 1'000'000'000LL + ts.tv_nsec;
        if (until == 0) {
          std::cout << "membership_ms=none" << std::endl;
        } else {
          std::cout << "membership_ms=" << (static_cast<int64_t>(until) - now) / 1'000'000 << std::endl;
        }
      }
    } else if (cmd == "exclude-node") {
      const std::string reason = arg();
      std::ofstream(env("DDPRUN_EXCLUDE_NODE_FILE")) << reason << "\n";
    } else if (cmd == "iterations") {
      const uint64_t base = std::stoull(arg()), step = std::stoull(arg());
      const uint64_t n = base + step * std::stoull(env("TORCHELASTIC_RESTART_COUNT", "0"));
      const char* file = std::getenv("DDPRUN_PROGRESS_FILE");
      const int fd = file ? ::open(file, O_RDWR | O_CLOEXEC) : -1;
      void* map = fd >= 0 ? ::mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0) : MAP_FAILED;
      if (fd >= 0) ::close(fd);
      if (map == MAP_FAILED) {
        std::cerr << "iterations: no progress page\n";
        return 3;
      }
      std::memcpy(static_cast<char*>(map) + 80, &n, sizeof n);  // progress_page.hpp's offset
    } else if (cmd == "ignore-term") {
      ::signal(SIGTERM, SIG_IGN);
    } else if (cmd == "wait-file") {
      const std::string path = arg();
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
      while (!std::filesystem::exists(path)) {
        if (std::chrono::steady_clock::now() > deadline) {
          std::cerr << "test_worker: " << path << " did not appear within 60 s\n";
          return 101;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(10));  // sleep override: polling for the file
      }
    } else if (cmd == "ready-file") {
      // Written under another name and renamed: whoever sees the file sees the pid in it.
      const std::string path = arg();
      std::ofstream(path + ".tmp") << ::getpid() << "\n";
      std::rename((path + ".tmp").c_str(), path.c_str());
    } else {
      std::cerr << "test_worker: unknown command " << cmd << "\n";
      return 100;
    }
  }
  return 0;
}
