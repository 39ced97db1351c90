// Serves the job page (/ui, /api/job, /metrics) of N synthetic ranks, for job_page_bench.sh: the
// agent's own HTTP server and view, fed 120 ticks of readings as the watchdog feeds them (every
// 97th rank 3x slower than the others, one rank stalled), so the page shows a full heat map.
//   job_page_synthetic RANKS    prints "port=P", serves until its stdin closes
#include <unistd.h>

#include <iostream>
#include <string>
#include <vector>

#include "launcher/agent/status_server.hpp"

using ddprun::launcher::agent::StatusServer;
using ddprun::launcher::watchdog::RankReading;
using namespace std::chrono_literals;

int main(int argc, char** argv) {
  const int ranks = argc > 1 ? std::stoi(argv[1]) : 1024;
  StatusServer server(0);
  auto& view = server.view();
  view.set_identity("synthetic", "bench", 0, ranks / 8);
  view.new_round(0, ranks, 0);
  view.set_phase("running", std::to_string(ranks) + " workers", true, 0);
  std::vector<RankReading> readings(static_cast<size_t>(ranks));
  auto t = std::chrono::steady_clock::now() - 121s;
  for (int r = 0; r < ranks; ++r) {
    auto& x = readings[static_cast<size_t>(r)];
    x.rank = r;
    x.local_rank = r % 8;
    x.pid = 10000 + r;
    x.alive = x.reports = x.reports_waits = true;
  }
  for (int tick = 0; tick < 120; ++tick) {
    t += 1s;
    for (int r = 0; r < ranks; ++r) {
      auto& x = readings[static_cast<size_t>(r)];
      if (r == 5 && tick > 60) continue;  // stalled
      const double compute = r % 97 == 0 ? 0.3 : 0.1;
      x.steps += 3;
      x.wait_ns += static_cast<uint64_t>((1.0 - 3 * compute) * 1e9);
      x.last_step = x.last_progress = t;
    }
    view.update(t, readings);
  }
  view.event("rendezvous", "round 0: joining");
  view.event("start", "round 0: " + std::to_string(ranks) + " rank(s)");
  std::cout << "port=" << server.port() << std::endl;
  char c;
  while (::read(0, &c, 1) > 0) {
  }
  return 0;
}
