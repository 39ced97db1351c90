// ServerThread (server.hpp): a Server on an io_context and a thread of its own, for ddprun and
// the tests.
#include "rendezvous/server/server.hpp"

#include <boost/asio/post.hpp>
#include <future>

#include "common/log.hpp"

namespace ddprun::rdzv::server {

namespace asio = boost::asio;

ServerThread::ServerThread(ServerOptions options) {
  server_ = std::make_unique<Server>(io_, std::move(options));
  endpoint_ = server_->endpoint();
  port_ = server_->port();
  server_->start();
  thread_ = std::thread([this] {
    for (;;) {
      try {
        io_.run();
        return;
      } catch (const std::exception& e) {
        // A handler that threw: keep serving (the server's own handlers catch everything).
        log::error("store") << "unexpected error in the store thread: " << e.what();
      }
    }
  });
}

ServerThread::~ServerThread() { stop(); }

ServerStats ServerThread::stats() {
  ServerStats out;
  with_server([&](Server& s) { out = s.stats(); });
  return out;
}

void ServerThread::with_server(const std::function<void(Server&)>& fn) {
  std::promise<void> done;
  asio::post(io_, [&] {
    fn(*server_);
    done.set_value();
  });
  done.get_future().get();
}

void ServerThread::allow_peers(const std::vector<std::string>& addresses) {
  with_server([&](Server& s) { s.allow_peers(addresses); });
}

void ServerThread::stop() {
  if (!thread_.joinable()) return;
  asio::post(io_, [this] {
    server_->stop();
    io_.stop();
  });
  thread_.join();
}

}  // namespace ddprun::rdzv::server
