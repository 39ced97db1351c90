// The store's ping under a flood of /metrics, two ddprun-rendezvous builds side by side in one run
// (the one before job_states.hpp, which copied the whole store on its thread for each scrape, and
// the one after): each daemon holds one job's keys (--mb of 4 KiB values), a client pings it
// alone, then while --flooders clients, each from an address of its own (127.0.0.10 up), fetch
// /metrics in a loop; the pings done, their mean (the window over their number), median, p99 and
// maximum, the scrapes answered (200) and refused (429) per second, and the ratios of the first
// build's figures to the second's.
//
//   metrics_flood_bench OLD_DAEMON NEW_DAEMON [--mb 240] [--seconds 5] [--flooders 8] [--rounds 2]
//
// The daemons run one at a time (OLD, NEW, then NEW, OLD: ABBA over the rounds) on this machine.
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <map>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "benchmarks/bench_util.hpp"
#include "rendezvous/client/client.hpp"
#include "tests/support/raw_socket.hpp"

namespace {

using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

// A daemon in a process of its own: the ports from its first two lines ("listening on ...",
// "metrics on ...").
struct DaemonProcess {
  pid_t pid = -1;
  uint16_t port = 0, metrics_port = 0;
  explicit DaemonProcess(const std::string& bin) {
    int out[2];
    if (::pipe2(out, O_CLOEXEC) != 0) throw std::runtime_error("pipe");
    pid = ::fork();
    if (pid == 0) {
      ::dup2(out[1], STDOUT_FILENO);
      ::dup2(::open("/dev/null", O_WRONLY), STDERR_FILENO);
      ::execl(bin.c_str(), bin.c_str(), "--port", "0", "--metrics-port", "0", static_cast<char*>(nullptr));
      ::_exit(127);
    }
    ::close(out[1]);
    auto last_number = [](const std::string& line) {
      const size_t at = line.find_last_not_of("0123456789");
      if (at == std::string::npos || at + 1 >= line.size()) throw std::runtime_error("no port in: " + line);
      return static_cast<uint16_t>(std::stoi(line.substr(at + 1)));
    };
    for (int n = 0; n < 2; ++n) {
      std::string line;
      char c;
      while (::read(out[0], &c, 1) == 1 && c != '\n') line.push_back(c);
      (n == 0 ? port : metrics_port) = last_number(line);
    }
    ::close(out[0]);
  }
  ~DaemonProcess() {
    ::kill(pid, SIGTERM);
    int status;
    ::waitpid(pid, &status, 0);
  }
};

struct Figures {
  double mean_ms = 0, p50_ms = 0, p99_ms = 0, max_ms = 0;
  size_t pings = 0;
  double answered_per_s = 0, refused_per_s = 0;
};

Figures ping_for(ddprun::rdzv::client::Client& c, std::chrono::seconds how_long) {
  std::vector<double> ms;
  const auto end = Clock::now() + how_long;
  while (Clock::now() < end) {
    const auto t0 = Clock::now();
    c.ping();
    ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
  }
  std::sort(ms.begin(), ms.end());
  Figures f;
  f.pings = ms.size();
  f.mean_ms = std::chrono::duration<double, std::milli>(how_long).count() / static_cast<double>(ms.size());
  f.p50_ms = ms[ms.size() / 2];
  f.p99_ms = ms[std::min(ms.size() - 1, ms.size() * 99 / 100)];
  f.max_ms = ms.back();
  return f;
}

struct Run {
  Figures idle, flood;
};

Run measure(const std::string& bin, size_t mb, std::chrono::seconds how_long, int flooders) {
  DaemonProcess d(bin);
  ddprun::rdzv::client::ClientOptions o;
  o.port = d.port;
  ddprun::rdzv::client::Client c(o);
  // One job's keys: a running round, and its bulk.
  c.set("/ddprun/big/gen", "1");
  c.set("/ddprun/big/g1/r0/node/0", R"({"host":"h","nproc":8,"nnodes":1,"agent":"a"})");
  c.set("/ddprun/big/g1/r0/complete", "1");
  const std::string value(4096, 'v');
  const size_t keys = mb * 1000 * 1000 / value.size();
  std::vector<std::pair<std::string, std::string>> batch;
  for (size_t i = 0; i < keys; ++i) {
    batch.emplace_back("/ddprun/big/g1/data/" + std::to_string(i), value);
    if (batch.size() == 256 || i + 1 == keys) {
      c.multi_set(batch);
      batch.clear();
    }
  }
  Run r;
  r.idle = ping_for(c, how_long);
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> answered{0}, refused{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < flooders; ++i) {
    threads.emplace_back([&, i] {
      const std::string source = "127.0.0." + std::to_string(10 + i);
      while (!stop.load()) {
        try {
          ddprun::test::RawSocket s(d.metrics_port, "127.0.0.1", source.c_str());
          s.send("GET /metrics HTTP/1.1\r\nHost: localhost\r\n\r\n");
          std::string answer;
          s.read_until_eof(&answer, 30s);
          if (answer.rfind("HTTP/1.1 200", 0) == 0) ++answered;
          if (answer.rfind("HTTP/1.1 429", 0) == 0) ++refused;
        } catch (const std::exception&) {
          // refused at connect (the daemon making room): try again
        }
      }
    });
  }
  const auto t0 = Clock::now();
  r.flood = ping_for(c, how_long);
  const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  stop = true;
  for (auto& t : threads) t.join();
  r.flood.answered_per_s = static_cast<double>(answered.load()) / seconds;
  r.flood.refused_per_s = static_cast<double>(refused.load()) / seconds;
  return r;
}

void print(const char* name, const std::string& regime, const Figures& f) {
  std::printf("| %s | %s | %zu | %.3f | %.3f | %.3f | %.3f | %.0f | %.0f |\n", name, regime.c_str(), f.pings, f.mean_ms,
              f.p50_ms, f.p99_ms, f.max_ms, f.answered_per_s, f.refused_per_s);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::cerr << "usage: metrics_flood_bench OLD_DAEMON NEW_DAEMON [--mb 240] [--seconds 5] [--flooders 8] "
                 "[--rounds 2]\n";
    return 2;
  }
  const std::string old_bin = argv[1], new_bin = argv[2];
  std::map<std::string, std::string> flags = {
      {"--mb", "240"}, {"--seconds", "5"}, {"--flooders", "8"}, {"--rounds", "2"}};
  for (int i = 3; i + 1 < argc; i += 2) flags[argv[i]] = argv[i + 1];
  const size_t mb = std::stoul(flags["--mb"]);
  const std::chrono::seconds how_long(std::stoi(flags["--seconds"]));
  const int flooders = std::stoi(flags["--flooders"]), rounds = std::stoi(flags["--rounds"]);
  std::printf("%zu MB of one job's keys (4 KiB values), %d flooders, %lld s per regime, %d round(s)\n\n", mb, flooders,
              static_cast<long long>(how_long.count()), rounds);
  std::printf("| daemon | regime | pings | mean ms | p50 ms | p99 ms | max ms | scrapes 200/s | 429/s |\n");
  std::printf("|---|---|---:|---:|---:|---:|---:|---:|---:|\n");
  std::vector<Run> olds, news;
  for (int round = 0; round < rounds; ++round) {
    for (int k = 0; k < 2; ++k) {
      const bool old_first = round % 2 == 0;
      const bool is_old = (k == 0) == old_first;
      const Run r = measure(is_old ? old_bin : new_bin, mb, how_long, flooders);
      print(is_old ? "before" : "after", "alone", r.idle);
      print(is_old ? "before" : "after", "/metrics flood", r.flood);
      (is_old ? olds : news).push_back(r);
    }
  }
  auto med = [](const std::vector<Run>& runs, double Figures::*field) {
    std::vector<double> v;
    for (const Run& r : runs) v.push_back(r.flood.*field);
    return ddprun::bench::median(v);
  };
  std::printf("\nunder the flood, before / after (medians over rounds): mean %.0fx, p99 %.0fx, max %.1fx\n",
              med(olds, &Figures::mean_ms) / med(news, &Figures::mean_ms),
              med(olds, &Figures::p99_ms) / med(news, &Figures::p99_ms),
              med(olds, &Figures::max_ms) / med(news, &Figures::max_ms));
  return 0;
}
