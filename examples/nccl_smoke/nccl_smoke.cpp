// NCCL smoke test for the worker SDK on GPUs: every rank all-reduces a CUDA tensor holding
// rank + 1 on its own device (cuda:LOCAL_RANK) and checks the sum.
//   ddprun --nproc_per_node gpu nccl_smoke
#include <torch/torch.h>

#include <iostream>

#include "ddprun/worker.hpp"

int main() {
  ddprun::worker::InitOptions options;
  options.backend = "nccl";
  auto dist = ddprun::worker::Distributed::init(options);
  auto t = torch::full({1 << 20}, static_cast<float>(dist.rank() + 1),
                       torch::TensorOptions().device(dist.device()));
  dist.all_reduce_sum(t);
  const double expected = dist.world_size() * (dist.world_size() + 1) / 2.0;
  const double got = t.min().item<double>();
  const bool ok = got == expected && t.max().item<double>() == expected;
  std::cout << "rank " << dist.rank() << " on " << dist.device() << ": all_reduce " << (ok ? "ok" : "WRONG") << " ("
            << got << ", expected " << expected << ")" << std::endl;
  return ok ? 0 : 1;
}
