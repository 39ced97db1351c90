#include "state_transfer.hpp"

#include <fcntl.h>

#include <utility>  // before Boost.Asio (Boost 1.74's headers use std::exchange without it)
#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <limits>
#include <list>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <thread>

#include "common/ft_wire.hpp"

namespace ddprun::worker::ft::detail {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;
using error_code = boost::system::error_code;

namespace {

// A peer has this long from its connection to the end of its request, and this long for each part
// of the answer it takes in: a healing peer needs milliseconds, and a stranger holds a connection
// (one of kMaxConnections) no longer.
constexpr auto kRequestTime = std::chrono::seconds(10);
constexpr auto kWriteProgressTime = std::chrono::seconds(30);

// "[v6]" or "v4" -> the address as Asio reads it.
std::string bare_host(const std::string& host) {
  return host.size() > 1 && host.front() == '[' && host.back() == ']' ? host.substr(1, host.size() - 2) : host;
}

struct Offer {
  int64_t step = -1;
  std::vector<char> bytes;
  std::string digest;  // SHA-256 of bytes, hex
  std::string mac;     // ft_wire::answer_mac of step, size and digest
};

}  // namespace

class Connection;

struct StateServer::Impl {
  asio::io_context io{1};
  tcp::acceptor acceptor{io};
  std::string key;
  std::mutex mutex;
  std::shared_ptr<const Offer> offered;              // guarded by mutex
  std::list<std::weak_ptr<Connection>> connections;  // the io thread's, oldest first
  std::thread thread;

  std::shared_ptr<const Offer> current() {
    std::lock_guard lock(mutex);
    return offered;
  }
  void accept();
  // Room for one more connection: the oldest still sending its request goes; false when every one
  // is being answered.
  bool make_room();
};

// One peer's request and its answer, on the server's thread.
class Connection : public std::enable_shared_from_this<Connection> {
 public:
  Connection(tcp::socket socket, StateServer::Impl& server)
      : socket_(std::move(socket)), timer_(server.io), server_(server) {
    parser_.header_limit(8 * 1024);
  }

  void start() {
    arm(kRequestTime);
    http::async_read(socket_, buffer_, parser_,
                     [self = shared_from_this()](const error_code& ec, size_t) { self->on_request(ec); });
  }

  bool answering() const { return answering_; }

  void close() {
    error_code ignored;
    timer_.cancel();
    socket_.close(ignored);
  }

 private:
  void arm(std::chrono::seconds limit) {
    timer_.expires_after(limit);
    timer_.async_wait([self = shared_from_this()](const error_code& ec) {
      if (!ec) self->close();  // out of time (a re-arm or a close cancels the wait)
    });
  }

  void on_request(const error_code& ec) {
    if (ec) return close();
    answering_ = true;
    const auto& req = parser_.get();
    const std::string target(req.target());
    // The state goes to the quorum's healing peers only: a request that does not prove the rank's
    // key learns nothing, not even the step it serves.
    if (req.method() != http::verb::get ||
        !ft_wire::same(std::string(req[ft_wire::kAuthHeader]), ft_wire::request_proof(server_.key, target)))
      return answer(http::status::forbidden,
                    "this rank's state is for the peers its quorum sends: the request does not prove their key "
                    "(X-Ddprun-Auth)");
    offer_ = server_.current();
    if (!offer_ || target != "/state/" + std::to_string(offer_->step))
      return answer(http::status::not_found,
                    offer_ ? "this rank serves step " + std::to_string(offer_->step) : "this rank serves no step yet");
    res_.result(http::status::ok);
    res_.set(ft_wire::kDigestHeader, offer_->digest);
    res_.set(ft_wire::kMacHeader, offer_->mac);
    send(offer_->bytes.data(), offer_->bytes.size());
  }

  void answer(http::status status, std::string text) {
    text_ = std::move(text);
    res_.result(status);
    res_.set(http::field::content_type, "text/plain");
    send(text_.data(), text_.size());
  }

  void send(const char* data, size_t size) {
    res_.version(11);
    res_.keep_alive(false);
    res_.body().data = const_cast<char*>(data);
    res_.body().size = size;
    res_.body().more = false;
    res_.content_length(size);
    serializer_.emplace(res_);
    write_some();
  }

  void write_some() {
    arm(kWriteProgressTime);
    http::async_write_some(socket_, *serializer_, [self = shared_from_this()](const error_code& ec, size_t) {
      if (ec) return self->close();
      if (!self->serializer_->is_done()) return self->write_some();
      error_code ignored;
      self->socket_.shutdown(tcp::socket::shutdown_send, ignored);
      self->close();
    });
  }

  tcp::socket socket_;
  asio::steady_timer timer_;
  StateServer::Impl& server_;
  beast::flat_buffer buffer_;
  http::request_parser<http::empty_body> parser_;
  bool answering_ = false;
  std::shared_ptr<const Offer> offer_;  // what is being sent, kept while it goes out
  std::string text_;
  http::response<http::buffer_body> res_;
  std::optional<http::response_serializer<http::buffer_body>> serializer_;
};

bool StateServer::Impl::make_room() {
  connections.remove_if([](const std::weak_ptr<Connection>& c) { return c.expired(); });
  if (connections.size() < StateServer::kMaxConnections) return true;
  for (auto it = connections.begin(); it != connections.end(); ++it) {
    const auto c = it->lock();
    if (c && !c->answering()) {
      c->close();
      connections.erase(it);
      return true;
    }
  }
  return false;
}

void StateServer::Impl::accept() {
  acceptor.async_accept([this](const error_code& ec, tcp::socket socket) {
    if (ec == asio::error::operation_aborted) return;
    if (!ec) {
      ::fcntl(socket.native_handle(), F_SETFD, FD_CLOEXEC);  // Boost 1.74 does not set it on accept
      if (make_room()) {
        auto c = std::make_shared<Connection>(std::move(socket), *this);
        connections.push_back(c);
        c->start();
      }
    }
    accept();
  });
}

StateServer::StateServer(const std::string& host, std::string key) : impl_(std::make_unique<Impl>()) {
  impl_->key = std::move(key);
  // The node's address is what the agent advertises: an IP literal, or a host name (on a cluster,
  // nearly always). A name is bound at the first of its addresses this host can bind, as ddprun_ft
  // does, and advertised as the name: a healing peer resolves it on its own host.
  const std::string address_text = bare_host(host);
  error_code ec;
  tcp::resolver resolver(impl_->io);
  const auto endpoints = resolver.resolve(address_text, "0", tcp::resolver::passive, ec);
  if (ec) throw std::runtime_error("cannot serve state on '" + host + "': cannot resolve it: " + ec.message());
  std::string why = "it has no address";
  for (const auto& entry : endpoints) {
    const tcp::endpoint ep = entry.endpoint();
    impl_->acceptor.close(ec);
    impl_->acceptor.open(ep.protocol(), ec);
    if (!ec) impl_->acceptor.set_option(tcp::acceptor::reuse_address(true), ec);
    if (!ec) impl_->acceptor.bind(ep, ec);
    if (!ec) break;
    why = ep.address().to_string() + ": " + ec.message();
  }
  if (ec || !impl_->acceptor.is_open()) throw std::runtime_error("cannot serve state on " + host + ": " + why);
  impl_->acceptor.listen();
  ::fcntl(impl_->acceptor.native_handle(), F_SETFD, FD_CLOEXEC);
  const uint16_t port = impl_->acceptor.local_endpoint().port();
  const bool v6_literal = address_text.find(':') != std::string::npos;
  address_ = (v6_literal ? "[" + address_text + "]" : address_text) + ":" + std::to_string(port);
  impl_->accept();
  impl_->thread = std::thread([this] { impl_->io.run(); });
}

StateServer::~StateServer() {
  impl_->io.stop();
  if (impl_->thread.joinable()) impl_->thread.join();
  // The server's thread is gone: its sockets are this thread's now.
  error_code ec;
  impl_->acceptor.close(ec);
  for (auto& c : impl_->connections)
    if (auto open = c.lock()) open->close();
}

void StateServer::offer(int64_t step, std::vector<char> bytes) {
  auto o = std::make_shared<Offer>();
  o->step = step;
  o->digest = ft_wire::sha256_hex(bytes.data(), bytes.size());
  o->mac = ft_wire::answer_mac(impl_->key, step, bytes.size(), o->digest);
  o->bytes = std::move(bytes);
  std::lock_guard lock(impl_->mutex);
  impl_->offered = std::move(o);
}

namespace {

// One attempt at a fetch, and how it ended.
struct Attempt {
  enum class Kind { Done, NotYet, Refused, Unvouched, Unreachable } kind = Kind::Unreachable;
  std::vector<char> body;
  std::string why;
};

// Connects, asks, reads the answer's header, checks it, then reads exactly the body it vouches
// for; all within `left` (the io_context runs no longer).
Attempt attempt(const std::string& host, const std::string& port, const std::string& key, int64_t step,
                std::chrono::milliseconds left) {
  asio::io_context io;
  tcp::resolver resolver(io);
  tcp::socket socket(io);
  beast::flat_buffer buffer;
  const std::string target = "/state/" + std::to_string(step);
  http::request<http::empty_body> req{http::verb::get, target, 11};
  req.set(http::field::host, host + ":" + port);
  req.set(ft_wire::kAuthHeader, ft_wire::request_proof(key, target));
  // The header first, whatever length it claims; the body only once the key vouches for it (a
  // parser that met the body with the header would reserve the claimed length at once).
  http::response_parser<http::empty_body> head;
  head.header_limit(8 * 1024);
  head.body_limit(std::numeric_limits<std::uint64_t>::max());
  std::optional<http::response_parser<http::vector_body<char>>> body;
  std::string digest;  // what the header vouches for
  std::optional<Attempt> result;
  const auto end = [&](Attempt::Kind kind, std::string why) { result = Attempt{kind, {}, std::move(why)}; };
  const auto on_body = [&](const error_code& ec, size_t) {
    if (ec) return end(Attempt::Kind::Unreachable, "reading the state: " + ec.message());
    std::vector<char> bytes = body->release().body();
    if (!ft_wire::same(ft_wire::sha256_hex(bytes.data(), bytes.size()), digest))
      return end(Attempt::Kind::Unvouched, "its bytes are not the ones its header vouches for");
    result = Attempt{Attempt::Kind::Done, std::move(bytes), {}};
  };
  const auto on_head = [&](const error_code& ec, size_t) {
    if (ec) return end(Attempt::Kind::Unreachable, ec.message());
    const auto& res = head.get();
    if (res.result() == http::status::not_found) return end(Attempt::Kind::NotYet, "");
    if (res.result() == http::status::forbidden)
      return end(Attempt::Kind::Refused, "HTTP 403: it does not take the key the quorum gave for it");
    if (res.result() != http::status::ok)
      return end(Attempt::Kind::Refused, "HTTP " + std::to_string(res.result_int()));
    const auto length = head.content_length();
    digest = std::string(res[ft_wire::kDigestHeader]);
    if (!length ||
        !ft_wire::same(std::string(res[ft_wire::kMacHeader]), ft_wire::answer_mac(key, step, *length, digest)))
      return end(Attempt::Kind::Unvouched, "its answer does not carry the MAC of the key the quorum gave for it");
    body.emplace(std::move(head));
    body->body_limit(*length);
    http::async_read(socket, buffer, *body, on_body);
  };
  resolver.async_resolve(host, port, [&](const error_code& ec, const tcp::resolver::results_type& results) {
    if (ec) return end(Attempt::Kind::Unreachable, "cannot resolve it: " + ec.message());
    asio::async_connect(socket, results, [&](const error_code& connected, const tcp::endpoint&) {
      if (connected) return end(Attempt::Kind::Unreachable, connected.message());
      http::async_write(socket, req, [&](const error_code& written, size_t) {
        if (written) return end(Attempt::Kind::Unreachable, written.message());
        http::async_read_header(socket, buffer, head, on_head);
      });
    });
  });
  io.run_for(left);
  if (!result) end(Attempt::Kind::Unreachable, "no answer in time");
  return std::move(*result);
}

}  // namespace

std::vector<char> fetch_state(const std::string& address, const std::string& key, int64_t step,
                              std::chrono::milliseconds timeout) {
  const auto colon = address.rfind(':');
  if (colon == std::string::npos || colon == 0)
    throw std::runtime_error("a peer's state address must be host:port, not '" + address + "'");
  const std::string host = bare_host(address.substr(0, colon));
  const std::string port = address.substr(colon + 1);
  const std::string what = "fetching step " + std::to_string(step) + "'s state from " + address;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  std::string last = "no answer";
  for (;;) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0)
      throw std::runtime_error(what + ": nothing within " +
                               std::to_string(std::chrono::duration_cast<std::chrono::seconds>(timeout).count()) +
                               " s (last: " + last + ")");
    Attempt a = attempt(host, port, key, step, left);
    switch (a.kind) {
      case Attempt::Kind::Done: return std::move(a.body);
      case Attempt::Kind::Refused: throw std::runtime_error(what + ": refused (" + a.why + ")");
      case Attempt::Kind::Unvouched: throw std::runtime_error(what + ": " + a.why + ": not loaded");
      case Attempt::Kind::NotYet: last = "it serves another step: it has not read the same quorum yet"; break;
      case Attempt::Kind::Unreachable: last = a.why; break;
    }
    // The peer has not read the quorum yet, or is busy: ask again shortly.
    std::this_thread::sleep_for(std::chrono::milliseconds(10));  // sleep override: polling a peer with a deadline
  }
}

}  // namespace ddprun::worker::ft::detail
