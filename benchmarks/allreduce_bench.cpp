// Latency of one CPU all-reduce as DistributedDataParallel issues it: ProcessGroupGloo's allreduce
// (what PyTorch's DDP uses) vs the worker SDK's direct Gloo reducer, sleeping or spinning while it
// waits. Run under ddprun with 2 or more processes; rank 0 prints a table and the ratios.
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
#include "gloo_reducer.hpp"

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
  const double mean = std::accumulate(ms.begin(), ms.end(), 0.0) / ms.size();
  std::sort(ms.begin(), ms.end());
  return {dist.max(mean), ms[ms.size() / 2], ms[ms.size() * 9 / 10]};
}

}  // namespace

int main(int argc, char** argv) {
  const int iterations = argc > 1 ? std::atoi(argv[1]) : 300;
  torch::set_num_threads(1);
  auto dist = Distributed::init();
  auto pg = dist.process_group();
  ddprun::worker::detail::GlooBucketReducer sleeping(dist.store(), "allreduce_bench/sleep/", dist.rank(), dist.world_size(),
                                     dist.timeout(), false);
  ddprun::worker::detail::GlooBucketReducer spinning(dist.store(), "allreduce_bench/spin/", dist.rank(), dist.world_size(),
                                     dist.timeout(), true);
  dist.print("All-reduce latency, ", dist.world_size(), " processes, ", iterations,
             " iterations; mean over iterations (slowest rank), p50, p90 in ms");
  dist.print("| floats | ProcessGroupGloo mean / p50 / p90 | direct, sleeping | direct, spinning | mean ratio PG/direct (sleeping, spinning) |");
  dist.print("|---:|---|---|---|---|");
  for (int64_t n : {1024, 61706, 262144, 1048576}) {
    auto t = torch::randn({n});
    const Stats pg_stats = measure(dist, iterations, [&] {
      std::vector<torch::Tensor> ts{t};
      pg->allreduce(ts)->wait();
    });
    const size_t sleep_id = sleeping.add(t.data_ptr<float>(), static_cast<size_t>(n)).value();
    const size_t spin_id = spinning.add(t.data_ptr<float>(), static_cast<size_t>(n)).value();
    const Stats sleep_stats = measure(dist, iterations, [&] {
      sleeping.launch(sleep_id, false);
      sleeping.wait_all();
    });
    const Stats spin_stats = measure(dist, iterations, [&] {
      spinning.launch(spin_id, false);
      spinning.wait_all();
    });
    char line[512];
    auto cell = [](const Stats& s) {
      char c[96];
      std::snprintf(c, sizeof c, "%.3f / %.3f / %.3f", s.mean, s.p50, s.p90);
      return std::string(c);
    };
    std::snprintf(line, sizeof line, "| %lld | %s | %s | %s | %.1fx, %.1fx |", static_cast<long long>(n),
                  cell(pg_stats).c_str(), cell(sleep_stats).c_str(), cell(spin_stats).c_str(),
                  pg_stats.mean / sleep_stats.mean, pg_stats.mean / spin_stats.mean);
    dist.print(line);
  }
  return 0;
}
