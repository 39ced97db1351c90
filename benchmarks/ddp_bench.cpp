// DDP training-step throughput of the C++ worker SDK (the C++ half of benchmarks/ddp_bench.sh and
// benchmarks/ddp_options_bench.sh; ddp_bench.py is the same program in Python DDP).
// Synthetic data with a fixed seed, SGD with momentum, gradients zeroed in place.
// Prints from rank 0: "steps_per_s=... compute_ms=... ddp_step_ms=... peak_rss_mb=..." where
// compute_ms is the same step with gradient synchronisation off (no_sync), ddp_step_ms the
// synchronised one and peak_rss_mb this rank's peak resident memory.
//   ddp_bench [STEPS] [BATCH_PER_RANK]
// DDP_BENCH_MODEL=lenet|resnet18 (default lenet: LeNet-5; resnet18: the resnet18 example's network);
// DDP_BENCH_OPTION=default|find_unused_parameters|gradient_as_bucket_view|static_graph|no_broadcast_buffers
// turns one DDP option on (or broadcast_buffers off);
// DDP_BENCH_FIRST_BUCKET_KB / DDP_BENCH_BUCKET_KB override the bucket caps (default 1024 / 25600);
// DDP_BENCH_REDUCER=process-group reduces through ProcessGroupGloo instead of the direct Gloo
// ring; DDP_BENCH_BUSY_POLL=on|off sets DdpOptions::busy_poll (default auto).
#include <sys/resource.h>
#include <torch/torch.h>

#include <chrono>
#include <cstdlib>
#include <stdexcept>
#include <string>

#include "common/lenet.hpp"
#include "common/resnet18.hpp"
#include "ddprun/worker.hpp"

using namespace ddprun::worker;

namespace {

std::string env_or(const char* name, const char* fallback) {
  const char* v = std::getenv(name);
  return v && *v ? v : fallback;
}

DdpOptions options_from_environment() {
  DdpOptions o;
  if (const char* kb = std::getenv("DDP_BENCH_FIRST_BUCKET_KB")) o.first_bucket_cap_bytes(std::stoul(kb) << 10);
  if (const char* kb = std::getenv("DDP_BENCH_BUCKET_KB")) o.bucket_cap_bytes(std::stoul(kb) << 10);
  o.direct_gloo(env_or("DDP_BENCH_REDUCER", "direct") != "process-group");
  const std::string poll = env_or("DDP_BENCH_BUSY_POLL", "auto");
  o.busy_poll(poll == "on" ? BusyPoll::On : poll == "off" ? BusyPoll::Off : BusyPoll::Auto);
  const std::string option = env_or("DDP_BENCH_OPTION", "default");
  if (option == "find_unused_parameters") {
    o.find_unused_parameters(true);
  } else if (option == "gradient_as_bucket_view") {
    o.gradient_as_bucket_view(true);
  } else if (option == "static_graph") {
    o.static_graph(true);
  } else if (option == "no_broadcast_buffers") {
    o.broadcast_buffers(false);
  } else if (option != "default") {
    throw std::invalid_argument("unknown DDP_BENCH_OPTION " + option);
  }
  return o;
}

template <typename Model>
int run(int steps, int batch, int channels_hw, Distributed& dist) {
  torch::manual_seed(0);
  auto model = std::make_shared<Model>();
  DistributedDataParallel<Model> ddp(model, dist, options_from_environment());
  const auto params = ddp.parameters();
  torch::optim::SGD opt(params, torch::optim::SGDOptions(0.01).momentum(0.9));
  torch::manual_seed(1 + dist.rank());
  const auto x = torch::randn({batch, 1, channels_hw, channels_hw});
  const auto y = torch::randint(0, 10, {batch});
  auto step = [&] {
    for (auto p : params) {  // zero_grad(set_to_none=False): gradients that are bucket views stay so
      if (p.grad().defined()) p.mutable_grad().zero_();
    }
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
  timed(std::max(2, steps / 10), true);  // warm-up (and the bucket rebuild)
  const double compute = timed(std::max(1, steps / 2), false) / std::max(1, steps / 2);
  const double synced = timed(steps, true);
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  dist.print("steps_per_s=", steps / synced, " compute_ms=", compute * 1000, " ddp_step_ms=", synced / steps * 1000,
             " peak_rss_mb=", static_cast<double>(usage.ru_maxrss) / 1024.0, " world_size=", dist.world_size());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const int steps = argc > 1 ? std::atoi(argv[1]) : 200;
  const int batch = argc > 2 ? std::atoi(argv[2]) : 64;
  torch::set_num_threads(1);
  try {
    auto dist = Distributed::init();
    const std::string model = env_or("DDP_BENCH_MODEL", "lenet");
    if (model == "lenet") return run<ddprun::examples::LeNetImpl>(steps, batch, 28, dist);
    if (model == "resnet18") return run<ddprun::examples::ResNet18Impl>(steps, batch, 28, dist);
    throw std::invalid_argument("unknown DDP_BENCH_MODEL " + model + " (lenet or resnet18)");
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ddp_bench: %s\n", e.what());
    return 1;
  }
}
