#include <ddprun/worker.hpp>

#include <iostream>

int main() {
  auto dist = ddprun::worker::Distributed::init();
  ddprun::worker::RankSampler sampler(10, dist);
  dist.print("consumer ok: world ", dist.world_size(), ", ", sampler.size(), " samples on rank 0");
  return 0;
}
