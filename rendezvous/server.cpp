#include "rendezvous/server.hpp"

#include <boost/asio/ip/v6_only.hpp>
#include <boost/asio/post.hpp>
#include <chrono>
#include <future>

#include "common/errors.hpp"
#include "common/log.hpp"
#include "rendezvous/session.hpp"

namespace ddprun::rdzv {

namespace asio = boost::asio;
using asio::ip::tcp;

std::string format_endpoint(const tcp::endpoint& ep) {
  const std::string addr = ep.address().to_string();
  return (ep.address().is_v6() ? "[" + addr + "]" : addr) + ":" + std::to_string(ep.port());
}

namespace {

tcp::endpoint resolve_bind_address(asio::io_context& io, const std::string& host, uint16_t port) {
  boost::system::error_code ec;
  const auto addr = asio::ip::make_address(host.empty() ? "::" : host, ec);
  if (!ec) return {addr, port};
  tcp::resolver resolver(io);
  auto results = resolver.resolve(host, std::to_string(port), tcp::resolver::passive, ec);
  if (ec || results.empty()) {
    throw ConnectionError("cannot bind the store to '" + host + "': the name does not resolve (" + ec.message() +
                          "); pass a numeric address such as 127.0.0.1 or ::");
  }
  return results.begin()->endpoint();
}

}  // namespace

Server::Server(asio::io_context& io, ServerOptions options)
    : io_(io), options_(std::move(options)), acceptor_(io), retry_timer_(io) {
  tcp::endpoint ep = resolve_bind_address(io_, options_.host, options_.port);
  boost::system::error_code ec;
  acceptor_.open(ep.protocol(), ec);
  if (!ec) acceptor_.set_option(tcp::acceptor::reuse_address(true), ec);
  // "::" serves IPv4 clients too (as PyTorch's libuv server does), where the host allows it.
  if (!ec && ep.address().is_v6() && ep.address().is_unspecified()) acceptor_.set_option(asio::ip::v6_only(false), ec);
  if (!ec) acceptor_.bind(ep, ec);
  if (!ec) acceptor_.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) {
    throw ConnectionError("cannot listen on " + format_endpoint(ep) + ": " + ec.message() +
                          (ec == asio::error::address_in_use ? " (another process holds this port; pass port 0 to "
                                                               "let the kernel pick a free one)"
                                                             : ""));
  }
  endpoint_ = acceptor_.local_endpoint();
  port_ = endpoint_.port();
}

Server::~Server() { stop(); }

void Server::start() {
  if (options_.log_lifecycle) log::info("store") << "listening on " << format_endpoint(endpoint_);
  else DDPRUN_LOG_DEBUG("store") << "listening on " << format_endpoint(endpoint_);
  accept();
}

void Server::accept() {
  acceptor_.async_accept([this](const boost::system::error_code& ec, tcp::socket socket) {
    if (stopped_) return;
    if (ec) {
      if (ec == asio::error::operation_aborted) return;
      // Out of descriptors (EMFILE/ENFILE) or a transient error: keep serving the connected
      // clients and try again shortly instead of spinning.
      log::warn("store") << "accept failed: " << ec.message() << "; retrying in 100ms";
      retry_timer_.expires_after(std::chrono::milliseconds(100));
      retry_timer_.async_wait([this](const boost::system::error_code& wec) {
        if (!wec && !stopped_) accept();
      });
      return;
    }
    auto session = std::make_shared<Session>(std::move(socket), store_, options_.limits,
                                             [this](Session* s) { sessions_.erase(s); });
    sessions_.emplace(session.get(), session);
    session->start();
    accept();
  });
}

ServerStats Server::stats() const {
  ServerStats st;
  st.connections = sessions_.size();
  st.waiting_clients = store_.waiting_clients();
  st.keys = store_.num_keys();
  st.stored_bytes = store_.stored_bytes();
  st.requests = store_.requests();
  return st;
}

void Server::stop() {
  if (stopped_) return;
  stopped_ = true;
  boost::system::error_code ignored;
  acceptor_.close(ignored);
  retry_timer_.cancel();
  auto sessions = std::move(sessions_);
  sessions_.clear();
  for (auto& [ptr, session] : sessions) session->close("");
  if (options_.log_lifecycle) log::info("store") << "stopped serving " << format_endpoint(endpoint_);
  else DDPRUN_LOG_DEBUG("store") << "stopped serving " << format_endpoint(endpoint_);
}

ServerThread::ServerThread(ServerOptions options) {
  server_ = std::make_unique<Server>(io_, std::move(options));
  endpoint_ = server_->endpoint();
  port_ = server_->port();
  server_->start();
  thread_ = std::thread([this] {
    try {
      io_.run();
    } catch (const std::exception& e) {
      log::error("store") << "server thread stopped by an unexpected error: " << e.what();
    }
  });
}

ServerThread::~ServerThread() { stop(); }

ServerStats ServerThread::stats() {
  std::promise<ServerStats> result;
  asio::post(io_, [&] { result.set_value(server_->stats()); });
  return result.get_future().get();
}

void ServerThread::stop() {
  if (!thread_.joinable()) return;
  asio::post(io_, [this] {
    server_->stop();
    io_.stop();
  });
  thread_.join();
}

}  // namespace ddprun::rdzv
