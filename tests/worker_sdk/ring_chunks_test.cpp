// The direct Gloo ring's division of a bucket, held against gloo::allreduce's rules (the parity
// suite checks the resulting bits against ProcessGroupGloo itself).
#include <gtest/gtest.h>

#include "worker_sdk/src/ring_chunks.hpp"

namespace ddprun::worker::detail {
namespace {

// The chunks tile the buffer in order, each a whole number of elements.
void expect_tiling(const RingChunks& c, int ranks, size_t element_size) {
  EXPECT_EQ(c.begin(0), 0u);
  for (int r = 0; r < ranks; ++r) {
    EXPECT_LE(c.begin(r), c.end(r));
    EXPECT_EQ(c.begin(r) % element_size, 0u);
  }
  EXPECT_EQ(c.end(ranks - 1), c.total_bytes);
}

TEST(RingChunksTest, SmallBucketsHaveTwoSegmentsPerRank) {
  // 28200 bytes of floats over 3 ranks: 6 segments of 4700 bytes.
  const auto c = ring_chunks(28200, 4, 3);
  EXPECT_EQ(c.segments_per_rank, 2u);
  EXPECT_EQ(c.segment_bytes, 4700u);
  EXPECT_EQ(c.begin(1), 9400u);
  EXPECT_EQ(c.begin(2), 18800u);
  expect_tiling(c, 3, 4);
}

TEST(RingChunksTest, SegmentsAreRoundedUpToWholeElementsAndTheLastChunksMayBeShortOrEmpty) {
  // 10 floats over 4 ranks: 8 segments of ceil(40 / 8) = 5 bytes, rounded up to 8.
  const auto c = ring_chunks(40, 4, 4);
  EXPECT_EQ(c.segment_bytes, 8u);
  EXPECT_EQ(c.begin(2), 32u);
  EXPECT_EQ(c.end(2), 40u);         // short
  EXPECT_EQ(c.begin(3), c.end(3));  // empty
  expect_tiling(c, 4, 4);
}

TEST(RingChunksTest, LargeBucketsUseMoreSegmentsOfAtMostOneMebibyte) {
  // 8,000,000 bytes over 3 ranks: 8 segments of 1 MiB would do; rounded up to 9, three per rank,
  // then the buffer split evenly: ceil(8e6 / 9) = 888889, rounded up to 888892.
  const auto c = ring_chunks(8000000, 4, 3);
  EXPECT_EQ(c.segments_per_rank, 3u);
  EXPECT_EQ(c.segment_bytes, 888892u);
  EXPECT_EQ(c.begin(1), 3u * 888892u);
  expect_tiling(c, 3, 4);
  for (size_t bytes : {size_t{1} << 20, size_t{5} << 20, size_t{100} << 20}) {
    for (int ranks : {2, 3, 4, 7}) {
      const auto d = ring_chunks(bytes, 8, ranks);
      EXPECT_LE(d.segment_bytes, size_t{1} << 20);
      EXPECT_GE(d.segments_per_rank, 2u);
      expect_tiling(d, ranks, 8);
    }
  }
}

}  // namespace
}  // namespace ddprun::worker::detail
