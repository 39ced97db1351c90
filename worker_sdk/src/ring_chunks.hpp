#pragma once
// How gloo::allreduce's ring (gloo/allreduce.cc, the all-reduce ProcessGroupGloo runs) divides a
// buffer among the ranks: equal segments of at most 1 MiB (AllreduceOptions' default limit), whole
// elements, at least two per rank and the same number for every rank; rank c's chunk is its run
// of consecutive segments, and chunk c is summed from rank c-1 down to rank c. GlooRing
// (gloo_ring.hpp) sums chunk by chunk in that order. Header-only and Torch-free, so that the unit
// tests check it without a process group.

#include <algorithm>
#include <cstddef>

namespace ddprun::worker::detail {

struct RingChunks {
  size_t total_bytes = 0;
  size_t segment_bytes = 0;
  size_t segments_per_rank = 0;
  // Chunk `chunk` covers bytes [begin(chunk), end(chunk)) of the buffer (possibly empty).
  size_t begin(int chunk) const {
    return std::min(static_cast<size_t>(chunk) * segments_per_rank * segment_bytes, total_bytes);
  }
  size_t end(int chunk) const { return begin(chunk + 1); }
};

inline RingChunks ring_chunks(size_t total_bytes, size_t element_size, int ranks) {
  constexpr size_t kMaxSegmentBytes = 1 << 20;
  const auto n = static_cast<size_t>(ranks);
  auto round_up = [](size_t value, size_t multiple) { return (value + multiple - 1) / multiple * multiple; };
  RingChunks c;
  c.total_bytes = total_bytes;
  if (total_bytes == 0 || element_size == 0 || n == 0) return c;
  const size_t max_segment = element_size * std::max<size_t>(1, kMaxSegmentBytes / element_size);
  const size_t segments = round_up(std::max((total_bytes + max_segment - 1) / max_segment, 2 * n), n);
  c.segments_per_rank = segments / n;
  c.segment_bytes = round_up((total_bytes + segments - 1) / segments, element_size);
  return c;
}

}  // namespace ddprun::worker::detail
