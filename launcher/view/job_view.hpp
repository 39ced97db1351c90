#pragma once
// The job as people look at it: what the agent's page (/ui), its JSON (/api/job) and its
// Prometheus metrics (/metrics) show. One model, fed by the agent (its phase, the timeline of
// rounds, restarts, hangs and the end, the report) and by the watchdog (every rank's readings, each
// tick), read by the HTTP server's thread. Thread-safe; bounded whatever the job's size or length:
//   - per rank, the latest `history` ticks of step time (the heat map) and the few readings the
//     live rates need;
//   - the timeline's latest `max_events` entries (the first one stays: the job's start);
//   - in a snapshot, at most `max_rows` rows of heat map (above that, each row is the slowest of a
//     run of consecutive ranks, and the snapshot says so) and `max_listed` ranks listed one by one,
//     those the others wait for first.
//
// Step time: a rank's wall time per step minus the time it spent blocked on the other ranks (the
// SDK's progress page says how long), so a straggler shows as the rank whose steps take longest,
// although every rank of a synchronous job completes as many steps per second. A rank whose page
// does not count its waits (a heartbeat through the store) is shown by its wall time per step.
// Straggler: step time over the latest `window` ticks above `straggler_factor` times the median
// rank's, as rendezvous/jobs/rank_rates.hpp's marked_stragglers has it (the daemon's page marks
// by the same rule); the page marks it at once, the console's warning waits for three checks in a
// row.

#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "launcher/watchdog/watchdog.hpp"
#include "rendezvous/server/web_page.hpp"

namespace ddprun::launcher::view {

using Clock = std::chrono::steady_clock;
using watchdog::RankReading;

struct ViewSettings {
  double straggler_factor = 1.5;  // 0: no rank is marked
  size_t history = 120;           // heat map columns (ticks)
  size_t window = 5;              // ticks the live rates and the straggler mark cover
  size_t max_rows = 256;          // heat map rows in a snapshot
  size_t max_listed = 256;        // ranks listed one by one in a snapshot
  size_t max_events = 400;        // timeline entries kept
};

// What a snapshot says of one rank.
using RankRow = rdzv::server::PageRank;

class JobView {
 public:
  explicit JobView(ViewSettings s = {});

  // Who this is: run id, host, node rank (-1 on a job of one node), node count.
  void set_identity(std::string run_id, std::string host, int node, int nodes);
  // The agent's phase (health.hpp's words) and whether it is healthy.
  void set_phase(std::string phase, std::string detail, bool ok, int round);
  // One tick of the watchdog: every rank of this node (`node` as set_identity's).
  void update(Clock::time_point now, const std::vector<RankReading>& ranks);
  // A new round's workers: the ranks seen so far leave the list (their history stays on the heat
  // map until it scrolls away); `world_size` ranks in the job, `restarts` made so far.
  void new_round(int round, int world_size, int restarts);
  // An entry of the timeline: kind is one word (rendezvous, start, end, restart, hang, exit,
  // nodes), text one line.
  void event(std::string kind, std::string text);
  // The --report_file document as it stands (job_report.hpp), and the hang report's file.
  void set_report(nlohmann::json report);
  void set_hang_report_file(std::string path);
  std::string hang_report_file() const;

  // The JSON of /api/job ("ddprun-job-view/1"; docs/job-views.md).
  nlohmann::json snapshot() const;
  // The ranks as a snapshot lists them: those the others wait for first (stragglers, then the
  // fewest steps, then the longest without progress, then rank order).
  std::vector<RankRow> rows() const;
  // Prometheus' text format.
  std::string metrics() const;

 private:
  struct Point {
    Clock::time_point tick;  // when it was read
    Clock::time_point at;    // when the rank's latest step ended (else `tick`)
    uint64_t steps = 0;
    uint64_t wait_ns = 0;
  };
  struct Track {
    RankReading latest;
    bool current = false;           // a rank of the round being run
    std::deque<Point> points;       // the latest window + 1 readings (steps moved between them)
    std::deque<float> heat;         // per tick: step time in ms, NaN when no step ended
    std::optional<Point> previous;  // the previous tick's reading
  };
  std::vector<RankRow> rows_locked(Clock::time_point now) const;
  static std::optional<double> window_step_ms(const Track& t);
  static std::optional<double> window_rate(const Track& t);

  const ViewSettings s_;
  mutable std::mutex mutex_;
  std::string run_id_, host_;
  int node_ = -1, nodes_ = 1;
  std::string phase_ = "starting", detail_;
  bool ok_ = true;
  int round_ = -1, world_size_ = 0, restarts_ = 0;
  Clock::time_point phase_since_ = Clock::now();
  std::map<int, Track> tracks_;  // by rank
  size_t ticks_ = 0;             // heat map columns filled
  Clock::time_point last_tick_{};
  std::deque<nlohmann::json> events_;
  nlohmann::json first_event_;
  uint64_t events_dropped_ = 0;
  nlohmann::json report_;
  std::string hang_report_file_;
};

}  // namespace ddprun::launcher::view
