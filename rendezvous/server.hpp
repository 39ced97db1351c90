#pragma once
// The TCPStore-compatible server: an acceptor, its sessions, and the KvStore they share.
//
// Server runs on a caller-supplied io_context and must only be touched from that io_context's
// thread once run() has started (use post). ServerThread is the embeddable form: it owns an
// io_context and one thread, binds in its constructor (so the port is known at once and no other
// process can take it in between) and stops cleanly in stop() or its destructor.

#include <utility>  // before Asio (Boost 1.74 quirk)

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <unordered_map>

#include "rendezvous/kv_store.hpp"
#include "rendezvous/protocol.hpp"

namespace ddprun::rdzv {

class Session;

struct ServerOptions {
  // Address to bind: a numeric IPv4/IPv6 address or a host name. "::" listens on IPv6 and IPv4.
  std::string host = "127.0.0.1";
  // 0 lets the kernel pick a free port; read it back with port().
  uint16_t port = 0;
  Limits limits;
  // Log "listening on" / "stopped" at INFO (the daemon) or DEBUG (embedded in the launcher).
  bool log_lifecycle = true;
};

// A snapshot of the server's state, for status queries and tests.
struct ServerStats {
  size_t connections = 0;
  size_t waiting_clients = 0;
  size_t keys = 0;
  uint64_t stored_bytes = 0;
  uint64_t requests = 0;  // served since start
};

class Server {
 public:
  // Binds and listens at once; throws ConnectionError naming the address if that fails.
  Server(boost::asio::io_context& io, ServerOptions options);
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  void start();
  // Stops accepting and closes every connection. Call on the io_context thread.
  void stop();

  uint16_t port() const { return port_; }
  const boost::asio::ip::tcp::endpoint& endpoint() const { return endpoint_; }
  ServerStats stats() const;
  KvStore& store() { return store_; }

 private:
  void accept();

  boost::asio::io_context& io_;
  ServerOptions options_;
  boost::asio::ip::tcp::acceptor acceptor_;
  boost::asio::steady_timer retry_timer_;
  boost::asio::ip::tcp::endpoint endpoint_;
  uint16_t port_ = 0;
  KvStore store_;
  std::unordered_map<Session*, std::shared_ptr<Session>> sessions_;
  bool stopped_ = false;
};

class ServerThread {
 public:
  explicit ServerThread(ServerOptions options);
  ~ServerThread();
  ServerThread(const ServerThread&) = delete;
  ServerThread& operator=(const ServerThread&) = delete;

  uint16_t port() const { return port_; }
  const boost::asio::ip::tcp::endpoint& endpoint() const { return endpoint_; }
  // Closes all connections and joins the thread; idempotent.
  void stop();
  // Taken on the server thread; blocks until it answers.
  ServerStats stats();

 private:
  boost::asio::io_context io_{1};
  std::unique_ptr<Server> server_;
  boost::asio::ip::tcp::endpoint endpoint_;
  uint16_t port_ = 0;
  std::thread thread_;
};

// "127.0.0.1:29500" or "[::1]:29500".
std::string format_endpoint(const boost::asio::ip::tcp::endpoint& ep);

}  // namespace ddprun::rdzv
