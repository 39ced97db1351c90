// Store scale benchmark: N simulated ranks, one connection each, driven by one epoll loop (not a
// thread per rank), against ddprun-rendezvous and against LibTorch 1.13's own TCPStore server, in
// one run. Each rank connects, ADDs a counter; the rank that brings it to N SETs a key; every rank
// WAITs on that key, then GETs it. This is the shape of a job's start (PyTorch's store-based
// barrier and rendezvous) at N ranks. Both servers are spoken to in the wire dialect of the LibTorch
// that store_bench was built against (`store_bench dialect`: 1.13's, or 2.x's with VALIDATE first),
// the only one its server speaks; ddprun's speaks both.
//
//   store_scale_bench --daemon PATH/ddprun-rendezvous --libtorch-server PATH/store_bench
//                     [--ranks 1024,4096,16384] [--timeout SECONDS] [--dialect legacy|v2]
//                     [--sources N] [--load idle,busy] [--runs R]
//
// --sources: loopback source addresses (default 64; 1 = 127.0.0.1 only). --load busy runs one
// spinning process per core beside each run (the rank-0 node, whose workers use every core while
// its launcher hosts the store). --runs: pairs of runs per size and load, interleaved.
//   store_scale_bench --connect PORT [--ranks N]     (drive a server that is already running, e.g.
//                                                     under a profiler)
//
// Reports wall time, time per rank, the server's peak RSS (VmHWM) and its CPU time. Each server runs
// in its own process (LibTorch's through `store_bench serve torch`); a run that does not finish
// within the timeout is reported as such.
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <arpa/inet.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "bench_util.hpp"
#include "server_process.hpp"
#include "common/system.hpp"
#include "rendezvous/core/protocol.hpp"

namespace {

using Clock = std::chrono::steady_clock;
using ddprun::bench::ServerProcess;
using ddprun::rdzv::core::put_bytes;
using ddprun::rdzv::core::put_i64;
using ddprun::rdzv::core::put_u64;
using ddprun::rdzv::core::put_u8;

std::vector<std::string> split_words(const std::string& list) {
  std::vector<std::string> out;
  std::stringstream in(list);
  for (std::string w; std::getline(in, w, ',');) {
    if (!w.empty()) out.push_back(w);
  }
  return out;
}

// `count` processes spinning on a CPU each for as long as this object lives.
struct Spinners {
  std::vector<pid_t> pids;
  explicit Spinners(int count) {
    for (int i = 0; i < count; ++i) {
      const pid_t pid = ::fork();
      if (pid == 0) {
        volatile uint64_t x = 0;
        for (;;) x = x + 1;
      }
      if (pid > 0) pids.push_back(pid);
    }
  }
  ~Spinners() {
    for (pid_t p : pids) ::kill(p, SIGKILL);
    for (pid_t p : pids) ::waitpid(p, nullptr, 0);
  }
  Spinners(const Spinners&) = delete;
  Spinners& operator=(const Spinners&) = delete;
};

// One simulated rank's connection.
struct Rank {
  enum class State { Idle, Connecting, Ping, Add, Wait, GetLength, GetValue, Done } state = State::Idle;
  int fd = -1;
  char buf[16];
  size_t need = 0, got = 0;
  uint64_t value_left = 0;
};

struct RunResult {
  double seconds = 0;
  int finished = 0;
  bool timed_out = false;
  std::string error;
};

ddprun::rdzv::core::Dialect g_dialect = ddprun::rdzv::core::Dialect::V2;

void put_op(std::string& r, ddprun::rdzv::core::Op op) { put_u8(r, *ddprun::rdzv::core::op_to_wire(g_dialect, op)); }

// A 2.x client's first bytes, as PyTorch 2.5+'s sends them: VALIDATE, then PING (it waits for the
// echo before its first request).
std::string hello_request() {
  std::string r;
  put_op(r, ddprun::rdzv::core::Op::Validate);
  ddprun::rdzv::core::put_u32(r, ddprun::rdzv::core::kValidateMagic);
  put_op(r, ddprun::rdzv::core::Op::Ping);
  ddprun::rdzv::core::put_u32(r, 4242);
  return r;
}

std::string add_request(int64_t delta) {
  std::string r;
  put_op(r, ddprun::rdzv::core::Op::Add);
  put_bytes(r, "scale/counter");
  put_i64(r, delta);
  return r;
}

// Loopback source addresses the ranks connect from (127.0.0.2 onwards; 1 means 127.0.0.1 only).
int g_sources = 64;

RunResult drive(uint16_t port, int n, std::chrono::seconds timeout) {
  RunResult res;
  const int ep = ::epoll_create1(EPOLL_CLOEXEC);
  std::vector<Rank> ranks(static_cast<size_t>(n));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  const std::string add = add_request(1);
  const std::string hello = hello_request();
  std::string set_req, wait_req, get_req;
  put_op(set_req, ddprun::rdzv::core::Op::Set);
  put_bytes(set_req, "scale/go");
  put_bytes(set_req, "go");
  put_op(wait_req, ddprun::rdzv::core::Op::Wait);
  put_u64(wait_req, 1);
  put_bytes(wait_req, "scale/go");
  put_op(get_req, ddprun::rdzv::core::Op::Get);
  put_bytes(get_req, "scale/go");

  auto send_all = [](Rank& r, const std::string& bytes) {
    // Requests are a few dozen bytes: a fresh socket's buffer always takes them whole.
    return ::send(r.fd, bytes.data(), bytes.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(bytes.size());
  };
  auto expect = [](Rank& r, Rank::State st, size_t bytes) {
    r.state = st;
    r.need = bytes;
    r.got = 0;
  };
  int next = 0, connecting = 0, done = 0;
  constexpr int kMaxConnecting = 512;  // below the listen backlog: no SYN drops and retransmits
  auto start_connects = [&] {
    while (connecting < kMaxConnecting && next < n) {
      Rank& r = ranks[static_cast<size_t>(next)];
      r.fd = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
      const int one = 1;
      ::setsockopt(r.fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
      // Real ranks come from many hosts. From one source address the kernel's search for a free
      // ephemeral port grows with every connection to the same server (O(n^2) in total), which
      // would measure the load generator; 64 loopback sources play 64 hosts. (A server that looks
      // up each peer's name, as LibTorch 2.x's does, then waits on the resolver for addresses
      // that are not in /etc/hosts: `--sources 1` keeps to 127.0.0.1.)
      sockaddr_in src{};
      src.sin_family = AF_INET;
      src.sin_addr.s_addr =
          htonl(g_sources <= 1 ? INADDR_LOOPBACK : INADDR_LOOPBACK + 2 + static_cast<uint32_t>(next % g_sources));
      ::setsockopt(r.fd, IPPROTO_IP, IP_BIND_ADDRESS_NO_PORT, &one, sizeof one);
      ::bind(r.fd, reinterpret_cast<sockaddr*>(&src), sizeof src);
      if (::connect(r.fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 && errno != EINPROGRESS) {
        res.error = std::string("connect: ") + std::strerror(errno);
        return false;
      }
      epoll_event ev{};
      ev.events = EPOLLOUT | EPOLLIN;
      ev.data.u32 = static_cast<uint32_t>(next);
      ::epoll_ctl(ep, EPOLL_CTL_ADD, r.fd, &ev);
      r.state = Rank::State::Connecting;
      ++connecting;
      ++next;
    }
    return true;
  };
  const auto t0 = Clock::now();
  const auto deadline = t0 + timeout;
  if (!start_connects()) return res;
  std::vector<epoll_event> events(4096);
  while (done < n && res.error.empty()) {
    if (Clock::now() > deadline) {
      res.timed_out = true;
      break;
    }
    const int k = ::epoll_wait(ep, events.data(), static_cast<int>(events.size()), 100);
    for (int i = 0; i < k && res.error.empty(); ++i) {
      Rank& r = ranks[events[i].data.u32];
      if (r.state == Rank::State::Connecting) {
        int err = 0;
        socklen_t len = sizeof err;
        ::getsockopt(r.fd, SOL_SOCKET, SO_ERROR, &err, &len);
        if (err != 0) {
          res.error = std::string("connect: ") + std::strerror(err);
          break;
        }
        epoll_event ev{};
        ev.events = EPOLLIN;
        ev.data.u32 = events[i].data.u32;
        ::epoll_ctl(ep, EPOLL_CTL_MOD, r.fd, &ev);
        --connecting;
        if (g_dialect == ddprun::rdzv::core::Dialect::V2) {
          if (!send_all(r, hello)) res.error = "send VALIDATE+PING failed";
          expect(r, Rank::State::Ping, 4);
        } else {
          if (!send_all(r, add)) res.error = "send ADD failed";
          expect(r, Rank::State::Add, 8);
        }
        continue;
      }
      // Read what this rank's current reply needs.
      for (;;) {
        char tmp[4096];
        const size_t want =
            r.state == Rank::State::GetValue ? std::min<uint64_t>(r.value_left, sizeof tmp) : r.need - r.got;
        if (want == 0) break;
        const ssize_t got = ::recv(r.fd, r.state == Rank::State::GetValue ? tmp : r.buf + r.got, want, 0);
        if (got < 0 && (errno == EAGAIN || errno == EINTR)) break;
        if (got <= 0) {
          res.error = "the server closed a connection";
          break;
        }
        if (r.state == Rank::State::GetValue) {
          r.value_left -= static_cast<uint64_t>(got);
        } else {
          r.got += static_cast<size_t>(got);
          if (r.got < r.need) continue;
        }
        switch (r.state) {
          case Rank::State::Ping:
            if (!send_all(r, add)) res.error = "send ADD failed";
            expect(r, Rank::State::Add, 8);
            break;
          case Rank::State::Add: {
            const int64_t v = static_cast<int64_t>(ddprun::rdzv::core::load_u64(r.buf));
            if (v == n && !send_all(r, set_req)) res.error = "send SET failed";
            if (!send_all(r, wait_req)) res.error = "send WAIT failed";
            expect(r, Rank::State::Wait, 1);
            break;
          }
          case Rank::State::Wait:
            if (!send_all(r, get_req)) res.error = "send GET failed";
            expect(r, Rank::State::GetLength, 8);
            break;
          case Rank::State::GetLength:
            r.value_left = ddprun::rdzv::core::load_u64(r.buf);
            r.state = Rank::State::GetValue;
            break;
          case Rank::State::GetValue: break;
          case Rank::State::Idle:
          case Rank::State::Connecting:
          case Rank::State::Done: break;
        }
        if (r.state == Rank::State::GetValue && r.value_left == 0) {
          r.state = Rank::State::Done;
          ++done;
          break;
        }
      }
    }
    if (!start_connects()) break;
  }
  res.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  res.finished = done;
  // Reset rather than close politely: no TIME_WAIT sockets left to crowd the next run's ports.
  const linger reset{1, 0};
  for (Rank& r : ranks) {
    if (r.fd < 0) continue;
    ::setsockopt(r.fd, SOL_SOCKET, SO_LINGER, &reset, sizeof reset);
    ::close(r.fd);
  }
  ::close(ep);
  return res;
}

}  // namespace

int main(int argc, char** argv) {
  std::string daemon, libtorch;
  std::vector<int> ranks{1024, 4096, 16384};
  std::chrono::seconds timeout{120};
  int connect_port = 0;
  std::string dialect_flag;
  std::vector<std::string> loads{"idle"};
  int runs = 1;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--connect") connect_port = std::stoi(argv[i + 1]);
    if (flag == "--daemon") daemon = argv[i + 1];
    else if (flag == "--libtorch-server") libtorch = argv[i + 1];
    else if (flag == "--ranks") ranks = ddprun::bench::parse_list(argv[i + 1]);
    else if (flag == "--timeout") timeout = std::chrono::seconds(std::stoi(argv[i + 1]));
    else if (flag == "--dialect") dialect_flag = argv[i + 1];
    else if (flag == "--sources") g_sources = std::max(1, std::stoi(argv[i + 1]));
    else if (flag == "--load") loads = split_words(argv[i + 1]);
    else if (flag == "--runs") runs = std::max(1, std::stoi(argv[i + 1]));
  }
  for (const auto& l : loads) {
    if (l != "idle" && l != "busy") {
      std::cerr << "store_scale_bench: --load takes idle, busy or both (idle,busy), got '" << l << "'\n";
      return 2;
    }
  }
  if (dialect_flag.empty() && !libtorch.empty()) {
    // The dialect LibTorch's server speaks, from the store_bench built against it.
    FILE* p = ::popen(("'" + libtorch + "' dialect").c_str(), "r");
    char buf[32] = {};
    if (p && std::fgets(buf, sizeof buf, p)) dialect_flag = std::string(buf, std::strcspn(buf, "\n"));
    if (p) ::pclose(p);
  }
  if (dialect_flag == "legacy") {
    g_dialect = ddprun::rdzv::core::Dialect::Legacy;
  } else if (!dialect_flag.empty() && dialect_flag != "v2") {
    std::cerr << "store_scale_bench: --dialect must be legacy (PyTorch 1.x) or v2 (2.x), got '" << dialect_flag
              << "'\n";
    return 2;
  }
  if (connect_port > 0) {
    ddprun::raise_open_file_limit();
    ::signal(SIGPIPE, SIG_IGN);
    for (int n : ranks) {
      const RunResult r = drive(static_cast<uint16_t>(connect_port), n, timeout);
      std::printf("%d ranks: %d finished in %.3f s (%.1f us per rank)%s\n", n, r.finished, r.seconds,
                  r.seconds * 1e6 / n, r.error.empty() ? "" : (" error: " + r.error).c_str());
    }
    return 0;
  }
  if (daemon.empty()) {
    std::cerr << "usage: store_scale_bench --daemon PATH [--libtorch-server PATH/store_bench] [--ranks 1024,4096,16384]"
                 " [--timeout SECONDS]\n";
    return 2;
  }
  ddprun::raise_open_file_limit();
  ::signal(SIGPIPE, SIG_IGN);
  std::printf(
      "Store scale: N ranks, one connection each (one epoll loop): connect, ADD, last rank SETs, all WAIT, GET;"
      " %s dialect; %d source address%s\n",
      g_dialect == ddprun::rdzv::core::Dialect::V2 ? "2.x (VALIDATE first)" : "1.13", g_sources,
      g_sources == 1 ? "" : "es");
  std::printf(
      "| ranks | load | server | finished | seconds | us per rank | server peak RSS MiB | server RSS growth MiB |"
      " server CPU s |\n");
  std::printf("|---:|---|---|---:|---:|---:|---:|---:|---:|\n");
  struct Row {
    RunResult r;
    double peak_mib = 0, growth_mib = 0, cpu = 0;
  };
  for (int n : ranks) {
    for (const auto& load : loads) {
      std::vector<double> ours, theirs;
      for (int run = 0; run < runs; ++run) {
        std::vector<Row> rows;
        for (int k = 0; k < 2; ++k) {
          if (k == 1 && libtorch.empty()) continue;
          std::vector<std::string> server_argv =
              k == 0 ? std::vector<std::string>{daemon, "--host", "127.0.0.1", "--port", "0"}
                     : std::vector<std::string>{libtorch, "serve", "torch"};
          const char* name = k == 0 ? "ddprun-rendezvous" : "LibTorch TCPStore";
          ServerProcess server(server_argv);
          Spinners spin(load == "busy" ? static_cast<int>(::sysconf(_SC_NPROCESSORS_ONLN)) : 0);
          Row row;
          const auto cpu0 = ddprun::process_cpu_time(server.pid);
          row.r = drive(server.port, n, timeout);
          row.cpu = static_cast<double>((ddprun::process_cpu_time(server.pid) - cpu0).count()) / 1e6;
          row.peak_mib = static_cast<double>(ddprun::peak_rss_kib(server.pid)) / 1024.0;
          row.growth_mib = row.peak_mib - static_cast<double>(server.idle_rss_kib) / 1024.0;
          const char* note = row.r.timed_out ? " (timed out)" : row.r.error.empty() ? "" : " (error)";
          std::printf("| %d | %s | %s | %d/%d%s | %.2f | %.1f | %.1f | %.1f | %.2f |\n", n, load.c_str(), name,
                      row.r.finished, n, note, row.r.seconds, row.r.seconds * 1e6 / n, row.peak_mib, row.growth_mib,
                      row.cpu);
          if (!row.r.error.empty()) std::fprintf(stderr, "  %s: %s\n", name, row.r.error.c_str());
          std::fflush(stdout);
          rows.push_back(row);
        }
        if (rows.size() == 2 && rows[0].r.finished == n && rows[1].r.finished == n) {
          ours.push_back(rows[0].r.seconds);
          theirs.push_back(rows[1].r.seconds);
          std::printf(
              "| %d | %s | ratio LibTorch/ddprun (time; >1: ddprun faster) | | %.2fx | | %.2fx (memory) | | %.2fx "
              "(CPU) |\n",
              n, load.c_str(), rows[1].r.seconds / rows[0].r.seconds, rows[1].peak_mib / rows[0].peak_mib,
              rows[1].cpu / std::max(rows[0].cpu, 1e-3));
        }
      }
      if (ours.size() > 1) {
        std::printf("| %d | %s | median of %zu pairs: ddprun %.3f s, LibTorch %.3f s | | %.2fx | | | | |\n", n,
                    load.c_str(), ours.size(), ddprun::bench::median(ours), ddprun::bench::median(theirs),
                    ddprun::bench::median(theirs) / ddprun::bench::median(ours));
      }
    }
  }
  return 0;
}
