// Links ddprun::worker_nccl from the installed package (it runs only where there are GPUs).
#include <ddprun/worker/nccl.hpp>

#include <cstdio>

int main() {
  const auto create = &ddprun::worker::NcclCommunicator::create;
  std::printf("consumer_nccl linked: %s\n", create != nullptr ? "yes" : "no");
  return 0;
}
