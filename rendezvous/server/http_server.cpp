#include "rendezvous/server/http_server.hpp"

#include <fcntl.h>

#include <boost/asio/ip/address.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/core/tcp_stream.hpp>
#include <boost/beast/http.hpp>
#include <chrono>
#include <list>

#include "common/errors.hpp"
#include "rendezvous/server/server.hpp"

namespace ddprun::rdzv::server {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using asio::ip::tcp;

namespace {

// A poller sends its request at once and reads the answer at once: a connection that does neither
// within these times is closed.
constexpr size_t kMaxConnections = 64;
constexpr auto kRequestTime = std::chrono::seconds(3);
constexpr auto kResponseTime = std::chrono::seconds(10);

void set_cloexec(int fd) { ::fcntl(fd, F_SETFD, ::fcntl(fd, F_GETFD) | FD_CLOEXEC); }

}  // namespace

class HttpSession;

// The connections being served, oldest first (shared with them: a session's last handler may run
// after the server is gone).
struct HttpServer::Sessions {
  std::list<HttpSession*> list;
  size_t live = 0;  // not yet made to make room
};

// One HTTP exchange: read a request (bounded in size and time), answer it, close.
class HttpSession : public std::enable_shared_from_this<HttpSession> {
 public:
  HttpSession(tcp::socket socket, std::shared_ptr<const std::string> name, std::shared_ptr<HttpServer::Handler> handler,
              std::shared_ptr<HttpServer::Sessions> all)
      : stream_(std::move(socket)), name_(std::move(name)), handler_(std::move(handler)), all_(std::move(all)) {
    at_ = all_->list.insert(all_->list.end(), this);
    ++all_->live;
  }
  ~HttpSession() {
    if (reading_) --all_->live;
    all_->list.erase(at_);
  }

  void start() {
    parser_.header_limit(8 * 1024);
    parser_.body_limit(0);
    stream_.expires_after(kRequestTime);
    http::async_read(stream_, buffer_, parser_, [self = shared_from_this()](beast::error_code ec, size_t) {
      if (!ec && self->reading_) self->respond();
    });
  }

  bool reading() const { return reading_; }
  // Closes a connection whose request has not arrived yet, to make room for a newer one.
  void make_room() {
    if (!reading_) return;
    reading_ = false;
    --all_->live;
    stream_.close();
  }

 private:
  void respond() {
    reading_ = false;
    --all_->live;
    const auto& req = parser_.get();
    auto& res = response_;
    res.version(req.version());
    res.keep_alive(false);
    res.set(http::field::server, *name_);
    // No answer is to be sniffed into another type: a text/plain 404 that echoes the path it was
    // asked for must never run as a page.
    res.set("X-Content-Type-Options", "nosniff");
    if (req.method() != http::verb::get && req.method() != http::verb::head) {
      res.result(http::status::method_not_allowed);
      res.set(http::field::allow, "GET, HEAD");
      res.set(http::field::content_type, "text/plain; charset=utf-8");
      res.body() = "only GET\n";
    } else {
      boost::system::error_code ec;
      const auto peer = stream_.socket().remote_endpoint(ec);
      HttpRequest request{std::string_view(req.target().data(), req.target().size()),
                          ec ? asio::ip::address() : peer.address()};
      request.host_fields = req.count(http::field::host);
      if (const auto host = req.find(http::field::host); host != req.end()) {
        request.host = std::string_view(host->value().data(), host->value().size());
      }
      HttpReply reply = (*handler_)(request);
      res.result(reply.status);
      res.set(http::field::content_type, reply.content_type);
      for (const auto& [name, value] : reply.headers) res.set(name, value);
      res.body() = std::move(reply.body);
    }
    if (req.method() == http::verb::head) {
      res.content_length(res.body().size());
      res.body().clear();
    }
    res.prepare_payload();
    stream_.expires_after(kResponseTime);
    http::async_write(stream_, res, [self = shared_from_this()](beast::error_code, size_t) {
      beast::error_code ignored;
      self->stream_.socket().shutdown(tcp::socket::shutdown_send, ignored);
    });
  }

  beast::tcp_stream stream_;
  beast::flat_buffer buffer_{size_t{8} << 10};
  http::request_parser<http::empty_body> parser_;
  http::response<http::string_body> response_;
  std::shared_ptr<const std::string> name_;
  std::shared_ptr<HttpServer::Handler> handler_;
  std::shared_ptr<HttpServer::Sessions> all_;
  std::list<HttpSession*>::iterator at_;
  bool reading_ = true;
};

HttpServer::HttpServer(asio::io_context& io, const std::string& host, uint16_t port, std::string name, Handler handler)
    : io_(io),
      acceptor_(io),
      name_(std::make_shared<const std::string>(std::move(name))),
      handler_(std::make_shared<Handler>(std::move(handler))),
      sessions_(std::make_shared<Sessions>()) {
  boost::system::error_code ec;
  const auto addr = asio::ip::make_address(host, ec);
  if (ec) throw ConnectionError("cannot serve HTTP on '" + host + "': not a numeric address");
  const tcp::endpoint ep(addr, port);
  acceptor_.open(ep.protocol(), ec);
  if (!ec) set_cloexec(acceptor_.native_handle());
  if (!ec) acceptor_.set_option(tcp::acceptor::reuse_address(true), ec);
  if (!ec) acceptor_.bind(ep, ec);
  if (!ec) acceptor_.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) throw ConnectionError("cannot serve HTTP on " + format_endpoint(ep) + ": " + ec.message());
  port_ = acceptor_.local_endpoint().port();
}

HttpServer::~HttpServer() { stop(); }

void HttpServer::start() { accept(); }

void HttpServer::stop() {
  boost::system::error_code ignored;
  acceptor_.close(ignored);
}

void HttpServer::accept() {
  acceptor_.async_accept([this](boost::system::error_code ec, tcp::socket socket) {
    if (ec == asio::error::operation_aborted || !acceptor_.is_open()) return;
    if (!ec) {
      set_cloexec(socket.native_handle());
      if (sessions_->live >= kMaxConnections) {
        for (HttpSession* s : sessions_->list) {
          if (s->reading()) {
            s->make_room();
            break;
          }
        }
      }
      std::make_shared<HttpSession>(std::move(socket), name_, handler_, sessions_)->start();
      accept();
      return;
    }
    // Out of descriptors or the like: try again shortly rather than spin.
    auto timer = std::make_shared<asio::steady_timer>(io_, std::chrono::milliseconds(100));
    timer->async_wait([this, timer](boost::system::error_code wec) {
      if (!wec && acceptor_.is_open()) accept();
    });
  });
}

}  // namespace ddprun::rdzv::server
