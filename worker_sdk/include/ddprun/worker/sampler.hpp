#pragma once
// DistributedSampler: for the same (size, num_replicas, rank, shuffle, seed, drop_last, epoch) it
// yields exactly the indices of PyTorch's torch.utils.data.DistributedSampler: a randperm from a
// generator seeded with seed + epoch, padded (by repeating from the start) or truncated to a
// multiple of num_replicas, then every num_replicas-th index starting at rank.

#include <cstdint>
#include <vector>

namespace ddprun::worker {

struct SamplerOptions {
  bool shuffle = true;
  uint64_t seed = 0;
  bool drop_last = false;
};

class DistributedSampler {
 public:
  // Throws std::invalid_argument for rank >= num_replicas or num_replicas < 1.
  DistributedSampler(int64_t dataset_size, int num_replicas, int rank, SamplerOptions options = {});

  // Reshuffles: call at the start of each epoch, as in PyTorch.
  void set_epoch(uint64_t epoch) { epoch_ = epoch; }
  uint64_t epoch() const { return epoch_; }
  // Indices for this rank and epoch.
  std::vector<int64_t> indices() const;
  // Samples per rank (PyTorch's num_samples).
  int64_t size() const { return num_samples_; }

 private:
  int64_t dataset_size_;
  int num_replicas_;
  int rank_;
  SamplerOptions options_;
  uint64_t epoch_ = 0;
  int64_t num_samples_;
  int64_t total_size_;
};

}  // namespace ddprun::worker
