#pragma once
// The daemon's metrics in Prometheus's text exposition format (version 0.0.4), and the small HTTP
// responder that serves them at /metrics (--metrics-port). Rendering is pure; MetricsServer runs on
// the store's io_context, so a scrape reads the store's state on the thread that owns it. A scrape
// costs the store's thread O(job runs), not O(keys): the jobs come from counters kept as the store
// changes (job_states.hpp), the rest are counters already. Each peer may ask 60 times at once and
// 10 times a second after that (every path of the port, the job page's too); past that it is
// answered 429 with Retry-After.
//
// What is exported: open, accepted, refused and closed connections (by reason), requests by
// operation, bytes in and out, keys and bytes stored and their limits, pending waits, ddprun jobs
// known to the store by state, jobs forgotten, and the usual process_* metrics.

#include <utility>  // before Asio (Boost 1.74 quirk)

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "rendezvous/daemon/job_states.hpp"
#include "rendezvous/server/http_server.hpp"
#include "rendezvous/server/peer_rate_limit.hpp"
#include "rendezvous/server/server.hpp"

namespace ddprun::rdzv::daemon {

// The exposition text for `server`, its jobs read from `jobs` (call on its thread).
std::string render_metrics(const server::Server& server, const JobStates& jobs);

// Serves GET /metrics (and a short index at /) over HTTP/1.1 (HttpServer: one response per
// connection, bounded in size, time and number), and the paths `pages` answers (the job page:
// jobs_page.hpp). Not thread-safe: the io_context's thread.
class MetricsServer {
 public:
  using Pages = std::function<std::optional<server::HttpReply>(const server::HttpRequest&)>;
  // Binds `host`:`port` (0: the kernel picks; read port()); throws ConnectionError.
  MetricsServer(boost::asio::io_context& io, const std::string& host, uint16_t port,
                std::function<std::string()> render, Pages pages = {}, server::PeerRateSettings limit = {});
  ~MetricsServer();
  void start();
  void stop();
  uint16_t port() const { return http_.port(); }

 private:
  server::HttpServer http_;
};

}  // namespace ddprun::rdzv::daemon
