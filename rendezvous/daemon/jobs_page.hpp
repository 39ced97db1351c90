#pragma once
// The daemon's job page (docs/job-views.md), on its metrics port (--metrics-port):
//   /ui                  the ddprun jobs the store holds, a line each ("ddprun-jobs/1", /api/jobs)
//   /ui?job=RUN_ID       one job as an agent's page shows it ("ddprun-job-view/1", /api/job?job=)
// built from what the job's nodes write to the store: their records, every rank's step rates
// (each node publishes its ranks' every --step_rates_period, 10 s by default), the rounds, a hang
// and the outcome. A job's page here has every node's ranks, where an agent's has its own node's.
//
// The page learns of the store's changes as clients make them (a ChangeObserver put in front of
// the one the server had, which it still tells) and reads the changed keys afterwards, on the
// store's thread: no timer, and nothing to do while no job publishes. Bounded whatever runs:
// `history` columns per rank, `max_events` timeline entries per job, `max_jobs` jobs followed (the
// one changed least recently goes first), and a job's history goes when the janitor forgets it.
//
// Who may look: the page names jobs, hosts and failures, which a protected store shows to token
// holders only. So peers on this host (and through `ssh -L`) always; other peers only when the
// store is open and admits them (a store with a list of allowed peers admits those), as they could
// read every key anyway. And only to requests addressed to this host by a name or address of its
// own or of --metrics-allowed-hosts (server/host_check.hpp), so that no page of another site whose
// name resolves here reads it.
// /metrics, figures only, stays open to anyone under any name.

#include <utility>  // before Asio (Boost 1.74 quirk)

#include <boost/asio/io_context.hpp>
#include <cstdint>
#include <deque>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_set>
#include <vector>

#include "rendezvous/core/kv_store.hpp"
#include "rendezvous/jobs/rank_rates.hpp"
#include "rendezvous/server/host_check.hpp"
#include "rendezvous/server/http_server.hpp"
#include "rendezvous/server/server.hpp"

namespace ddprun::rdzv::daemon {

struct JobsPageSettings {
  double straggler_factor = 1.5;  // as ddprun's --straggler_factor; 0: no rank is marked
  size_t history = 120;           // heat map columns per rank (publications)
  size_t max_rows = 256;          // heat map rows in a snapshot
  size_t max_listed = 256;        // ranks listed one by one in a snapshot
  size_t max_events = 200;        // timeline entries per job
  size_t max_jobs = 256;          // jobs followed
  // The names the page may be asked under besides this host's own (--metrics-allowed-hosts;
  // server/host_check.hpp).
  std::vector<std::string> allowed_hosts;
};

class JobsPage : public core::ChangeObserver {
 public:
  // Not thread-safe: the store's thread (the io_context's) only.
  JobsPage(boost::asio::io_context& io, server::Server& server, JobsPageSettings settings = {});
  ~JobsPage() override;  // puts back the observer it stood in front of
  JobsPage(const JobsPage&) = delete;
  JobsPage& operator=(const JobsPage&) = delete;

  void on_change(std::string_view key, const int64_t* counter) override;
  void on_once(std::string_view token, int64_t result) override;

  // Reads the keys changed since the last call (posted after each change; every answer calls it
  // first).
  void catch_up();
  // "ddprun-jobs/1": every job on the store, its latest run.
  nlohmann::json jobs(int64_t now);
  // "ddprun-job-view/1" of the latest run of `run_id`; nullopt when the store holds no such job.
  std::optional<nlohmann::json> job(const std::string& run_id, int64_t now);
  // The answer for /ui, /ui.js, /ui.css, /api/jobs and /api/job; nullopt for any other path.
  std::optional<server::HttpReply> serve(const server::HttpRequest& request);

 private:
  struct RankTrack {
    jobs::RankRate latest;
    int64_t at_ms = 0;                  // when the daemon read it (its own clock)
    std::deque<jobs::RankRate> recent;  // the latest publications, about 5 s of them
    std::deque<float> heat;             // step time in ms per publication, oldest first
  };
  struct JobTrack {
    int64_t generation = -1;
    std::map<int, RankTrack> ranks;
    double period_s = 10;  // the nodes' publication period, as their records arrive
    nlohmann::json first_event;
    std::deque<nlohmann::json> events;
    uint64_t dropped = 0;
    uint64_t touched = 0;        // the page's change count when it last changed (the oldest goes first)
    int64_t state_since_ms = 0;  // the latest start, round closed or end seen
  };
  JobTrack* track(const std::string& run_id, int64_t generation, int64_t now);
  void apply(std::string_view key, const std::string* value, int64_t now);
  void event(JobTrack& t, int64_t now, std::string kind, std::string text);
  bool may_look(const boost::asio::ip::address& peer) const;

  boost::asio::io_context& io_;
  server::Server& server_;
  const JobsPageSettings s_;
  const server::HostCheck hosts_;
  core::ChangeObserver* next_;
  std::vector<std::string> pending_;
  std::unordered_set<std::string> pending_set_;
  bool posted_ = false;
  uint64_t changes_ = 0;
  std::map<std::string, JobTrack> jobs_;  // by run id
};

}  // namespace ddprun::rdzv::daemon
