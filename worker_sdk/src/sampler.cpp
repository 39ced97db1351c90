#include "ddprun/worker/sampler.hpp"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/ATen.h>

#include <stdexcept>
#include <string>

namespace ddprun::worker {

DistributedSampler::DistributedSampler(int64_t dataset_size, int num_replicas, int rank, SamplerOptions options)
    : dataset_size_(dataset_size), num_replicas_(num_replicas), rank_(rank), options_(options) {
  if (num_replicas < 1) throw std::invalid_argument("DistributedSampler: num_replicas must be >= 1");
  if (rank < 0 || rank >= num_replicas) {
    throw std::invalid_argument("DistributedSampler: rank " + std::to_string(rank) + " is outside [0, " +
                                std::to_string(num_replicas - 1) + "]");
  }
  if (dataset_size < 0) throw std::invalid_argument("DistributedSampler: negative dataset size");
  const int64_t n = num_replicas;
  // PyTorch: ceil((len - n) / n) with drop_last and a remainder, else ceil(len / n).
  if (options.drop_last && dataset_size % n != 0) {
    num_samples_ = dataset_size >= n ? (dataset_size - n + n - 1) / n : 0;
  } else {
    num_samples_ = (dataset_size + n - 1) / n;
  }
  total_size_ = num_samples_ * n;
}

std::vector<int64_t> DistributedSampler::indices() const {
  std::vector<int64_t> all;
  all.reserve(static_cast<size_t>(std::max(total_size_, dataset_size_)));
  if (options_.shuffle) {
    at::Generator gen = at::detail::createCPUGenerator(options_.seed + epoch_);
    const at::Tensor perm = at::randperm(dataset_size_, gen, at::TensorOptions().dtype(at::kLong));
    const int64_t* p = perm.data_ptr<int64_t>();
    all.assign(p, p + dataset_size_);
  } else {
    for (int64_t i = 0; i < dataset_size_; ++i) all.push_back(i);
  }
  if (!options_.drop_last) {
    // Pad by repeating from the start (repeatedly, for tiny datasets).
    const size_t base = all.size();
    for (size_t i = 0; all.size() < static_cast<size_t>(total_size_) && base > 0; ++i) all.push_back(all[i % base]);
  } else {
    all.resize(static_cast<size_t>(total_size_));
  }
  std::vector<int64_t> mine;
  mine.reserve(static_cast<size_t>(num_samples_));
  for (int64_t i = rank_; i < total_size_; i += num_replicas_) mine.push_back(all[static_cast<size_t>(i)]);
  return mine;
}

}  // namespace ddprun::worker
