// Rendezvous benchmark: N simulated agents (threads, each with its own connection) join one
// rendezvous round through a ddprun store (in-process, as ddprun-rendezvous would serve it).
// Reports the time from the first join to every agent holding its rank, and store requests per
// agent (connect handshake included), counted by the server. Both backends: static (each agent
// knows its node rank) and dynamic (c10d: agents join without ranks, the round closes at N); each
// against an open store and a protected one (every connection proves the secret with the HMAC
// handshake), side by side, with the ratio: what the handshake costs. Agents reach the store
// through 64 loopback addresses (127.0.0.1-64). An agent that fails is
// counted and its error shown once, never the end of the run.
//   rendezvous_bench [N,N,...] [REPEATS] [--backend static|c10d|both] [--store open|protected|both] [--by-op]
//                    [--no-cede] [--stack-kib K]
//   (--no-cede: the store serves every wake-up at once, ServerOptions::cede_when_busy off)
//   (--stack-kib: the agent threads' stack size, default 256; 0: the default, RLIMIT_STACK's)
//   (--by-op: the requests per agent of each configuration's last round, by operation, on stderr)
//   (default 16,256,1024,4096, 3 repeats (the median is reported with the range of the repeats,
//   and the protected/open ratio with the range of each repeat's pair), both backends, both stores)
#include <pthread.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <latch>
#include <mutex>
#include <string>
#include <sstream>
#include <thread>
#include <vector>

#include "bench_util.hpp"
#include "common/log.hpp"
#include "common/option_rows.hpp"
#include "common/system.hpp"
#include "launcher/rendezvous/store/store_rendezvous.hpp"

using namespace ddprun;
using Clock = std::chrono::steady_clock;

namespace {

struct Round {
  double seconds = 0;
  double cpu_seconds = 0;  // of this process (agents and store), for the whole round
  double requests_per_agent = 0;
  int wrong = 0;
  std::string by_op;        // requests per agent, by operation
  int failed = 0;           // agents whose join threw
  std::string first_error;  // what the first of them said
};

bool g_cede = true;  // ServerOptions::cede_when_busy

double process_cpu() { return static_cast<double>(ddprun::process_cpu_time().count()) / 1e6; }

Round run_round(bool dynamic, int n, bool secured, int repeat) {
  const double cpu0 = process_cpu();
  rdzv::server::ServerOptions so;
  so.log_lifecycle = false;
  so.host = "::";
  so.cede_when_busy = g_cede;
  const std::string secret = "benchmark-cluster-secret-0123456789";
  if (secured) {
    so.secret = rdzv::core::StoreSecret{};
    so.secret->cluster = secret;
  }
  rdzv::server::ServerThread daemon(so);
  std::atomic<int64_t> first_join_ns{INT64_MAX}, last_done_ns{0};
  std::atomic<int> wrong{0}, failed{0};
  std::mutex error_mutex;
  std::string first_error;
  std::atomic<int64_t> rank_sum{0};
  std::latch go(n + 1);
  const uint64_t before = daemon.stats().requests;
  auto per_op = [&] {
    std::vector<uint64_t> v(rdzv::core::kOpCount);
    daemon.with_server([&](rdzv::server::Server& server) {
      for (size_t op = 0; op < rdzv::core::kOpCount; ++op)
        v[op] = server.store().requests(static_cast<rdzv::core::Op>(op));
    });
    return v;
  };
  const std::vector<uint64_t> ops_before = per_op();
  const auto t0 = Clock::now();
  std::vector<std::thread> agents;
  for (int k = 0; k < n; ++k) {
    agents.emplace_back([&, k] {
      launcher::rendezvous::store::StoreRendezvousOptions o;
      o.run_id =
          std::string(dynamic ? "bench-c10d-" : "bench-static-") + std::to_string(n) + "-" + std::to_string(repeat);
      o.dynamic = dynamic;
      o.min_nodes = n;
      o.max_nodes = n;
      o.node_rank = dynamic ? -1 : k;
      // The store listens on every address: agents reach it through 64 loopback addresses, as
      // agents on many hosts would not share one address's ephemeral ports (the kernel's search
      // for a free one among thousands of connections to one address is not the store's cost).
      o.endpoint_host = "127.0.0." + std::to_string(1 + k % 64);
      o.endpoint_port = daemon.port();
      o.advertise_addr = "127.0.0.1";
      // The benchmark's store is the daemon: no agent tries to host one (on a cluster only the
      // agents on the endpoint's host would; here all 4096 share it).
      o.is_host = false;
      o.host = "agent" + std::to_string(k);
      o.timeouts.join_timeout = std::chrono::seconds(120);
      if (secured) {
        rdzv::core::Token t;
        t.cluster_secret = secret;
        o.token = t;
      }
      go.arrive_and_wait();
      const auto start = std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t0).count();
      int64_t seen = first_join_ns.load();
      while (start < seen && !first_join_ns.compare_exchange_weak(seen, start)) {
      }
      try {
        StopSignal stop;
        launcher::rendezvous::store::StoreRendezvous r(o, stop);
        const auto w = std::get<launcher::rendezvous::World>(r.join(
            0, 1,
            [] {
              return launcher::rendezvous::HostedStore{1, {}};
            },
            stop));
        // Static: rank = node rank. Dynamic: any permutation, checked by the sum below.
        if ((!dynamic && w.rank_offset != k) || w.world_size != n || w.rank_offset != w.group_rank) ++wrong;
        rank_sum += w.rank_offset;
      } catch (const std::exception& e) {
        if (failed++ == 0) {
          std::lock_guard lock(error_mutex);
          first_error = e.what();
        }
        return;
      }
      const auto done = std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t0).count();
      int64_t last = last_done_ns.load();
      while (done > last && !last_done_ns.compare_exchange_weak(last, done)) {
      }
    });
  }
  go.arrive_and_wait();
  for (auto& a : agents) a.join();
  Round r;
  r.seconds = static_cast<double>(last_done_ns - first_join_ns) / 1e9;
  r.requests_per_agent = static_cast<double>(daemon.stats().requests - before) / n;
  const std::vector<uint64_t> ops_after = per_op();
  for (size_t op = 0; op < rdzv::core::kOpCount; ++op) {
    if (ops_after[op] == ops_before[op]) continue;
    char item[64];
    std::snprintf(item, sizeof item, "%s%s %.2f", r.by_op.empty() ? "" : ", ",
                  std::string(rdzv::core::op_name(static_cast<rdzv::core::Op>(op))).c_str(),
                  static_cast<double>(ops_after[op] - ops_before[op]) / n);
    r.by_op += item;
  }
  if (failed == 0 && rank_sum != int64_t{n} * (n - 1) / 2) ++wrong;  // every rank exactly once
  r.wrong = wrong;
  r.failed = failed;
  r.first_error = first_error;
  r.cpu_seconds = process_cpu() - cpu0;
  return r;
}

}  // namespace

constexpr const char* kUsage =
    "usage: rendezvous_bench [N,N,...] [REPEATS] [--backend static|c10d|both] [--store open|protected|both]\n"
    "                        [--by-op] [--no-cede] [--stack-kib K]\n"
    "  N,N,...  agents per round (default 16,256,1024,4096); REPEATS rounds of each (default 3)\n";

[[noreturn]] void usage_error(const std::string& what) {
  std::fprintf(stderr, "rendezvous_bench: %s\n%s", what.c_str(), kUsage);
  std::exit(2);
}

// A whole number of at least `least` (the flags' own parser), or a usage error that names it.
long whole(const std::string& what, const std::string& v, long least) {
  try {
    return static_cast<long>(ddprun::options::parse_whole(what, v, least, INT32_MAX));
  } catch (const std::exception& e) {
    usage_error(e.what());
  }
}

std::string range_text(const std::vector<double>& v, const char* format) {
  char lo[32], hi[32];
  std::snprintf(lo, sizeof lo, format, *std::min_element(v.begin(), v.end()));
  std::snprintf(hi, sizeof hi, format, *std::max_element(v.begin(), v.end()));
  return std::string(lo) + "-" + hi;
}

int main(int argc, char** argv) {
  raise_open_file_limit();
  // Every agent's threads (its join and its heartbeat: 8,192 at 4,096 agents) get 256 KiB stacks
  // rather than the default 8 MiB (RLIMIT_STACK): agents on a cluster are processes on hosts of
  // their own, and mapping, faulting in and unmapping thousands of 8 MiB stacks in one process is
  // the harness's cost, not the store's (5 interleaved pairs, 4,096 static agents, 2-core VM: 4-11%
  // of the round's time and 7-16% of its CPU). --stack-kib sets another size, 0 keeps the default.
  size_t stack_kib = 256;
  log::set_level(log::Level::Warn);
  std::vector<int> counts{16, 256, 1024, 4096};
  int repeats = 3;
  std::vector<bool> backends{false, true};  // dynamic?
  std::vector<bool> stores{false, true};    // protected?
  int positional = 0;
  bool by_op = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const std::string v = i + 1 < argc ? argv[i + 1] : "";
    if (a == "-h" || a == "--help") {
      std::fputs(kUsage, stdout);
      return 0;
    } else if (a == "--by-op") {
      by_op = true;
    } else if (a == "--no-cede") {
      g_cede = false;
    } else if (a == "--stack-kib") {
      stack_kib = static_cast<size_t>(whole("--stack-kib", v, 0));
      ++i;
    } else if (a == "--backend") {
      if (v != "static" && v != "c10d" && v != "both")
        usage_error("--backend is static, c10d or both, not '" + v + "'");
      backends = v == "static" ? std::vector<bool>{false} : v == "c10d" ? std::vector<bool>{true} : backends;
      ++i;
    } else if (a == "--store") {
      if (v != "open" && v != "protected" && v != "both") {
        usage_error("--store is open, protected or both, not '" + v + "'");
      }
      stores = v == "open" ? std::vector<bool>{false} : v == "protected" ? std::vector<bool>{true} : stores;
      ++i;
    } else if (a.rfind("-", 0) == 0) {
      usage_error("unknown flag '" + a + "'");
    } else if (positional++ == 0) {
      counts.clear();
      std::stringstream in(a);
      for (std::string item; std::getline(in, item, ',');) counts.push_back(static_cast<int>(whole("N", item, 1)));
    } else if (positional == 2) {
      repeats = static_cast<int>(whole("REPEATS", a, 1));
    } else {
      usage_error("one list of agent counts and one number of repeats, not also '" + a + "'");
    }
  }
  if (stack_kib > 0) {
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setstacksize(&attr, stack_kib << 10);
    pthread_setattr_default_np(&attr);
    pthread_attr_destroy(&attr);
  }
  std::printf(
      "| backend | agents | store | first join -> all ranked (s), median of %d | range | CPU s (agents + store) "
      "| store requests per agent | wrong ranks | failed agents |\n|---|---:|---|---:|---:|---:|---:|---:|---:|\n",
      repeats);
  for (const bool dynamic : backends) {
    for (const int n : counts) {
      double median[2] = {0, 0}, cpu[2] = {0, 0};
      // Open and protected rounds alternate, so that drifts in the machine's load hit both alike.
      std::vector<double> times[2], cpus[2];
      Round last[2];
      int failed[2] = {0, 0};
      for (int rep = 0; rep < repeats; ++rep) {
        for (const bool secured : stores) {
          last[secured] = run_round(dynamic, n, secured, rep);
          times[secured].push_back(last[secured].seconds);
          cpus[secured].push_back(last[secured].cpu_seconds);
          failed[secured] += last[secured].failed;
          if (last[secured].failed > 0) {
            std::fprintf(stderr, "%s, %d agents, %s store, repeat %d: %d agents failed; the first: %s\n",
                         dynamic ? "c10d" : "static", n, secured ? "protected" : "open", rep, last[secured].failed,
                         last[secured].first_error.c_str());
          }
        }
      }
      for (const bool secured : stores) {
        if (by_op) {
          std::fprintf(stderr, "%s, %d agents, %s store: requests per agent: %s\n", dynamic ? "c10d" : "static", n,
                       secured ? "protected" : "open", last[secured].by_op.c_str());
        }
        median[secured] = ddprun::bench::median(times[secured]);
        cpu[secured] = ddprun::bench::median(cpus[secured]);
        std::printf("| %s | %d | %s | %.3f | %s | %.3f | %.1f | %d | %d |\n", dynamic ? "c10d (dynamic)" : "static", n,
                    secured ? "protected (HMAC handshake)" : "open", median[secured],
                    range_text(times[secured], "%.3f").c_str(), cpu[secured], last[secured].requests_per_agent,
                    last[secured].wrong, failed[secured]);
      }
      if (stores.size() == 2) {
        // Each repeat's pair (its open round, then its protected one): the spread of the ratio.
        std::vector<double> pairs;
        for (size_t k = 0; k < times[0].size(); ++k) pairs.push_back(times[1][k] / times[0][k]);
        std::printf("| %s | %d | ratio protected/open | %.2fx | pairs %sx | %.2fx | | | |\n",
                    dynamic ? "c10d (dynamic)" : "static", n, median[1] / median[0], range_text(pairs, "%.2f").c_str(),
                    cpu[1] / cpu[0]);
      }
      std::fflush(stdout);
    }
  }
  return 0;
}
