#pragma once
// TORCHELASTIC_HEALTH_CHECK_PORT: the agent's health endpoint, for a Kubernetes liveness probe
// (torchrun reserves the variable; its open-source server is a stub). Any GET on the port answers:
//   200 "ok: rendezvous, round 0" / "ok: running 8 workers, round 0, for 52 s" / "ok: restarting ..."
//       while the agent joins, runs and restarts its workers;
//   503 "hung: ..." once the hang watchdog (--hang_timeout) has seen no progress, and
//   503 "ending: ..." once the job is over and ddprun is about to exit,
// so a probe restarts a pod whose job hangs, not one that is merely restarting its workers. Served
// by a thread of its own on every address of the host (the probe comes from the node).

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

namespace boost::asio {
class io_context;
}

namespace ddprun::rdzv::server {
class HttpServer;
}

namespace ddprun::launcher::agent {

class HealthEndpoint {
 public:
  enum class Phase { Rendezvous, Running, Restarting, Hung, Ending };
  // Listens on `port` (0: the kernel picks); throws ConnectionError when it cannot.
  explicit HealthEndpoint(uint16_t port);
  ~HealthEndpoint();
  HealthEndpoint(const HealthEndpoint&) = delete;
  HealthEndpoint& operator=(const HealthEndpoint&) = delete;

  // Thread-safe.
  void set(Phase phase, std::string detail);
  uint16_t port() const { return port_; }

 private:
  std::string answer(unsigned& status);

  std::mutex mutex_;
  Phase phase_ = Phase::Rendezvous;
  std::string detail_ = "starting";
  std::chrono::steady_clock::time_point since_ = std::chrono::steady_clock::now();
  std::unique_ptr<boost::asio::io_context> io_;
  std::unique_ptr<rdzv::server::HttpServer> http_;
  uint16_t port_ = 0;
  std::thread thread_;
};

}  // namespace ddprun::launcher::agent
