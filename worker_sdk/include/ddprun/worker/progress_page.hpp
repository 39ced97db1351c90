#pragma once
// The progress page: how a worker tells the ddprun on its host that it is making progress, at the
// cost of one atomic add. ddprun creates one file per rank (its path in DDPRUN_PROGRESS_FILE),
// the worker maps it shared and bumps the counters, ddprun reads them once a second. Both sides
// run on the same host, so the layout is native-endian; any language that can mmap a file and do
// atomic 64-bit stores can write it (the worker SDK does so in ddprun/worker/progress.hpp).
//
//   offset  field             written by the worker
//   0       magic             "DDPRUNP1" (ddprun writes it; a worker leaves a page without it alone)
//   8       beats             any sign of progress (DistributedDataParallel forward, progress())
//   16      steps             completed training steps (end of a synchronised backward)
//   24      wait_ns           total nanoseconds spent blocked on other ranks (collectives)
//   32      waiting_since_ns  CLOCK_MONOTONIC nanoseconds when the current wait began; 0 = not waiting
//   40      pid               the process that uses the page (the worker writes it on first use)
//   48      last_step_ns      CLOCK_MONOTONIC nanoseconds of the last completed step (exact rates)
//   56      first_step_ns     ... of the first completed step
//   64      first_step_wait_ns  wait_ns at the first completed step
//   72      membership_until_ns  written by ddprun: CLOCK_MONOTONIC nanoseconds until which this
//                                node's place in the job is confirmed (an elastic job, whose other
//                                nodes go on without a node they stop hearing from); 0 = nothing
//                                to confirm. The SDK's checkpoint writer publishes nothing past it.
//   80      iterations        training iterations the program has completed in the whole run,
//                             counted across restarts (a program that resumes from a checkpoint
//                             goes on from the count it saved); 0 = not reported. The restart
//                             policy's no-progress stop reads the highest (--max_no_progress_restarts).
//
// While waiting_since_ns is set the rank's CPU time is not taken for progress: a collective that
// spins (as NCCL's and the SDK's busy-polling Gloo reducer do) burns CPU without doing work.

#include <atomic>
#include <cstdint>

namespace ddprun::worker {

struct ProgressPage {
  static constexpr uint64_t kMagic = 0x3150'4e55'5250'4444ULL;  // "DDPRUNP1" in little-endian bytes
  static constexpr size_t kFileSize = 4096;

  std::atomic<uint64_t> magic;
  std::atomic<uint64_t> beats;
  std::atomic<uint64_t> steps;
  std::atomic<uint64_t> wait_ns;
  std::atomic<uint64_t> waiting_since_ns;
  std::atomic<int64_t> pid;
  std::atomic<uint64_t> last_step_ns;
  std::atomic<uint64_t> first_step_ns;
  std::atomic<uint64_t> first_step_wait_ns;
  std::atomic<uint64_t> membership_until_ns;
  std::atomic<uint64_t> iterations;
};

static_assert(std::atomic<uint64_t>::is_always_lock_free, "the progress page needs lock-free 64-bit atomics");
static_assert(sizeof(ProgressPage) == 88, "the progress page layout is fixed (fields are only added)");

}  // namespace ddprun::worker
