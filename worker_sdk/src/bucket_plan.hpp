#pragma once
// DDP's gradient buckets, planned without Torch: which parameters share a bucket. Parameters are
// taken in reverse registration order (backward produces the last layers' gradients first), kept
// apart by dtype and device (one flat tensor per bucket), and a bucket is closed once it holds
// `cap` bytes; the first bucket closed uses `first_cap`, smaller, so the first all-reduce starts
// early in the backward pass. Buckets still open at the end close as they are, by dtype and device.
// Header-only: the SDK's DDP uses it, the Torch-free tests check it.

#include <cstddef>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace ddprun::worker::detail {

struct BucketParam {
  int dtype = 0;       // the scalar type, as a number
  std::string device;  // "cpu", "cuda:0", ...
  size_t bytes = 0;
};

// Each bucket as the indices (into `params`) of its parameters, in the order the buckets are
// reduced.
inline std::vector<std::vector<size_t>> plan_buckets(const std::vector<BucketParam>& params, size_t first_cap,
                                                     size_t cap) {
  struct Open {
    std::vector<size_t> params;
    size_t bytes = 0;
  };
  std::map<std::pair<int, std::string>, Open> open;
  std::vector<std::vector<size_t>> layout;
  for (size_t k = params.size(); k-- > 0;) {
    Open& bucket = open[{params[k].dtype, params[k].device}];
    bucket.params.push_back(k);
    bucket.bytes += params[k].bytes;
    if (bucket.bytes >= (layout.empty() ? first_cap : cap)) {
      layout.push_back(std::move(bucket.params));
      bucket = Open{};
    }
  }
  for (auto& [key, bucket] : open) {
    if (!bucket.params.empty()) layout.push_back(std::move(bucket.params));
  }
  return layout;
}

}  // namespace ddprun::worker::detail
