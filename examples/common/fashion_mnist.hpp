#pragma once
// Fashion-MNIST from Debian's dataset-fashion-mnist (/usr/share/datasets/fashion-mnist), read from the
// gzip'd IDX files as they are: images as float [N, 1, 28, 28] normalised, labels as int64 [N].

#include <torch/types.h>

#include <cstdint>
#include <string>

namespace ddprun::examples {

struct Dataset {
  torch::Tensor inputs;   // [N, ...]
  torch::Tensor labels;   // [N]
  torch::Tensor lengths;  // [N] for variable-length sequences, else undefined
  int64_t size() const { return labels.size(0); }
};

// split: "train" or "test". limit: at most this many samples (0 = all). Throws std::runtime_error
// naming the file when it is missing or malformed.
Dataset load_fashion_mnist(const std::string& split, int64_t limit = 0,
                           const std::string& dir = "/usr/share/datasets/fashion-mnist");

}  // namespace ddprun::examples
