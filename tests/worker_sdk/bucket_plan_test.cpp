// DDP's bucket plan (worker_sdk/src/bucket_plan.hpp): which parameters share a gradient bucket.
#include "worker_sdk/src/bucket_plan.hpp"

#include <gtest/gtest.h>

namespace ddprun::worker::detail {
namespace {

using Layout = std::vector<std::vector<size_t>>;

BucketParam floats(size_t bytes, std::string device = "cpu") { return {6, std::move(device), bytes}; }

TEST(BucketPlanTest, ParametersGoInReverseOrderAndTheFirstBucketClosesEarly) {
  // Four 100-byte parameters: the first bucket closes at 100 bytes, the others at 250.
  const Layout l = plan_buckets({floats(100), floats(100), floats(100), floats(100)}, 100, 250);
  EXPECT_EQ(l, (Layout{{3}, {2, 1, 0}}));
}

TEST(BucketPlanTest, DtypesAndDevicesNeverShareABucket) {
  std::vector<BucketParam> params{floats(10), {7, "cpu", 10}, floats(10, "cuda:0"), floats(10)};
  const Layout l = plan_buckets(params, 1 << 20, 1 << 20);
  // Nothing fills a bucket: each group closes at the end, by dtype then device.
  EXPECT_EQ(l, (Layout{{3, 0}, {2}, {1}}));
}

TEST(BucketPlanTest, EveryParameterIsInExactlyOneBucket) {
  std::vector<BucketParam> params;
  for (size_t i = 0; i < 50; ++i) params.push_back(i % 3 ? floats(40 + i) : BucketParam{7, "cpu", 8 * i});
  const Layout l = plan_buckets(params, 64, 512);
  std::vector<int> seen(params.size(), 0);
  for (const auto& bucket : l) {
    ASSERT_FALSE(bucket.empty());
    for (size_t i : bucket) ++seen.at(i);
  }
  for (size_t i = 0; i < params.size(); ++i) EXPECT_EQ(seen[i], 1) << "parameter " << i;
}

TEST(BucketPlanTest, NoParametersNoBuckets) { EXPECT_TRUE(plan_buckets({}, 1, 1).empty()); }

}  // namespace
}  // namespace ddprun::worker::detail
