// Latency of one CPU all-reduce as DistributedDataParallel issues it: ProcessGroupGloo's allreduce
// (what PyTorch's DDP uses) vs the worker SDK's direct Gloo ring (the DDP comm group, its bucket
// run on the waiting thread as at the end of backward), sleeping or spinning while it waits. The
// last column says whether the ring's sums are ProcessGroupGloo's to the bit on the same inputs.
// Run under ddprun with 2 or more processes; rank 0 prints a table and the ratios.
//   ddprun --nproc_per_node 2 build/benchmarks/allreduce_bench [ITERATIONS]
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <numeric>
#include <string>
#include <vector>

#include "ddprun/worker.hpp"
#include "ddp_comm_group.hpp"

using namespace ddprun::worker;

namespace {

struct Stats {
  double mean, p50, p90;
};

Stats measure(Distributed& dist, int iterations, const std::function<void()>& once) {
  for (int i = 0; i < 20; ++i) once();
  dist.barrier();
  std::vector<double> ms;
  for (int i = 0; i < iterations; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    once();
    ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  const double mean = std::accumulate(ms.begin(), ms.end(), 0.0) / static_cast<double>(ms.size());
  std::sort(ms.begin(), ms.end());
  return {dist.max(mean), ms[ms.size() / 2], ms[ms.size() * 9 / 10]};
}

}  // namespace

int main(int argc, char** argv) {
  const int iterations = argc > 1 ? std::atoi(argv[1]) : 300;
  torch::set_num_threads(1);
  auto dist = Distributed::init();
  auto pg = dist.process_group();
  using ddprun::worker::detail::DdpCommGroup;
  auto sleeping = c10::make_intrusive<DdpCommGroup>(pg, dist.store(), "allreduce_bench/sleep/", dist.timeout(), false);
  auto spinning = c10::make_intrusive<DdpCommGroup>(pg, dist.store(), "allreduce_bench/spin/", dist.timeout(), true);
  dist.print("All-reduce latency, ", dist.world_size(), " processes, ", iterations,
             " iterations; mean over iterations (slowest rank), p50, p90 in ms");
  dist.print(
      "| floats | ProcessGroupGloo mean / p50 / p90 | direct, sleeping | direct, spinning | mean ratio PG/direct "
      "(sleeping, spinning) | same bits |");
  dist.print("|---:|---|---|---|---|---|");
  for (int64_t n : {1024, 61706, 262144, 1048576}) {
    torch::manual_seed(dist.rank() + 1);
    auto t = torch::randn({n});
    auto by_pg = t.clone(), by_ring = t.clone();
    std::vector<torch::Tensor> pg_in{by_pg}, ring_in{by_ring};
    pg->allreduce(pg_in)->wait();
    sleeping->allreduce(ring_in);
    sleeping->drain();
    const bool same_bits = dist.max(torch::equal(by_pg, by_ring) ? 0.0 : 1.0) == 0.0;
    const Stats pg_stats = measure(dist, iterations, [&] {
      std::vector<torch::Tensor> ts{t};
      pg->allreduce(ts)->wait();
    });
    auto through = [&](DdpCommGroup& group) {
      return [&] {
        std::vector<torch::Tensor> ts{t};
        group.allreduce(ts);
        group.drain();
      };
    };
    const Stats sleep_stats = measure(dist, iterations, through(*sleeping));
    const Stats spin_stats = measure(dist, iterations, through(*spinning));
    char line[512];
    auto cell = [](const Stats& s) {
      char c[96];
      std::snprintf(c, sizeof c, "%.3f / %.3f / %.3f", s.mean, s.p50, s.p90);
      return std::string(c);
    };
    std::snprintf(line, sizeof line, "| %lld | %s | %s | %s | %.1fx, %.1fx | %s |", static_cast<long long>(n),
                  cell(pg_stats).c_str(), cell(sleep_stats).c_str(), cell(spin_stats).c_str(),
                  pg_stats.mean / sleep_stats.mean, pg_stats.mean / spin_stats.mean, same_bits ? "yes" : "NO");
    dist.print(line);
  }
  return 0;
}
