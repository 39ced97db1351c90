#pragma once
// The agent's HTTP server (--http_port, or torchrun's TORCHELASTIC_HEALTH_CHECK_PORT): the job page
// (/ui), its data (/api/job), the hang report and /metrics (view/job_page.hpp), and the health
// endpoint, for a Kubernetes liveness probe (torchrun reserves the variable; its open-source
// server is a stub). Any other GET on the port answers
//   200 "ok: PHASE, DETAIL, for N s" while the agent connects, joins, runs, stops and restarts
//       its workers (PHASE: connecting, rendezvous, joined, spare, running, stopping, finishing,
//       restarting);
//   503 "hung: ..." once the hang watchdog (--hang_timeout) has seen no progress, and
//   503 "ending: ..." once the job is over and ddprun is about to exit,
// so a probe restarts a pod whose job hangs, not one that is merely restarting its workers. A GET
// with the query `format=json` answers the same as one object for programs:
//   {"ok": true, "phase": "joined", "round": 0, "seconds": 2, "detail": "as node_rank 1 of 2"}
// (round: the round being joined or run; -1 before the first). Served by a thread of its own on
// every address of the host (the probe comes from the node).

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "launcher/view/job_view.hpp"
#include "rendezvous/server/host_check.hpp"

namespace boost::asio {
class io_context;
}

namespace ddprun::rdzv::server {
class HttpServer;
}

namespace ddprun::launcher::agent {

class StatusServer {
 public:
  // Connecting: to the rendezvous (its store, etcd); Rendezvous: joining a round; Joined: in the
  // round, waiting for the other nodes; Spare: outside a full elastic job's world, waiting to take
  // the place of a node that is lost; Stopping: the workers are being stopped (a failure, a stop
  // signal, another node's end), the detail says why; Finishing: this node's workers are done, the
  // others' not.
  enum class Phase { Connecting, Rendezvous, Joined, Spare, Running, Stopping, Finishing, Restarting, Hung, Ending };
  static const char* name(Phase phase);
  // Listens on `port` (0: the kernel picks); throws ConnectionError when it cannot. The page
  // answers requests addressed to this host, or to a name of `allowed_hosts`
  // (--http_allowed_hosts; rendezvous/server/host_check.hpp).
  explicit StatusServer(uint16_t port, view::ViewSettings view = {},
                        const std::vector<std::string>& allowed_hosts = {});
  ~StatusServer();
  StatusServer(const StatusServer&) = delete;
  StatusServer& operator=(const StatusServer&) = delete;

  // Thread-safe. `round`: the round the phase belongs to (unchanged when -1).
  void set(Phase phase, std::string detail, int round = -1);
  uint16_t port() const { return port_; }
  // Says this ddprun's port where ddprun-top looks for jobs by run id (common/job_pages.hpp), until
  // the server is gone.
  void advertise(const std::string& run_id, const std::string& program);
  // What the page and /metrics show (thread-safe).
  view::JobView& view() { return view_; }

 private:
  std::string answer(std::string_view target, unsigned& status, std::string& content_type);

  view::JobView view_;
  const rdzv::server::HostCheck hosts_;  // used on the server's thread
  std::string advertised_;               // the file advertise() wrote

  std::mutex mutex_;
  Phase phase_ = Phase::Rendezvous;
  std::string detail_ = "starting";
  int round_ = -1;
  std::chrono::steady_clock::time_point since_ = std::chrono::steady_clock::now();
  std::unique_ptr<boost::asio::io_context> io_;
  std::unique_ptr<rdzv::server::HttpServer> http_;
  uint16_t port_ = 0;
  std::thread thread_;
};

}  // namespace ddprun::launcher::agent
