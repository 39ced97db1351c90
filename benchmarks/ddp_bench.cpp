// DDP training-step throughput of the C++ worker SDK (the C++ half of benchmarks/ddp_bench.sh).
// Model: LeNet-5 on 1x28x28 inputs (Fashion-MNIST shaped), synthetic data with a fixed seed, SGD.
// Prints from rank 0: "steps_per_s=... compute_ms=... ddp_step_ms=..." where compute_ms is the
// same step with gradient synchronisation off (no_sync) and ddp_step_ms the synchronised one.
//   ddp_bench [STEPS] [BATCH_PER_RANK]
// DDP_BENCH_FIRST_BUCKET_KB / DDP_BENCH_BUCKET_KB override the bucket caps (default 1024 / 25600);
// DDP_BENCH_REDUCER=process-group reduces through ProcessGroupGloo instead of the direct Gloo
// reducer; DDP_BENCH_BUSY_POLL=on|off sets DdpOptions::busy_poll (default auto).
#include <torch/torch.h>

#include <chrono>
#include <cstdlib>
#include <string>

#include "common/lenet.hpp"
#include "ddprun/worker.hpp"

using namespace ddprun::worker;
using ddprun::examples::LeNetImpl;

int main(int argc, char** argv) {
  const int steps = argc > 1 ? std::atoi(argv[1]) : 200;
  const int batch = argc > 2 ? std::atoi(argv[2]) : 64;
  torch::set_num_threads(1);
  auto dist = Distributed::init();
  torch::manual_seed(0);
  auto model = std::make_shared<LeNetImpl>();
  DdpOptions ddp_options;
  if (const char* kb = std::getenv("DDP_BENCH_FIRST_BUCKET_KB")) ddp_options.first_bucket_cap_bytes = std::stoul(kb) << 10;
  if (const char* kb = std::getenv("DDP_BENCH_BUCKET_KB")) ddp_options.bucket_cap_bytes = std::stoul(kb) << 10;
  if (const char* r = std::getenv("DDP_BENCH_REDUCER")) ddp_options.direct_gloo = std::string(r) != "process-group";
  if (const char* b = std::getenv("DDP_BENCH_BUSY_POLL")) {
    ddp_options.busy_poll = std::string(b) == "on" ? BusyPoll::On : std::string(b) == "off" ? BusyPoll::Off : BusyPoll::Auto;
  }
  DistributedDataParallel<LeNetImpl> ddp(model, dist, ddp_options);
  torch::optim::SGD opt(ddp.parameters(), torch::optim::SGDOptions(0.01).momentum(0.9));
  torch::manual_seed(1 + dist.rank());
  const auto x = torch::randn({batch, 1, 28, 28});
  const auto y = torch::randint(0, 10, {batch});
  auto step = [&] {
    opt.zero_grad();
    torch::nn::functional::cross_entropy(ddp(x), y).backward();
    opt.step();
  };
  using Clock = std::chrono::steady_clock;
  auto timed = [&](int n, bool sync) {
    dist.barrier();
    const auto t0 = Clock::now();
    for (int i = 0; i < n; ++i) {
      if (sync) {
        step();
      } else {
        auto guard = ddp.no_sync();
        step();
      }
    }
    dist.barrier();
    return std::chrono::duration<double>(Clock::now() - t0).count();
  };
  timed(10, true);  // warm-up
  const double compute = timed(steps / 2, false) / (steps / 2);
  const double synced = timed(steps, true);
  dist.print("steps_per_s=", steps / synced, " compute_ms=", compute * 1000, " ddp_step_ms=", synced / steps * 1000,
             " world_size=", dist.world_size());
  return 0;
}
