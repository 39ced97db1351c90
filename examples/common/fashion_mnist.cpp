#include "common/fashion_mnist.hpp"

#include <zlib.h>

#include <stdexcept>
#include <vector>

namespace ddprun::examples {
namespace {

std::vector<uint8_t> gunzip_file(const std::string& path) {
  gzFile f = gzopen(path.c_str(), "rb");
  if (!f) {
    throw std::runtime_error("cannot open " + path +
                             " (install Debian's dataset-fashion-mnist: scripts/install_deps.sh does)");
  }
  std::vector<uint8_t> data;
  std::vector<uint8_t> chunk(1 << 20);
  int n;
  while ((n = gzread(f, chunk.data(), static_cast<unsigned>(chunk.size()))) > 0)
    data.insert(data.end(), chunk.begin(), chunk.begin() + n);
  const bool failed = n < 0;
  gzclose(f);
  if (failed) throw std::runtime_error("cannot decompress " + path);
  return data;
}

uint32_t be32(const std::vector<uint8_t>& d, size_t at) {
  return (uint32_t{d[at]} << 24) | (uint32_t{d[at + 1]} << 16) | (uint32_t{d[at + 2]} << 8) | uint32_t{d[at + 3]};
}

// IDX: magic (0x0000 08 NDIMS), NDIMS big-endian sizes, then uint8 data.
torch::Tensor read_idx(const std::string& path, int expected_dims) {
  const auto d = gunzip_file(path);
  if (d.size() < 4 || be32(d, 0) != (0x800u | static_cast<uint32_t>(expected_dims))) {
    throw std::runtime_error(path + " is not an IDX file of unsigned bytes with " + std::to_string(expected_dims) +
                             " dimensions");
  }
  std::vector<int64_t> shape;
  size_t count = 1;
  for (int i = 0; i < expected_dims; ++i) {
    shape.push_back(be32(d, 4 + 4 * static_cast<size_t>(i)));
    count *= static_cast<size_t>(shape.back());
  }
  const size_t offset = 4 + 4 * static_cast<size_t>(expected_dims);
  if (d.size() != offset + count) throw std::runtime_error(path + " is truncated");
  return torch::from_blob(const_cast<uint8_t*>(d.data() + offset), shape, torch::kUInt8).clone();
}

}  // namespace

Dataset load_fashion_mnist(const std::string& split, int64_t limit, const std::string& dir) {
  if (split != "train" && split != "test") throw std::invalid_argument("split must be 'train' or 'test'");
  const std::string prefix = dir + "/" + (split == "train" ? "train" : "t10k");
  auto images = read_idx(prefix + "-images-idx3-ubyte.gz", 3);
  auto labels = read_idx(prefix + "-labels-idx1-ubyte.gz", 1);
  if (limit > 0 && limit < images.size(0)) {
    images = images.narrow(0, 0, limit);
    labels = labels.narrow(0, 0, limit);
  }
  Dataset ds;
  // Mean and standard deviation of the Fashion-MNIST training images.
  ds.inputs = ((images.to(torch::kFloat32) / 255.0 - 0.2860) / 0.3530).unsqueeze(1).contiguous();
  ds.labels = labels.to(torch::kInt64);
  return ds;
}

}  // namespace ddprun::examples
