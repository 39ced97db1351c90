#pragma once
// --trace_file: the job as a Chrome / Perfetto trace (JSON trace events, the "JSON Array Format"),
// written as it happens: open it as is in ui.perfetto.dev or chrome://tracing.
//   - one process per node ("ddprun on HOST", pid = the node's rank, 0 on a job of one node);
//   - its track "node": rendezvous rounds and attempts as slices, restarts, hangs, round ends and
//     the exit as instants, each with its text;
//   - a track per rank ("rank R"): what the rank did each second the watchdog looked (a slice of
//     "N steps" with its step time, "waiting on the others", "no progress", merged while it lasts),
//     and a counter of its step time.
// Streamed, never held: memory stays flat however long the job runs. The file is closed with its
// "]" when ddprun ends; one left without it (ddprun SIGKILLed) still opens in both viewers, which
// accept a trace cut short. Thread-safe (the agent's and the watchdog's threads call it); the
// events are written by a QueuedWriter's thread, so a file that stops taking writes (a FIFO whose
// reader does not read, a hung NFS mount) never blocks them: events it falls behind on are dropped
// (said once), a write that fails (a full disk) is said once and the trace stops, and the
// destructor waits a few seconds at most. Timestamps are microseconds since ddprun started (steady
// clock); the first event's args say when that was (UTC).

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "launcher/watchdog/watchdog.hpp"
#include "launcher/workers/queued_writer.hpp"

namespace ddprun::launcher::view {

class TraceFile {
 public:
  using Clock = std::chrono::steady_clock;
  // Creates `path` (readable by its owner only, as the logs), or writes to the FIFO or device
  // there; throws ConfigError naming the flag when it cannot, or when `path` is a symbolic link,
  // another user's file or a FIFO nobody reads (the open never blocks).
  TraceFile(const std::string& path, const std::string& host);
  ~TraceFile();
  TraceFile(const TraceFile&) = delete;
  TraceFile& operator=(const TraceFile&) = delete;

  // The node's rank once the rendezvous gave one (events after it go to that process).
  void set_node(int node);
  // A timeline entry (job_view.hpp's kinds: rendezvous, start, end, restart, hang, exit).
  void event(const std::string& kind, const std::string& text);
  // One watchdog tick: this node's ranks.
  void update(Clock::time_point now, const std::vector<watchdog::RankReading>& ranks);

 private:
  struct Rank {
    bool named = false;
    std::optional<watchdog::RankReading> previous;
    Clock::time_point previous_at;
    std::string state;  // the slice being extended ("" none)
    int64_t state_since = 0;
  };
  int64_t micros(Clock::time_point t) const;
  void write(const nlohmann::json& e);
  void name_process();
  void end_state(int rank, Rank& r, int64_t at);

  std::mutex mutex_;
  std::string path_;
  std::string host_;
  std::unique_ptr<workers::QueuedWriter> out_;
  bool first_ = true;
  Clock::time_point origin_ = Clock::now();
  int pid_ = 0;
  std::map<int, bool> processes_named_;
  std::map<int, Rank> ranks_;
  std::optional<int64_t> rendezvous_since_, attempt_since_;
  std::string attempt_name_;
};

}  // namespace ddprun::launcher::view
