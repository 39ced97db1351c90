#pragma once
// RankSampler: for the same (size, num_replicas, rank, shuffle, seed, drop_last, epoch) it yields
// exactly the indices of PyTorch's torch.utils.data.DistributedSampler: a randperm from a
// generator seeded with seed + epoch, padded (by repeating from the start) or truncated to a
// multiple of num_replicas, then every num_replicas-th index starting at rank. It is a LibTorch
// sampler too, so it feeds torch::data::make_data_loader (LibTorch's own DistributedRandomSampler
// draws other indices than Python's).

#include <torch/arg.h>
#include <torch/data/samplers/base.h>

#include <cstddef>
#include <cstdint>
#include <vector>

namespace ddprun::worker {

class Distributed;

// Set as LibTorch's options are: SamplerOptions().shuffle(false).seed(7).
struct SamplerOptions {
  TORCH_ARG(bool, shuffle) = true;
  TORCH_ARG(uint64_t, seed) = 0;
  TORCH_ARG(bool, drop_last) = false;
};

class RankSampler : public torch::data::samplers::Sampler<> {
 public:
  // Throws std::invalid_argument for rank >= num_replicas or num_replicas < 1.
  RankSampler(int64_t dataset_size, int num_replicas, int rank, SamplerOptions options = {});
  // This rank's share of the process group.
  RankSampler(int64_t dataset_size, const Distributed& dist, SamplerOptions options = {});

  // Reshuffles: call at the start of each epoch, as in PyTorch.
  void set_epoch(uint64_t epoch);
  uint64_t epoch() const { return epoch_; }
  // Indices for this rank and epoch.
  std::vector<int64_t> indices() const;
  // Samples per rank (PyTorch's num_samples).
  int64_t size() const { return num_samples_; }

  // LibTorch's sampler interface. A data loader resets its sampler at the start of every pass
  // (begin()): the first reset starts the epoch set_epoch gave (0 by default), each later one the
  // next epoch, so `for (auto& batch : *loader)` once per epoch reshuffles as set_epoch(epoch)
  // does. reset(new_size) also takes a new dataset size.
  void reset(c10::optional<size_t> new_size = c10::nullopt) override;
  c10::optional<std::vector<size_t>> next(size_t batch_size) override;
  void save(torch::serialize::OutputArchive& archive) const override;
  void load(torch::serialize::InputArchive& archive) override;

 private:
  void plan();  // num_samples_ and total_size_ from the size and the options

  int64_t dataset_size_;
  int num_replicas_;
  int rank_;
  SamplerOptions options_;
  uint64_t epoch_ = 0;
  int64_t num_samples_ = 0;
  int64_t total_size_ = 0;
  // The data loader's pass: this epoch's indices and how far next() has gone.
  bool started_ = false;
  std::vector<int64_t> pass_;
  size_t position_ = 0;
};

// The sampler's name before it implemented LibTorch's interface (LibTorch has a
// torch::data::samplers::DistributedSampler of its own).
using DistributedSampler [[deprecated("use ddprun::worker::RankSampler: the same indices")]] = RankSampler;

}  // namespace ddprun::worker
