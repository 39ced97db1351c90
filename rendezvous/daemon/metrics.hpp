#pragma once
// The daemon's metrics in Prometheus's text exposition format (version 0.0.4), and the small HTTP
// responder that serves them at /metrics (--metrics-port). Rendering is pure; MetricsServer runs on
// the store's io_context, so a scrape reads the store's state on the thread that owns it.
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
#include <string>

#include "rendezvous/server/server.hpp"

namespace ddprun::rdzv {

// The exposition text for `server` (call on its thread).
std::string render_metrics(const Server& server);

// Serves GET /metrics (and a short index at /) over HTTP/1.1 with Boost.Beast. Each connection
// gets one response and is closed; a request must arrive within 10 s and its header fit in 8 KiB,
// so a client that stalls or floods costs nothing lasting. Not thread-safe: the io_context's thread.
class MetricsServer {
 public:
  struct Sessions;
  // Binds `host`:`port` (0: the kernel picks; read port()); throws ConnectionError.
  MetricsServer(boost::asio::io_context& io, const std::string& host, uint16_t port,
                std::function<std::string()> render);
  ~MetricsServer();
  void start();
  void stop();
  uint16_t port() const { return port_; }

 private:
  void accept();
  boost::asio::io_context& io_;
  boost::asio::ip::tcp::acceptor acceptor_;
  std::function<std::string()> render_;
  uint16_t port_ = 0;
  std::shared_ptr<Sessions> sessions_;  // connections being served (bounded)
};

}  // namespace ddprun::rdzv
