#pragma once
// In-place sum all-reduce of CPU float/double (and half, bfloat16 and integer) buffers over a dedicated Gloo context whose pairs
// are in synchronous mode, with the summation order of ProcessGroupGloo's all-reduce: the results
// are bit for bit those of Python DDP on the same inputs, at any number of ranks.
//
// Why not ProcessGroupGloo::allreduce: its work goes through a queue to a worker thread, and every
// receive is handed from Gloo's event-loop thread to that worker and then to the waiting caller.
// On a loaded machine each of those wake-ups can wait for a scheduler tick, so a 0.25 MB
// all-reduce between two processes on one host averages about 1 ms (p90 4 ms). Here the thread
// that runs the collective reads the sockets itself (blocking, or spinning when asked), and the
// same all-reduce averages under 0.1 ms.
//
// The order of the sums. ProcessGroupGloo runs gloo::allreduce (gloo/allreduce.cc), a ring: the
// buffer is cut into equal segments (at most 1 MiB, whole elements, at least two per rank and the
// same number for every rank), the segments into one chunk of consecutive segments per rank, and
// chunk c is summed along the ring from rank c-1 down to rank c, each rank adding its own value
// to what it received:
//     x[c] + (x[c+1] + (... + (x[c-2] + x[c-1])))          (ranks modulo n)
// then gathered. Float addition is commutative but not associative, so this bracketing is what
// fixes the bits; ring_chunks() computes gloo's chunks and GlooRing reproduces the bracketing
// with bound buffers, which (unlike gloo::allreduce's unbound ones) work in synchronous mode.
//
// Messages: in synchronous mode a send blocks until the kernel takes it, so every message must fit
// in a socket send buffer even when the peer is not reading yet; chunks travel in pieces no larger
// than half the smallest net.core.wmem_max over all ranks (DDPRUN_DDP_MAX_MESSAGE_BYTES may lower
// it). Each rank sends one piece, then receives one: with room for one piece on every link the
// ring cannot deadlock. The pieces change how bytes travel, never which numbers are added.
//
// Thread-safety: one thread at a time runs allreduce_sum (the caller serialises, see DdpCommGroup).

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "ring_chunks.hpp"

namespace gloo {
class Context;
}  // namespace gloo

namespace ddprun::worker::detail {

class GlooRing {
 public:
  // Collective: every rank constructs it with the same key prefix, which connects a full mesh
  // through the store under `prefix` and agrees on the largest message.
  GlooRing(const c10::intrusive_ptr<c10d::Store>& store, const std::string& prefix, int rank, int size,
           std::chrono::milliseconds timeout);
  ~GlooRing();
  GlooRing(const GlooRing&) = delete;
  GlooRing& operator=(const GlooRing&) = delete;

  // Sums `count` elements at `data` over all ranks, in place. Every rank calls with the same
  // counts in the same order. Throws gloo's error when a peer is gone or times out; the ring is
  // unusable after that.
  void allreduce_sum(float* data, size_t count);
  void allreduce_sum(double* data, size_t count);
  // Half precision (the fp16 and bf16 compression hooks): each addition rounds to the type, as
  // gloo's and c10's additions of these types do (in float, then to nearest even).
  void allreduce_sum(c10::Half* data, size_t count);
  void allreduce_sum(c10::BFloat16* data, size_t count);
  // Integers (DDP's map of locally used parameters): any order gives the same sum.
  void allreduce_sum(int32_t* data, size_t count);
  void allreduce_sum(int64_t* data, size_t count);

  // Whether this thread's reads spin (busy-poll) rather than sleep in recv.
  void set_spinning(bool spin);
  int rank() const;
  int size() const;

 private:
  template <typename T>
  void run(T* data, size_t count);

  std::shared_ptr<gloo::Context> context_;
  size_t max_message_bytes_ = 0;
  std::vector<double> scratch_;  // one received piece (double: aligned for both element types)
  uint32_t calls_ = 0;
  bool spinning_ = false;
};

}  // namespace ddprun::worker::detail
