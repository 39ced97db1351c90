#pragma once
// A small HTTP/1.1 responder with Boost.Beast, for endpoints that machines poll: the daemon's
// Prometheus metrics (--metrics-port) and an agent's health endpoint for liveness probes
// (TORCHELASTIC_HEALTH_CHECK_PORT). Each connection gets one response to a GET or HEAD and is
// closed; a request must arrive within 3 s and its header fit in 8 KiB, and at most 64 connections
// are served at once (when all are taken, the one that has waited longest for its request makes
// room), so a client that stalls or floods costs nothing lasting. Every answer says
// `X-Content-Type-Options: nosniff`. Not thread-safe: everything runs on the io_context's thread,
// the handler included.

#include <utility>  // before Asio (Boost 1.74 quirk)

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace ddprun::rdzv::server {

struct HttpRequest {
  std::string_view target;                 // the path and query, as sent
  boost::asio::ip::address peer;           // who asks
  std::optional<std::string_view> host{};  // the (first) Host field, as sent; none without one
  size_t host_fields = 0;                  // how many Host fields were sent
};

struct HttpReply {
  unsigned status = 200;
  std::string content_type = "text/plain; charset=utf-8";
  std::string body;
  std::vector<std::pair<std::string, std::string>> headers;  // more header fields (name, value)
};

class HttpServer {
 public:
  struct Sessions;
  using Handler = std::function<HttpReply(const HttpRequest& request)>;
  // Binds `host`:`port` (a numeric address; port 0: the kernel picks, read port()); throws
  // ConnectionError. `name` is the Server header.
  HttpServer(boost::asio::io_context& io, const std::string& host, uint16_t port, std::string name, Handler handler);
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;
  void start();
  void stop();
  uint16_t port() const { return port_; }
  boost::asio::ip::tcp::endpoint local_endpoint() const { return acceptor_.local_endpoint(); }

 private:
  void accept();
  boost::asio::io_context& io_;
  boost::asio::ip::tcp::acceptor acceptor_;
  std::shared_ptr<const std::string> name_;
  std::shared_ptr<Handler> handler_;
  uint16_t port_ = 0;
  std::shared_ptr<Sessions> sessions_;  // connections being served (bounded)
};

}  // namespace ddprun::rdzv::server
