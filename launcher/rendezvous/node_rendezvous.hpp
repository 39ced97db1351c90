#pragma once
// What the multi-node backends (store, etcd) share, written once: this node's place in the
// current round (set by a join, read from the watcher and watchdog threads), the watcher thread,
// the outcome reports (a proposal for the round's end: the first one written wins) and the
// watchdog's channel. A backend supplies how a proposal is decided and how a channel is opened.

#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "launcher/rendezvous/rendezvous_backend.hpp"
#include "rendezvous/core/job_keys.hpp"

namespace ddprun::launcher {

class NodeRendezvous : public RendezvousBackend {
 public:
  ~NodeRendezvous() override;

  void unwatch() final { stop_watcher(); }
  RoundEnd report_failure(int round, const WorkerExit& root_cause) final;
  RoundEnd report_signal(int round, int signo) final;
  int node_rank() const final { return place().group_rank; }
  std::unique_ptr<ProgressChannel> progress_channel(int round) final;

 protected:
  // This node's place in the current round.
  struct Place {
    int group_rank = -1;
    int group_world_size = 0;
    std::vector<std::string> agents;  // every node's agent id, in group-rank order
    std::vector<std::string> hosts;   // every node's host, in group-rank order
  };

  // `host`: this node's host name, for the reports.
  explicit NodeRendezvous(std::string host) : host_(std::move(host)) {}

  // Proposes `proposal` as round `round`'s end; returns the end decided (the first proposal wins).
  virtual RoundEnd decide(int round, const rdzv::jobs::Outcome& proposal) = 0;
  // The watchdog's channel for node `node` of `nodes` in `round`, on a connection of its own.
  virtual std::unique_ptr<ProgressChannel> open_progress_channel(int round, int node, int nodes) = 0;

  void set_place(Place p);
  Place place() const;  // a copy: safe on any thread
  // Group rank `g`'s host in the current round; "?" when unknown.
  std::string host_of(int g) const;

  // Runs `body` on the watcher thread (stopping the one before). `body` returns when
  // watch_stopped() turns true; stop_watcher() sets it and joins the thread. A backend's destructor
  // calls stop_watcher() before its own members go.
  void start_watcher(std::function<void()> body);
  bool watch_stopped() const { return stop_watching_; }
  void stop_watcher();

 private:
  std::string host_;
  mutable std::mutex place_mutex_;
  Place place_;
  std::thread watcher_;
  std::atomic<bool> stop_watching_{false};
};

}  // namespace ddprun::launcher
