// Store benchmark: the same real client (LibTorch 1.13's c10d::TCPStore) against ddprun's server and
// against LibTorch's own TCPStore server (isServer=true), in one run. Each server runs in its own
// process so its CPU time can be read from /proc.
//
//   store_bench [--seconds S] [--clients 1,16,64,256] [--barrier N]
//
// Per client count: throughput of a set/get/add/wait mix, p50/p99 latency per call, and the
// server's CPU time per call. Then N clients connect and pass an add+wait barrier.
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <torch/version.h>

#include "ddprun/worker/tcp_store.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <latch>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "bench_util.hpp"
#include "server_process.hpp"
#include "common/system.hpp"
#include "rendezvous/server/server.hpp"

namespace {

using ddprun::bench::ServerProcess;
using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

// ---- server side (child process) -------------------------------------------------------------

int serve(const std::string& impl) {
  ddprun::raise_open_file_limit();
  std::unique_ptr<ddprun::rdzv::server::ServerThread> ours;
  c10::intrusive_ptr<c10d::TCPStore> theirs;
  uint16_t port = 0;
  if (impl == "ours") {
    ours = std::make_unique<ddprun::rdzv::server::ServerThread>(ddprun::rdzv::server::ServerOptions{});
    port = ours->port();
  } else {
    theirs = ddprun::worker::make_tcp_store_server("127.0.0.1", 0, 600s);
    port = theirs->getPort();
  }
  std::cout << port << std::endl;
  char c;
  while (::read(STDIN_FILENO, &c, 1) > 0) {
  }  // serve until the parent closes our stdin
  return 0;
}

// ---- client side --------------------------------------------------------------------------------

c10::intrusive_ptr<c10d::TCPStore> connect(uint16_t port) {
  return c10::make_intrusive<c10d::TCPStore>("127.0.0.1", ddprun::worker::tcp_store_client_options(port, 300s));
}

struct LoadResult {
  double ops_per_sec = 0;
  double p50_us = 0, p99_us = 0;
  double server_cpu_us_per_op = 0;
};

LoadResult run_load(uint16_t port, int clients, std::chrono::milliseconds duration, pid_t server_pid) {
  std::vector<c10::intrusive_ptr<c10d::TCPStore>> stores;
  for (int i = 0; i < clients; ++i) stores.push_back(connect(port));
  std::atomic<bool> stop{false};
  std::latch ready(clients + 1);
  std::vector<std::vector<float>> lat(clients);
  std::vector<std::thread> threads;
  for (int i = 0; i < clients; ++i) {
    threads.emplace_back([&, i] {
      auto& store = *stores[i];
      auto& l = lat[i];
      l.reserve(1 << 18);
      const std::string key = "bench/key/" + std::to_string(i);
      const std::string counter = "bench/counter/" + std::to_string(i % 8);
      const std::vector<uint8_t> value(64, 'v');
      ready.arrive_and_wait();
      auto timed = [&](auto&& op) {
        const auto t0 = Clock::now();
        op();
        l.push_back(std::chrono::duration<float, std::micro>(Clock::now() - t0).count());
      };
      while (!stop.load(std::memory_order_relaxed)) {
        timed([&] { store.set(key, value); });
        timed([&] { store.get(key); });
        timed([&] { store.add(counter, 1); });
        timed([&] { store.wait({key}); });
      }
    });
  }
  ready.arrive_and_wait();
  const auto cpu0 = ddprun::process_cpu_time(server_pid);
  const auto t0 = Clock::now();
  std::this_thread::sleep_for(duration);  // sleep override: the measurement window
  stop = true;
  for (auto& t : threads) t.join();
  const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
  const auto cpu = ddprun::process_cpu_time(server_pid) - cpu0;
  std::vector<float> all;
  for (auto& l : lat) all.insert(all.end(), l.begin(), l.end());
  LoadResult r;
  r.ops_per_sec = static_cast<double>(all.size()) / secs;
  std::sort(all.begin(), all.end());
  r.p50_us = all[all.size() / 2];
  r.p99_us = all[std::min(all.size() - 1, all.size() * 99 / 100)];
  r.server_cpu_us_per_op = static_cast<double>(cpu.count()) / static_cast<double>(all.size());
  return r;
}

struct BarrierResult {
  double seconds = 0;
  double server_cpu_ms = 0;
};

BarrierResult run_barrier(uint16_t port, int clients, pid_t server_pid) {
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  const auto cpu0 = ddprun::process_cpu_time(server_pid);
  const auto t0 = Clock::now();
  for (int i = 0; i < clients; ++i) {
    threads.emplace_back([&] {
      try {
        auto store = connect(port);
        if (store->add("barrier/arrived", 1) == clients) store->set("barrier/go", {'1'});
        store->wait({"barrier/go"});
      } catch (const std::exception& e) {
        if (failures++ == 0) std::cerr << "barrier client failed: " << e.what() << "\n";
      }
    });
  }
  for (auto& t : threads) t.join();
  BarrierResult r;
  r.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  r.server_cpu_ms = static_cast<double>((ddprun::process_cpu_time(server_pid) - cpu0).count()) / 1000.0;
  if (failures) std::cerr << failures << " barrier clients failed\n";
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc >= 3 && std::string(argv[1]) == "serve") return serve(argv[2]);
  // The wire dialect of this LibTorch's server, for store_scale_bench: "legacy" (1.x) or "v2".
  if (argc == 2 && std::string(argv[1]) == "dialect") {
    std::printf("%s\n", TORCH_VERSION_MAJOR >= 2 ? "v2" : "legacy");
    return 0;
  }
  ddprun::raise_open_file_limit();
  ::signal(SIGPIPE, SIG_IGN);
  std::chrono::milliseconds duration = 2s;
  std::vector<int> client_counts{1, 16, 64, 256};
  int barrier_clients = 1024;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--seconds") duration = std::chrono::milliseconds(static_cast<int>(std::stod(argv[i + 1]) * 1000));
    else if (flag == "--clients") client_counts = ddprun::bench::parse_list(argv[i + 1]);
    else if (flag == "--barrier") barrier_clients = std::stoi(argv[i + 1]);
    else {
      std::cerr << "usage: store_bench [--seconds S] [--clients 1,16,64,256] [--barrier N]\n";
      return 2;
    }
  }
  std::printf("Store benchmark: LibTorch %s c10d::TCPStore clients; set/get/add/wait mix; %.1fs per point\n",
              TORCH_VERSION, static_cast<double>(duration.count()) / 1000.0);
  std::printf("| clients | server | ops/s | p50 us | p99 us | server CPU us/op |\n");
  std::printf("|---:|---|---:|---:|---:|---:|\n");
  for (int n : client_counts) {
    LoadResult res[2];
    const char* names[2] = {"torch", "ours"};
    for (int k = 0; k < 2; ++k) {
      ServerProcess server({"/proc/self/exe", "serve", names[k]}, /*quiet=*/false);  // this program, as `serve IMPL`
      res[k] = run_load(server.port, n, duration, server.pid);
      std::printf("| %d | %s | %.0f | %.1f | %.1f | %.2f |\n", n, k == 0 ? "LibTorch TCPStore" : "ddprun",
                  res[k].ops_per_sec, res[k].p50_us, res[k].p99_us, res[k].server_cpu_us_per_op);
      std::fflush(stdout);
    }
    std::printf("| %d | ratio ddprun/LibTorch | %.2fx | %.2fx | %.2fx | %.2fx |\n", n,
                res[1].ops_per_sec / res[0].ops_per_sec, res[1].p50_us / res[0].p50_us, res[1].p99_us / res[0].p99_us,
                res[1].server_cpu_us_per_op / res[0].server_cpu_us_per_op);
  }
  if (barrier_clients > 0) {
    std::printf("\n%d clients connect + add/wait barrier:\n| server | seconds | server CPU ms |\n|---|---:|---:|\n",
                barrier_clients);
    BarrierResult b[2];
    const char* names[2] = {"torch", "ours"};
    for (int k = 0; k < 2; ++k) {
      ServerProcess server({"/proc/self/exe", "serve", names[k]}, /*quiet=*/false);  // this program, as `serve IMPL`
      b[k] = run_barrier(server.port, barrier_clients, server.pid);
      std::printf("| %s | %.3f | %.1f |\n", k == 0 ? "LibTorch TCPStore" : "ddprun", b[k].seconds, b[k].server_cpu_ms);
    }
    std::printf("| ratio ddprun/LibTorch | %.2fx | %.2fx |\n", b[1].seconds / b[0].seconds,
                b[1].server_cpu_ms / b[0].server_cpu_ms);
  }
  return 0;
}
