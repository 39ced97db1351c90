#include "ddprun/worker/sampler.hpp"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/ATen.h>
#include <torch/serialize/archive.h>
#include <torch/types.h>

#include <algorithm>
#include <stdexcept>
#include <string>

#include "ddprun/worker/distributed.hpp"

namespace ddprun::worker {

RankSampler::RankSampler(int64_t dataset_size, int num_replicas, int rank, SamplerOptions options)
    : dataset_size_(dataset_size), num_replicas_(num_replicas), rank_(rank), options_(options) {
  if (num_replicas < 1) throw std::invalid_argument("RankSampler: num_replicas must be >= 1");
  if (rank < 0 || rank >= num_replicas) {
    throw std::invalid_argument("RankSampler: rank " + std::to_string(rank) + " is outside [0, " +
                                std::to_string(num_replicas - 1) + "]");
  }
  if (dataset_size < 0) throw std::invalid_argument("RankSampler: negative dataset size");
  plan();
}

RankSampler::RankSampler(int64_t dataset_size, const Distributed& dist, SamplerOptions options)
    : RankSampler(dataset_size, dist.world_size(), dist.rank(), options) {}

void RankSampler::plan() {
  const int64_t n = num_replicas_;
  // PyTorch: ceil((len - n) / n) with drop_last and a remainder, else ceil(len / n).
  if (options_.drop_last() && dataset_size_ % n != 0) {
    num_samples_ = dataset_size_ >= n ? (dataset_size_ - n + n - 1) / n : 0;
  } else {
    num_samples_ = (dataset_size_ + n - 1) / n;
  }
  total_size_ = num_samples_ * n;
}

void RankSampler::set_epoch(uint64_t epoch) {
  epoch_ = epoch;
  started_ = false;  // a data loader's next pass starts this epoch
}

void RankSampler::reset(c10::optional<size_t> new_size) {
  if (new_size) {
    dataset_size_ = static_cast<int64_t>(*new_size);
    plan();
  }
  if (started_) ++epoch_;
  started_ = true;
  pass_ = indices();
  position_ = 0;
}

c10::optional<std::vector<size_t>> RankSampler::next(size_t batch_size) {
  if (!started_) reset();
  if (position_ >= pass_.size() || batch_size == 0) return c10::nullopt;
  const size_t end = std::min(pass_.size(), position_ + batch_size);
  std::vector<size_t> batch(pass_.begin() + static_cast<std::ptrdiff_t>(position_),
                            pass_.begin() + static_cast<std::ptrdiff_t>(end));
  position_ = end;
  return batch;
}

void RankSampler::save(torch::serialize::OutputArchive& archive) const {
  archive.write("epoch", torch::tensor(static_cast<int64_t>(epoch_), torch::kInt64), /*is_buffer=*/true);
  archive.write("position", torch::tensor(static_cast<int64_t>(position_), torch::kInt64), /*is_buffer=*/true);
}

void RankSampler::load(torch::serialize::InputArchive& archive) {
  at::Tensor epoch = torch::empty(1, torch::kInt64), position = torch::empty(1, torch::kInt64);
  archive.read("epoch", epoch, /*is_buffer=*/true);
  archive.read("position", position, /*is_buffer=*/true);
  epoch_ = static_cast<uint64_t>(epoch.item<int64_t>());
  pass_ = indices();
  started_ = true;
  position_ = std::min(pass_.size(), static_cast<size_t>(position.item<int64_t>()));
}

std::vector<int64_t> RankSampler::indices() const {
  std::vector<int64_t> all;
  all.reserve(static_cast<size_t>(std::max(total_size_, dataset_size_)));
  if (options_.shuffle()) {
    at::Generator gen = at::detail::createCPUGenerator(options_.seed() + epoch_);
    const at::Tensor perm = at::randperm(dataset_size_, gen, at::TensorOptions().dtype(at::kLong));
    const int64_t* p = perm.data_ptr<int64_t>();
    all.assign(p, p + dataset_size_);
  } else {
    for (int64_t i = 0; i < dataset_size_; ++i) all.push_back(i);
  }
  if (!options_.drop_last()) {
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
