#pragma once
// Progress signals for ddprun's hang watchdog (ddprun --hang_timeout) and its per-rank step rates.
//
// DistributedDataParallel gives them by itself: a beat on every forward, a step at the end of
// every synchronised backward, and a wait around every collective it blocks on. Call progress()
// in long phases DDP does not see (evaluation without the DDP wrapper, a preprocessing loop), and
// step_completed() in a training loop that does not use DistributedDataParallel.
//
// Each call is one relaxed atomic add on a page of shared memory (see progress_page.hpp); without
// ddprun (no DDPRUN_PROGRESS_FILE) they do nothing. Thread-safe.

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>

namespace ddprun::worker {

// This rank is making progress.
void progress();
// This rank completed a training step (also a beat).
void step_completed();
// This rank has completed `completed` training iterations in the whole run, counted across
// restarts: a program that resumes from a checkpoint goes on from the count it saved. ddprun's
// restart policy stops a job whose restarts no longer get past the highest count reported
// (--max_no_progress_restarts); a program that never calls this is never stopped for it.
void report_iterations(uint64_t completed);
// Asks ddprun to take this node out of the job before the next round (a fault this rank found in
// its host: ECC errors, a GPU that fell off the bus, a disk going bad); `reason` is one line, for
// the report. Nothing happens until the round ends (exit non-zero to end it now): then this node
// leaves, an elastic job goes on without it, a static one ends with a report that names the node
// and the reason. False without ddprun (no DDPRUN_EXCLUDE_NODE_FILE) or when the file cannot be
// written.
bool exclude_this_node(const std::string& reason);

// How long ago this node's place in the job stopped being confirmed: ddprun renews it after each
// heartbeat the rendezvous takes, in elastic jobs (whose other nodes re-form without a node they
// stop hearing from). nullopt while it is confirmed, and always without ddprun or outside an
// elastic job. A worker past it may be running beside a group that replaced it.
std::optional<std::chrono::milliseconds> membership_lapsed();

// While an object lives, this rank is blocked on other ranks (a collective, a barrier): the
// watchdog does not count its CPU time as progress, so a wait that spins is still seen as one.
// Nested scopes count once (the outermost).
class CollectiveWait {
 public:
  CollectiveWait();
  ~CollectiveWait();
  CollectiveWait(const CollectiveWait&) = delete;
  CollectiveWait& operator=(const CollectiveWait&) = delete;

 private:
  bool outermost_;
};

}  // namespace ddprun::worker
