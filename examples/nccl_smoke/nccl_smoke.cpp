// NCCL smoke test for the worker SDK on GPUs, one GPU per rank (cuda:LOCAL_RANK):
//  1. ddprun::worker_nccl's raw NcclCommunicator all-reduces a cudaMalloc'ed buffer holding rank + 1;
//  2. with a CUDA LibTorch (DDPRUN_WORKER_NCCL), Distributed's ProcessGroupNCCL all-reduces a CUDA
//     tensor the same way.
// Each rank prints one line per check and exits 0 only if every sum is right. Without a GPU it
// exits 1 with the reason.
//   ddprun --nproc_per_node gpu nccl_smoke
#include <cuda_runtime_api.h>
#include <torch/torch.h>

#include <iostream>
#include <vector>

#include "ddprun/worker.hpp"
#include "ddprun/worker/nccl.hpp"

using namespace ddprun::worker;

namespace {

bool check_raw(const Distributed& dist, const std::string& key) {
  auto nccl = NcclCommunicator::create(dist, key);
  const size_t n = 1 << 20;
  std::vector<float> host(n, static_cast<float>(dist.rank() + 1));
  float* device = nullptr;
  if (const auto status = cudaMalloc(reinterpret_cast<void**>(&device), n * sizeof(float)); status != cudaSuccess) {
    throw std::runtime_error(std::string("cudaMalloc failed: ") + cudaGetErrorString(status));
  }
  cudaMemcpy(device, host.data(), n * sizeof(float), cudaMemcpyHostToDevice);
  nccl->all_reduce_sum(device, n);
  nccl->synchronize();
  cudaMemcpy(host.data(), device, n * sizeof(float), cudaMemcpyDeviceToHost);
  cudaFree(device);
  const float expected = static_cast<float>(dist.world_size() * (dist.world_size() + 1)) / 2.0f;
  bool ok = true;
  for (float v : host) ok = ok && v == expected;
  std::cout << "rank " << dist.rank() << " on cuda:" << nccl->device() << ": NcclCommunicator all_reduce "
            << (ok ? "ok" : "WRONG") << " (" << host[0] << ", expected " << expected << ")" << std::endl;
  return ok;
}

#ifdef DDPRUN_WORKER_NCCL
bool check_process_group(Distributed& dist) {
  auto t = torch::full({1 << 20}, static_cast<float>(dist.rank() + 1), torch::TensorOptions().device(dist.device()));
  dist.all_reduce_sum(t);
  const double expected = dist.world_size() * (dist.world_size() + 1) / 2.0;
  const bool ok = t.min().item<double>() == expected && t.max().item<double>() == expected;
  std::cout << "rank " << dist.rank() << " on " << dist.device() << ": ProcessGroupNCCL all_reduce "
            << (ok ? "ok" : "WRONG") << std::endl;
  return ok;
}
#endif

}  // namespace

int main() {
  try {
    InitOptions options;
#ifdef DDPRUN_WORKER_NCCL
    options.backend("nccl");
#else
    options.backend("gloo");  // store and a CPU group; NCCL comes from NcclCommunicator
#endif
    auto dist = Distributed::init(options);
    bool ok = check_raw(dist, "ddprun/nccl_smoke");
#ifdef DDPRUN_WORKER_NCCL
    ok = check_process_group(dist) && ok;
#endif
    return ok ? 0 : 1;
  } catch (const std::exception& e) {
    std::cerr << "nccl_smoke: " << e.what() << std::endl;
    return 1;
  }
}
