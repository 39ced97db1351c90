// Rendezvous through etcd v3 against rendezvous through a ddprun store, side by side in one run.
// N simulated agents (threads, each with its own connections) join one round of a job with a
// fixed --nnodes N, without node ranks (c10d and etcd: ranks are assigned). The ddprun store runs
// in-process, as ddprun-rendezvous would serve it; etcd is a real cluster of Debian's etcd-server
// (1 or 3 members, on loopback, data on the local disk: each write is fsynced by etcd's raft log).
// Reported: the time from the first agent starting to every agent holding its rank (the
// constructor, so the lease and the generation for etcd, included), the median over REPEATS, and
// the ratio etcd / ddprun store.
//   etcd_rendezvous_bench [N,N,...] [REPEATS] [MEMBERS]   (default 2,16,64, 3 and 3)
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <functional>
#include <latch>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "bench_util.hpp"
#include "common/log.hpp"
#include "common/system.hpp"
#include "launcher/rendezvous/etcd/etcd_rendezvous.hpp"
#include "launcher/rendezvous/store/store_rendezvous.hpp"
#include "tests/support/etcd_cluster.hpp"

using namespace ddprun;
using Clock = std::chrono::steady_clock;

namespace {

int64_t now_ns(Clock::time_point t0) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t0).count();
}

// One round of n agents, each made by `make(k)`; seconds from the first start to the last rank.
double run_round(int n, const std::function<std::unique_ptr<launcher::rendezvous::RendezvousBackend>(int)>& make) {
  std::atomic<int64_t> first{INT64_MAX}, last{0};
  std::atomic<int> wrong{0};
  std::atomic<int64_t> rank_sum{0};
  std::latch go(n + 1), done(n);
  const auto t0 = Clock::now();
  std::vector<std::thread> agents;
  for (int k = 0; k < n; ++k) {
    agents.emplace_back([&, k] {
      go.arrive_and_wait();
      const int64_t start = now_ns(t0);
      int64_t seen = first.load();
      while (start < seen && !first.compare_exchange_weak(seen, start)) {
      }
      StopSignal stop;
      std::unique_ptr<launcher::rendezvous::RendezvousBackend> r = make(k);
      const auto result = r->join(
          r->first_round(stop), 1,
          [] {
            return launcher::rendezvous::HostedStore{1, {}};
          },
          stop);
      if (const auto* w = std::get_if<launcher::rendezvous::World>(&result)) {
        if (w->world_size != n) ++wrong;
        rank_sum += w->rank_offset;
      } else {
        ++wrong;
      }
      const int64_t end = now_ns(t0);
      int64_t l = last.load();
      while (end > l && !last.compare_exchange_weak(l, end)) {
      }
      done.arrive_and_wait();  // nobody leaves before everyone has its rank
    });
  }
  go.arrive_and_wait();
  for (auto& a : agents) a.join();
  if (wrong != 0 || rank_sum != int64_t{n} * (n - 1) / 2) {
    std::fprintf(stderr, "etcd_rendezvous_bench: wrong ranks in a round of %d\n", n);
    std::exit(1);
  }
  return static_cast<double>(last - first) / 1e9;
}

std::string spread(const std::vector<double>& v) {
  char buf[96];
  std::snprintf(buf, sizeof buf, "%.3f (%.3f-%.3f)", ddprun::bench::median(v), *std::min_element(v.begin(), v.end()),
                *std::max_element(v.begin(), v.end()));
  return buf;
}

}  // namespace

int main(int argc, char** argv) {
  raise_open_file_limit();
  log::set_level(log::Level::Warn);
  std::vector<int> counts{2, 16, 64};
  int repeats = 3, members = 3;
  if (argc > 1) {
    counts = ddprun::bench::parse_list(argv[1]);
  }
  if (argc > 2) repeats = std::max(1, std::stoi(argv[2]));
  if (argc > 3) members = std::max(1, std::stoi(argv[3]));
  if (!test::have_etcd()) {
    std::fprintf(stderr, "etcd_rendezvous_bench: needs /usr/bin/etcd and etcdctl (scripts/install_deps.sh)\n");
    return 2;
  }
  test::EtcdCluster cluster(members);
  rdzv::server::ServerOptions so;
  so.log_lifecycle = false;
  so.host = "127.0.0.1";
  rdzv::server::ServerThread daemon(so);

  std::printf(
      "| agents | ddprun store: s, median (min-max) of %d | etcd, %d member%s: s, median (min-max) | "
      "ratio of medians etcd / store |\n|---:|---:|---:|---:|\n",
      repeats, members, members == 1 ? "" : "s");
  int job = 0;
  for (const int n : counts) {
    std::vector<double> store_s, etcd_s;
    for (int rep = 0; rep < repeats; ++rep, ++job) {
      const std::string id = "bench-" + std::to_string(job);
      // Alternating, so that drifts in the machine's load hit both alike.
      store_s.push_back(run_round(n, [&](int k) {
        launcher::rendezvous::store::StoreRendezvousOptions o;
        o.run_id = id;
        o.dynamic = true;
        o.min_nodes = o.max_nodes = n;
        o.node_rank = -1;
        o.endpoint_host = "127.0.0.1";
        o.endpoint_port = daemon.port();
        o.advertise_addr = "127.0.0.1";
        o.host = "agent" + std::to_string(k);
        o.timeouts.join_timeout = std::chrono::seconds(120);
        StopSignal stop;
        return std::make_unique<launcher::rendezvous::store::StoreRendezvous>(o, stop);
      }));
      etcd_s.push_back(run_round(n, [&](int k) {
        launcher::rendezvous::etcd::EtcdRendezvousOptions o;
        o.run_id = id;
        o.min_nodes = o.max_nodes = n;
        o.advertise_addr = "127.0.0.1";
        o.host = "agent" + std::to_string(k);
        o.timeouts.join_timeout = std::chrono::seconds(120);
        o.etcd.endpoints = {cluster.endpoint(k % members)};  // agents spread over the members
        for (int m = 1; m < members; ++m) o.etcd.endpoints.push_back(cluster.endpoint((k + m) % members));
        StopSignal stop;
        return std::make_unique<launcher::rendezvous::etcd::EtcdRendezvous>(o, stop);
      }));
    }
    const double s = ddprun::bench::median(store_s), e = ddprun::bench::median(etcd_s);
    std::printf("| %d | %s | %s | %.1fx |\n", n, spread(store_s).c_str(), spread(etcd_s).c_str(), e / s);
    std::fflush(stdout);
  }
  return 0;
}
