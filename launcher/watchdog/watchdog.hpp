#pragma once
// The watchdog of one worker group (one node, one round): progress, hangs, timers, step rates.
//
// Progress. Once a second it reads, per rank:
//   - the progress page (progress_page.hpp) the worker SDK bumps on every DDP forward and step;
//   - on the node that hosts the worker store, every change clients make to it (a rank that sets,
//     adds or deletes a key is doing something; a rank that waits or polls with ADD 0 is not), and
//     the opt-in heartbeat keys: any key ending in "ddprun/progress/<rank>" (ADD 1 per step);
//   - the CPU time of the rank's process tree, over a sliding window (at least 2% of a core): a
//     rank blocked in a collective or the store uses next to none, a rank that computes uses a lot.
//     CPU time is ignored for a rank inside a CollectiveWait (the SDK's collectives, which may
//     spin) and for every rank once any rank heartbeats through the store (heartbeats are for jobs
//     whose blocked ranks spin, such as NCCL's).
// On several nodes, each node bumps a job-wide progress counter in the rendezvous store when its
// ranks progress, and reads it back: the job has progressed if any node's ranks have.
//
// Hangs (--hang_timeout). When the job has made no progress for that long, the node that notices
// first claims the diagnosis; every node captures its ranks' stacks (stacks.hpp), the ranks' store
// connections and, on the store's node, who waits for which key; the claiming node gathers the
// nodes' parts (up to a bound), writes one report (hang_report.hpp) and ends the round as hung,
// which stops every node. A healthy job is never touched: silent computation shows as CPU time,
// and a long phase without CPU (a big checkpoint write, a download) needs a --hang_timeout longer
// than itself, or a heartbeat.
//
// Timers. With TORCHELASTIC_ENABLE_FILE_TIMER=1 it serves torchelastic's file timer
// (file_timer.hpp): an expired scope gets its rank's stacks captured before the signal.
//
// Step rates. From the pages' step counters (or the heartbeat counters), per rank; published every
// 10 s for `ddprun-rendezvous status` and checked for stragglers (step_rates.hpp) on node 0.

#include <sys/types.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "launcher/watchdog/file_timer.hpp"
#include "launcher/watchdog/hang_report.hpp"
#include "launcher/rendezvous/rendezvous_backend.hpp"
#include "launcher/watchdog/step_rates.hpp"

namespace ddprun::rdzv::server {
class ServerThread;
}

namespace ddprun::launcher::watchdog {

using rendezvous::ProgressChannel;
using rendezvous::RoundEnd;

// What the watchdog read of one rank at a tick, for the job's views (launcher/view).
struct RankReading {
  int rank = 0;
  int local_rank = -1;  // -1: a rank known by its store heartbeats alone
  pid_t pid = -1;
  bool alive = false;
  bool reports = false;        // writes its progress page (or heartbeats through the store)
  bool reports_waits = false;  // its page says how long it waited on the others
  uint64_t steps = 0;
  uint64_t wait_ns = 0;                                 // blocked on other ranks (collectives, the store), in all
  bool waiting = false;                                 // blocked on other ranks now
  std::chrono::steady_clock::time_point last_step;      // when its latest step ended ({}: none yet)
  std::chrono::steady_clock::time_point last_progress;  // the latest sign of progress of any kind
};

// A rank's step time between two of its readings: the wall time between them less what it waited
// on the other ranks (where its page counts waits), per step ended; 0 steps: nullopt. The page's,
// the metrics' and the trace's step time.
inline std::optional<double> step_time_ms(std::chrono::steady_clock::duration wall, uint64_t steps, uint64_t waited_ns,
                                          bool reports_waits) {
  if (steps == 0) return std::nullopt;
  const double wall_ms = std::chrono::duration<double, std::milli>(wall).count();
  const double wait_ms = reports_waits ? static_cast<double>(waited_ns) / 1e6 : 0.0;
  return std::max(0.0, wall_ms - wait_ms) / static_cast<double>(steps);
}

struct WatchdogSettings {
  std::chrono::milliseconds hang_timeout{0};  // 0: hangs are not looked for
  double straggler_factor = 1.5;              // 0: no straggler warnings
  std::chrono::milliseconds tick{1000};
  std::chrono::milliseconds rates_period{10000};
  std::chrono::milliseconds stack_limit{10000};   // per capture
  std::chrono::milliseconds gather_limit{20000};  // waiting for the other nodes' diagnoses
  bool python_stacks = false;                     // the workers' sitecustomize.py hook is installed
  bool file_timer = false;                        // serve TORCHELASTIC_TIMER_FILE
  std::string timer_file;                         // its path
  std::string program;
  std::string host;
  int node = -1;  // group rank on several nodes, else -1
  // WORLD_SIZE of the round: only heartbeats of ranks 0..world_size-1 count (a peer of the worker
  // store may write keys for any rank it likes); 0: any rank.
  int world_size = 0;
  std::string attempt_dir;
  uint16_t worker_store_port = 0;
  // Elastic jobs: CLOCK_MONOTONIC ns until which this node's place in the job is confirmed (the
  // agent moves it on after each heartbeat); copied into every rank's progress page each tick, for
  // the SDK's checkpoint writer. nullptr: nothing to confirm.
  const std::atomic<uint64_t>* membership_until_ns = nullptr;
  // Called on the watchdog's thread after every tick's readings (and once more at stop), with
  // every rank of this node; empty: nobody looks.
  std::function<void(std::chrono::steady_clock::time_point, const std::vector<RankReading>&)> on_tick;
};

struct WatchedRank {
  int rank = 0;
  int local_rank = 0;
  std::string dir;  // the rank's private log directory
};

class Watchdog {
 public:
  // Creates each rank's progress page (in its directory) and, if asked, the timer FIFO, before the
  // workers start. Throws ProcessError if they cannot be created.
  Watchdog(WatchdogSettings settings, std::vector<WatchedRank> ranks);
  ~Watchdog();
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

  // DDPRUN_PROGRESS_FILE of the rank with this local rank.
  std::string progress_file(int local_rank) const;

  // Starts watching the workers (pids by local rank; -1 for one that could not start).
  // `worker_store`: the worker store when this node hosts it, else nullptr. `channel`: the job's
  // progress channel on several nodes, else nullptr. `on_hang` runs on the watchdog's thread with
  // the round's end when a hang was diagnosed; `group_running` says whether the workers still run
  // (nothing is reported for a group that is being stopped anyway).
  void start(const std::vector<pid_t>& pids, rdzv::server::ServerThread* worker_store,
             std::unique_ptr<ProgressChannel> channel, std::function<void(const RoundEnd&)> on_hang,
             std::function<bool()> group_running);
  // Stops watching and publishes the final step rates. Idempotent.
  void stop();

  // The most training iterations any rank of this node has reported completing in the whole run
  // (ProgressPage::iterations, read now); nullopt when none has reported any.
  std::optional<uint64_t> iterations() const;
  // Notes for the failure report, by rank: expired torchelastic timers.
  std::map<int, std::string> timer_notes() const;
  // The end-of-round step rates: the whole job's on one node or on node 0 of several, else this
  // node's ranks (another node prints the job's table).
  FinalRates final_rates();
  // Stacks were written into the run directory (it must be kept).
  bool wrote_diagnosis() const { return wrote_diagnosis_; }

 private:
  struct Rank;
  class StoreTap;

  void run();
  // One tick's readings; true if any rank of this node made progress.
  bool sample(std::chrono::steady_clock::time_point now);
  // A rank's progress page: whether its beats or steps moved since the last tick (its step rates
  // sampled), and whether it waits in a collective now.
  struct PageReading {
    bool moved = false;
    bool waiting = false;
  };
  PageReading read_page(Rank& r, std::chrono::steady_clock::time_point now);
  std::vector<RankReading> readings() const;
  // The worker store's changes and the ranks' heartbeats through it; true if the store changed.
  bool sample_store(std::chrono::steady_clock::time_point now);
  void copy_membership();
  void pulse(std::chrono::steady_clock::time_point now, bool progressed);
  void publish_rates(std::chrono::steady_clock::time_point now, bool final);
  void handle_hang(std::chrono::steady_clock::time_point now);
  NodeDiagnosis diagnose_local(std::chrono::steady_clock::time_point now);
  RankState diagnose_rank(const Rank& r, std::chrono::steady_clock::time_point now);
  void on_timer_expired(const TimerExpiry& t, int rank);
  int owner_of(pid_t pid) const;
  bool cpu_progress(Rank& r, std::chrono::steady_clock::time_point now);
  nlohmann::json rates_record(bool whole_run);

  WatchdogSettings s_;
  std::vector<std::unique_ptr<Rank>> ranks_;
  std::unique_ptr<FileTimerServer> timer_;
  rdzv::server::ServerThread* worker_store_ = nullptr;
  std::unique_ptr<StoreTap> tap_;
  std::unique_ptr<ProgressChannel> channel_;
  std::function<void(const RoundEnd&)> on_hang_;
  std::function<bool()> group_running_;
  std::thread thread_;
  std::mutex wake_mutex_;
  std::condition_variable wake_;
  bool stopping_ = false;
  bool started_ = false;
  std::atomic<bool> wrote_diagnosis_{false};
  mutable std::mutex pids_mutex_;  // ranks' pids, read by the timer thread
  mutable std::mutex notes_mutex_;
  std::map<int, std::string> timer_notes_;

  // Progress state (watchdog thread only).
  std::chrono::steady_clock::time_point started_at_, last_job_progress_, next_rates_;
  int64_t job_counter_ = -1;
  bool heartbeat_mode_ = false;
  bool hang_handled_ = false;  // this node looked into a hang (found one, or saw another node claim it)
  bool contributed_ = false;   // this node's part of a hang diagnosis is written
  uint64_t store_changes_ = 0;
  std::map<int, RateTracker> heartbeat_rates_;
  std::map<int, int64_t> heartbeats_seen_;
  StragglerWatch stragglers_{1.5, 3};
  // The job-wide channel does not answer (since when): the other nodes' progress is unknown, so
  // no hang is decided until it answers again, and the outage does not count as idle time.
  bool channel_down_ = false;
  std::chrono::steady_clock::time_point channel_down_since_;
  void channel_failed(std::chrono::steady_clock::time_point now, const std::exception& e);
};

}  // namespace ddprun::launcher::watchdog
