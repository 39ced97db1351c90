#pragma once
// What the modes of sdk_test_worker share: the test network and the references it is held to.
#include <torch/torch.h>

#include <algorithm>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "ddprun/worker.hpp"

namespace ddprun::test::sdk_worker {

using namespace ddprun::worker;

// Conv + BatchNorm + Linear: several buckets with small caps, and a BatchNorm buffer.
struct NetImpl : torch::nn::Module {
  NetImpl() {
    conv = register_module("conv", torch::nn::Conv2d(torch::nn::Conv2dOptions(1, 4, 3).padding(1)));
    bn = register_module("bn", torch::nn::BatchNorm2d(4));
    fc1 = register_module("fc1", torch::nn::Linear(4 * 8 * 8, 33));
    fc2 = register_module("fc2", torch::nn::Linear(33, 5));
  }
  torch::Tensor forward(torch::Tensor x) {
    x = torch::relu(bn(conv(x)));
    return fc2(torch::relu(fc1(x.flatten(1))));
  }
  torch::nn::Conv2d conv{nullptr};
  torch::nn::BatchNorm2d bn{nullptr};
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
};
TORCH_MODULE(Net);

inline DdpOptions small_buckets() {
  DdpOptions o;
  o.first_bucket_cap_bytes(200);  // odd sizes: buckets close in the middle of layers' tensors
  o.bucket_cap_bytes(3000);
  return o;
}

// The global batch of a step (world * per_rank samples), identical on every rank.
inline std::pair<torch::Tensor, torch::Tensor> global_batch(int step, int world, int per_rank) {
  torch::manual_seed(1000 + step);
  return {torch::randn({world * per_rank, 1, 8, 8}), torch::randint(0, 5, {world * per_rank})};
}

inline double max_abs_diff(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b) {
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, (a[i] - b[i]).abs().max().item<double>());
  return m;
}

inline double all_max(Distributed& dist, double value) {
  auto t = torch::tensor({value}, torch::kFloat64);
  std::vector<torch::Tensor> ts{t};
  c10d::AllreduceOptions opts;
  opts.reduceOp = c10d::ReduceOp::MAX;
  dist.process_group()->allreduce(ts, opts)->wait();
  return t.item<double>();
}

// A model whose initial parameters differ per rank; DDP must replace them with rank 0's.
// Where the Python interop modes train: DDPRUN_INTEROP_DEVICE=cuda puts the model and batches on
// GPU LOCAL_RANK (modulo the GPUs there are), as tests/python/test_worker_sdk_interop.py does;
// their process group is then the SDK's choice on a GPU (NCCL), else Gloo.
inline bool interop_on_cuda() {
  const char* device = std::getenv("DDPRUN_INTEROP_DEVICE");
  return device && std::string(device) == "cuda";
}

// DDPRUN_INTEROP_MKLDNN=0 (tests/python/test_worker_sdk_interop.py sets it): convolutions run on
// ATen's own kernels, not oneDNN's, as the Python side of that test does.
inline void interop_kernels() {
  const char* mkldnn = std::getenv("DDPRUN_INTEROP_MKLDNN");
  if (mkldnn && std::string(mkldnn) == "0") at::globalContext().setUserEnabledMkldnn(false);
}

inline Distributed interop_init() {
  InitOptions options;
  options.backend(interop_on_cuda() ? "auto" : "gloo");
  return Distributed::init(options);
}

inline torch::Device interop_device(Distributed& dist) {
  if (!interop_on_cuda()) return torch::kCPU;
  const auto gpus = static_cast<int>(torch::cuda::device_count());
  if (gpus == 0) throw std::runtime_error("DDPRUN_INTEROP_DEVICE=cuda, but this process sees no CUDA device");
  return {torch::kCUDA, static_cast<c10::DeviceIndex>(dist.env().local_rank % gpus)};
}

inline Net rank_seeded_net(int rank) {
  torch::manual_seed(7 + rank);
  return Net();
}

// Largest difference between this rank's parameters and rank 0's, over all ranks.
inline double diff_vs_rank0(Distributed& dist, const std::vector<torch::Tensor>& params) {
  double m = 0;
  for (const auto& p : params) {
    auto root = p.detach().clone();
    std::vector<torch::Tensor> t{root};
    dist.process_group()->broadcast(t)->wait();
    m = std::max(m, (p.detach() - root).abs().max().item<double>());
  }
  return all_max(dist, m);
}

// A single-process copy of the (already broadcast) DDP model's parameters.
inline Net reference_copy(Net& of) {
  Net ref;
  torch::NoGradGuard g;
  auto src = of->parameters(), dst = ref->parameters();
  for (size_t i = 0; i < src.size(); ++i) dst[i].copy_(src[i]);
  return ref;
}

// The modes of sdk_test_worker_features.cpp: DDP as a module, communication hooks, SyncBatchNorm
// and ZeRO; and of sdk_test_worker_qat.cpp.
int ddp_module(const std::string& dir);
int custom_hook();
int powersgd();
int sync_batch_norm();
int zero(const std::string& phase, const std::string& dir);
int qat_parity(const std::string& engine, const std::string& in, const std::string& out, int steps, int observer_off,
               int freeze_bn, bool convert);
int qat_sync_bn();
int qat_clone();
int qat_prepare_sequential(const std::string& engine, const std::string& in, const std::string& out, int steps,
                           int observer_off, int freeze_bn);

}  // namespace ddprun::test::sdk_worker
