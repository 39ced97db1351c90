// Rendezvous benchmark: N simulated agents (threads, each with its own connection) join one
// static rendezvous round through a ddprun store (in-process, as ddprun-rendezvous would serve it).
// Reports the time from the first join to every agent holding its rank, and store requests per
// agent (connect handshake included), counted by the server. Both backends: static (each agent
// knows its node rank) and dynamic (c10d: agents join without ranks, the round closes at N).
//   rendezvous_bench [N,N,...]   (default 16,128,1024)
#include <atomic>
#include <chrono>
#include <cstdio>
#include <latch>
#include <sstream>
#include <thread>
#include <vector>

#include "common/log.hpp"
#include "common/system.hpp"
#include "launcher/store_rendezvous.hpp"

using namespace ddprun;
using Clock = std::chrono::steady_clock;

int main(int argc, char** argv) {
  raise_open_file_limit();
  log::set_level(log::Level::Warn);
  std::vector<int> counts{16, 128, 1024};
  if (argc > 1) {
    counts.clear();
    std::stringstream in(argv[1]);
    std::string item;
    while (std::getline(in, item, ',')) counts.push_back(std::stoi(item));
  }
  std::printf("| backend | agents | first join -> all ranked (s) | store requests per agent | wrong ranks |\n"
              "|---|---:|---:|---:|---:|\n");
  for (const bool dynamic : {false, true}) {
  for (const int n : counts) {
    rdzv::ServerOptions so;
    so.log_lifecycle = false;
    so.host = "::";
    rdzv::ServerThread daemon(so);
    std::atomic<int64_t> first_join_ns{INT64_MAX}, last_done_ns{0};
    std::atomic<int> wrong{0};
    std::atomic<int64_t> rank_sum{0};
    std::latch go(n + 1);
    const uint64_t before = daemon.stats().requests;
    const auto t0 = Clock::now();
    std::vector<std::thread> agents;
    for (int k = 0; k < n; ++k) {
      agents.emplace_back([&, k] {
        launcher::StoreRendezvousOptions o;
        o.run_id = std::string(dynamic ? "bench-c10d-" : "bench-static-") + std::to_string(n);
        o.dynamic = dynamic;
        o.min_nodes = n;
        o.nnodes = n;
        o.node_rank = dynamic ? -1 : k;
        o.endpoint_host = "127.0.0.1";
        o.endpoint_port = daemon.port();
        o.advertise_addr = "127.0.0.1";
        o.host = "agent" + std::to_string(k);
        o.join_timeout = std::chrono::seconds(120);
        go.arrive_and_wait();
        const auto start = std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t0).count();
        int64_t seen = first_join_ns.load();
        while (start < seen && !first_join_ns.compare_exchange_weak(seen, start)) {
        }
        launcher::StopSignal stop;
        launcher::StoreRendezvous r(o, stop);
        const auto w = std::get<launcher::World>(r.join(0, 1, [] { return uint16_t{1}; }, stop));
        // Static: rank = node rank. Dynamic: any permutation, checked by the sum below.
        if ((!dynamic && w.rank_offset != k) || w.world_size != n || w.rank_offset != w.group_rank) ++wrong;
        rank_sum += w.rank_offset;
        const auto done = std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t0).count();
        int64_t last = last_done_ns.load();
        while (done > last && !last_done_ns.compare_exchange_weak(last, done)) {
        }
      });
    }
    go.arrive_and_wait();
    for (auto& a : agents) a.join();
    const double seconds = static_cast<double>(last_done_ns - first_join_ns) / 1e9;
    const double per_agent = static_cast<double>(daemon.stats().requests - before) / n;
    if (rank_sum != int64_t{n} * (n - 1) / 2) ++wrong;  // every rank exactly once
    std::printf("| %s | %d | %.3f | %.1f | %d |\n", dynamic ? "c10d (dynamic)" : "static", n, seconds, per_agent,
                wrong.load());
    std::fflush(stdout);
  }
  }
  return 0;
}
